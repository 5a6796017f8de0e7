"""`Sample`: one sampled completion, the typed record every sampler returns (an engine through
`generate_completions`, `Teacher.generate`, the tool-call loop) and the rollout builds its `Completion`s from.

A sample's ids are exactly the ids the engine sampled (never re-tokenized), cut at the first stop. What the
sampler knows beyond them travels by name: whether the budget cut it, the behaviour log-probs, a conversation's
trained mask, prompt and layout, the weights version that sampled it.

Checkpoints keep samples as plain values (`sample_to_plain`, `sample_from_plain`): the one format of every rollout
producer's state, which also reads the formats written before it (module functions' docstrings).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from distill.conversations.layout import Layout


@dataclass(frozen=True)
class Sample:
    """One sampled completion.

    ids: the completion's token ids, ending at its first stop (an EOS, kept), or cut by the budget.
    hit_max: it stopped at the budget (max_new_tokens), not at an EOS.
    log_probs: per completion token, its log-prob under the distribution it was drawn from (`with_log_probs`;
        0.0 at a conversation's environment ids), or None.
    trained: a conversation's trained mask, one flag per completion token (its sampled turns True, the
        environment's ids False), or None for a completion sampled whole.
    prompt_ids: the prompt it followed when not the row's own (an environment's observation appended), or None.
    layout: a conversation's model and environment segments (`distill.conversations.layout`), or None.
    weights_version: the student weights that sampled it (optimizer steps applied), where the sampler records it.
    later: a conversation whose template re-renders its history: its later pieces, each a sample of its own with the
        context its first turn was sampled in as `prompt_ids` (`distill.rendering.conversation`); this one is the
        first piece. Empty otherwise.
    """

    ids: list[int]
    hit_max: bool = False
    log_probs: list[float] | None = None
    trained: tuple[bool, ...] | None = None
    prompt_ids: list[int] | None = None
    layout: Layout | None = None
    weights_version: int | None = None
    later: tuple["Sample", ...] = ()

    def pieces(self) -> tuple["Sample", ...]:
        """This sample and its later pieces, each without pieces of its own."""
        return (replace(self, later=()), *self.later) if self.later else (self,)


def sample_to_plain(sample: Sample) -> dict[str, Any]:
    """`sample` as plain values (lists, numbers, a layout's plain form), the form checkpoints keep."""
    return {"ids": list(sample.ids), "hit_max": bool(sample.hit_max), "log_probs": sample.log_probs,
            "version": sample.weights_version,
            "trained": None if sample.trained is None else [bool(flag) for flag in sample.trained],
            "prompt": None if sample.prompt_ids is None else list(sample.prompt_ids),
            "layout": None if sample.layout is None else sample.layout.to_plain(),
            **({"later": [sample_to_plain(piece) for piece in sample.later]} if sample.later else {})}


def sample_from_plain(plain: dict[str, Any] | list | tuple) -> Sample:
    """A sample from its checkpointed form: `sample_to_plain`'s dict (a key missing in a checkpoint written before
    it was recorded: None), or the positional list an asynchronous producer wrote before this format
    ([ids, hit_max, log_probs, trained, prompt, layout], the items after hit_max optional)."""
    if not isinstance(plain, dict):
        names = ("ids", "hit_max", "log_probs", "trained", "prompt", "layout")
        plain = dict(zip(names, plain))
    log_probs, trained, prompt, layout = (plain.get(key) for key in ("log_probs", "trained", "prompt", "layout"))
    return Sample([int(t) for t in plain["ids"]], bool(plain["hit_max"]),
                  None if log_probs is None else [float(v) for v in log_probs],
                  None if trained is None else tuple(bool(flag) for flag in trained),
                  None if prompt is None else [int(t) for t in prompt],
                  Layout.from_plain(layout) if layout else None,
                  None if plain.get("version") is None else int(plain["version"]),
                  tuple(sample_from_plain(piece) for piece in plain.get("later") or ()))
