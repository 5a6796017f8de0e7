"""Which runs take conversation rows (multi-turn, with tools) today, checked before any model loads.

Every method that learns from the dataset's conversations trains their assistant turns through the trained mask,
and any same-tokenizer teacher scores the whole conversation once (a model, a server, a cache). Not yet: sampling
a conversation (the tool-call loop: a student or teacher completion is one turn, and a row that offers tools would
have its calls never answered), a teacher with another tokenizer (it would render the conversation with its own
template), and a self-teacher shown a row's tools.
"""

from __future__ import annotations

from distill.data import Example


def check_conversation_rows(method, sources: frozenset[str], examples: list[Example], field: str) -> None:
    """ValueError naming the first row and what to change, for a run that would mishandle its conversation rows."""
    rows = [e for e in examples if e.is_conversation]
    if not rows:
        return
    first = f"{field} row {rows[0].index} ({len(rows)} conversation rows)"
    if method.cross_tokenizer:
        raise ValueError(f"{first}: method {method.name} aligns a teacher with another tokenizer, which does not take "
                         "conversations yet (the teacher would render them with its own template); use a same-tokenizer "
                         "method (gkd, on_policy, sft) or single-turn rows")
    with_tools = [e for e in rows if e.tools is not None]
    sampled = sorted(sources & {"student", "teacher"})
    if with_tools and sampled:
        raise ValueError(f"{field} row {with_tools[0].index} offers tools, and this run samples completions "
                         f"({' and '.join(sampled)}), which would write tool calls that nothing answers: the tool-call "
                         "loop is not built yet. Train on the dataset's conversations (method sft, or gkd with lmbda: 0, "
                         "lmbda_schedule: constant, seq_kd: false)")
    if with_tools and method.teacher == "self":
        raise ValueError(f"{field} row {with_tools[0].index} offers tools: method {method.name}'s self-teacher is not shown "
                         "a row's tools yet; drop the 'tools' column or use another method")
