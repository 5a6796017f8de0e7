"""Which runs take conversations today, checked before any model loads.

Every method that learns from the dataset's conversations trains their assistant turns through the trained mask,
and every teacher scores a whole conversation once (a model, a server, a cache; one with another tokenizer renders it
with its own template). With `tools` (or an environment), the student's rollouts and a same-tokenizer sampling
teacher's (seq_kd, iw_opd's warm-up) are conversations too (the tool-call loop); a self-teacher is shown the tools
and an environment's observation in its teacher prompt. Not yet: a teacher with another tokenizer, or a
self-teacher, sampling in the tool-call loop (seq_kd): each samples from its own rendering of the prompt.
"""

from __future__ import annotations

from distill.data import Example


def check_conversation_rows(method, sources: frozenset[str], examples: list[Example], field: str,
                            tools_configured: bool) -> None:
    """ValueError naming the first row (or `tools`) and what to change, for a run that would mishandle conversations."""
    rows = [e for e in examples if e.is_conversation]
    if not rows and not tools_configured:
        return
    what = f"{field} row {rows[0].index} ({len(rows)} conversation rows)" if rows else "tools"
    if method.cross_tokenizer and tools_configured and "teacher" in sources:
        raise ValueError(f"{what}: method {method.name}'s teacher has another tokenizer and samples (seq_kd), which it "
                         "cannot do in the tool-call loop yet (it samples from its own rendering of the prompt, one answer); "
                         "set seq_kd: false, so the student's trajectories are scored")
    with_tools = [e for e in rows if e.tools is not None]
    offered = f"{field} row {with_tools[0].index} offers tools" if with_tools else "tools is set"
    sampled = sorted(sources & {"student", "teacher"})
    if with_tools and not tools_configured and sampled:
        raise ValueError(f"{offered}, and this run samples completions ({' and '.join(sampled)}), but no tool runs their "
                         "calls: name the functions in `tools` ('package.module:function'), or train on the dataset's "
                         "conversations only (method sft, or gkd with lmbda: 0, lmbda_schedule: constant, seq_kd: false)")
    if tools_configured and method.teacher == "self" and "teacher" in sources:
        raise ValueError(f"{offered}: method {method.name}'s self-teacher samples from its own teacher prompts (seq_kd), "
                         "which it cannot do in the tool-call loop yet; set seq_kd: false, so the student's trajectories "
                         "are scored")
