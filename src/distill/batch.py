"""One micro-batch as the loss sees it: `Completion` (a prompt and its completion as token ids, with what the
method trains of it) and `MicroBatch` (right-padded token tensors), built by `collate`.

Layout of a row: [prompt | completion | pad]. `completion_mask` marks the completion tokens trained on
(`Completion.trained_mask`, one flag per completion token); every token of prompt and completion is attended,
trained or not. A mask may have holes: a multi-turn trajectory trains the model's turns and not the
environment's tokens between them, which stay in the context. The first EOS is kept and everything after it
masked, so pad == eos is safe. Token tensors are torch.long, even when every completion is empty.

A row may carry model inputs beyond its token ids (`Completion.extras`, named tensors a model kind encodes
from the dataset row, `distill.models.kinds`): collated generically into `MicroBatch.extras` and given to the
model's forward by name, for the student, the teacher and generation alike.

Masks are made by `all_trained`, `skipping_first` (a method's `num_loss_tokens_to_skip`) and `untrained` (a
row the method leaves out of the loss: its tokens leave the denominator too).

A dataset row is usually one completion; a conversation whose chat template re-renders its history is several, one
per piece (`Completion.piece`), each with the context its turns were generated in as its prompt. The loss is
normalized per token (a sum over the step's trained tokens divided by their count), and each assistant turn is
trained in exactly one piece, so splitting a conversation into pieces changes no token's weight: it costs the
forward passes over the repeated history, not a different objective. (A per-sequence mean would weigh the turns of
a split conversation more than the same turns in one sequence.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from distill.conversations.layout import Layout
from distill.data import Example
from distill.models.inputs import RowExtras, collate_extras

T = TypeVar("T")

TrainedMask = tuple[bool, ...]  # one flag per completion token: True where the loss trains the token


def all_trained(length: int) -> TrainedMask:
    return (True,) * length


def skipping_first(length: int, skip: int) -> TrainedMask:
    """The first `skip` tokens untrained (num_loss_tokens_to_skip), the rest trained."""
    skip = min(max(skip, 0), length)
    return (False,) * skip + (True,) * (length - skip)


def untrained(length: int) -> TrainedMask:
    return (False,) * length


@dataclass(frozen=True)
class Annotation(Generic[T]):
    """A per-row value a part writes on completions after the rollout (a method's step stage) for another part
    to read (the self-teacher, an objective), declared by the part that reads it: `KEY.of(completion)` (the
    default where nothing was written), `KEY.put(completion, value)`. Shared types carry no method's state."""

    name: str
    default: Any = None

    def of(self, completion: "Completion") -> T:
        return completion.annotations.get(self.name, self.default)

    def put(self, completion: "Completion", value: T) -> None:
        completion.annotations[self.name] = value


@dataclass
class Completion:
    """One prompt with its completion, as token ids (completion ends at its first EOS, which is kept).

    `example` is the dataset example it came from (its text and index), for teachers that need more than
    the student's token ids: another tokenizer's rendering, a cache keyed by example id, a teacher route.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    source: str
    hit_max_new_tokens: bool = False
    prompt_truncated: bool = False
    example: Example | None = None
    rollout_log_probs: list[float] | None = None  # per completion token, when the method records them
    trained_mask: TrainedMask | None = None  # per completion token; None: every token trained (`all_trained`)
    weights_version: int | None = None  # the student weights that sampled it (optimizer steps applied); None: not the student's
    extras: RowExtras = field(default_factory=dict)  # model inputs beyond the ids (the prompt's), by forward argument name
    annotations: dict[str, Any] = field(default_factory=dict, repr=False)  # `Annotation`s, by name
    layout: Layout | None = None  # a conversation's model and environment segments (`distill.conversations.layout`)
    # Which piece of its row's conversation this is: 0 for the first (or only) one; a conversation whose template
    # re-renders its history is trained in pieces, each its own row of the micro-batch (`distill.training.completions`).
    piece: int = 0

    def __post_init__(self) -> None:
        if self.trained_mask is None:
            self.trained_mask = all_trained(len(self.completion_ids))
        self.trained_mask = tuple(bool(flag) for flag in self.trained_mask)
        if len(self.trained_mask) != len(self.completion_ids):
            raise ValueError(f"a completion of {len(self.completion_ids)} tokens with a trained mask of "
                             f"{len(self.trained_mask)}: the mask needs one flag per completion token")
        if self.layout is not None and self.layout.length != len(self.completion_ids):
            raise ValueError(f"a completion of {len(self.completion_ids)} tokens with a conversation layout of "
                             f"{self.layout.length}: the layout's segments cover the completion exactly")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != len(self.completion_ids):
            raise ValueError(f"a completion of {len(self.completion_ids)} tokens with {len(self.rollout_log_probs)} "
                             "rollout log-probs: one per completion token")

    @property
    def mask(self) -> TrainedMask:
        """`trained_mask`, filled in (never None after construction)."""
        assert self.trained_mask is not None
        return self.trained_mask

    def trained_indices(self) -> list[int]:
        """Indices into `completion_ids` of the tokens trained on, in order."""
        return [k for k, flag in enumerate(self.mask) if flag]

    @property
    def num_trained(self) -> int:
        return sum(self.mask)


def by_row(completions: list[Completion]) -> list[list[Completion]]:
    """`completions` grouped by dataset row: a conversation's later pieces (`Completion.piece` > 0) with its first,
    which they follow in a micro-batch."""
    rows: list[list[Completion]] = []
    for completion in completions:
        if completion.piece and rows:
            rows[-1].append(completion)
        else:
            rows.append([completion])
    return rows


@dataclass
class MicroBatch:
    """Token tensors of one micro-batch, right-padded: [prompt | completion | pad].

    input_ids, attention_mask: (B, T) torch.long.
    completion_mask: (B, T) bool, True at the completion tokens trained on (`Completion.trained_mask`: all
        of them unless a method leaves rows or tokens out; possibly with holes).
    rollout_log_probs: (N,) float32 over the N trained tokens in row-major order, or None (module docstring).
    advantages: (B,) float32, each row's advantage for a policy gradient, or None (a step stage sets them).
    extras: the model kind's inputs beyond the ids, collated (`collate_extras`), by forward argument name.
    turns: (N,) long over the N trained tokens in row-major order, the model turn each belongs to (`model_turns`),
        or None (a micro-batch made elsewhere than `collate`).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    source: str
    completions: list[Completion] = field(repr=False)
    rollout_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    turns: torch.Tensor | None = None

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_mask.sum())

    def staleness(self, weights_version: int) -> int:
        """Optimizer steps between the student weights that sampled this micro-batch's completions and
        `weights_version`, the weights it trains (the oldest row's); 0 when the student sampled none of them."""
        versions = [c.weights_version for c in self.completions if c.weights_version is not None]
        return max((weights_version - v for v in versions), default=0)

    @property
    def num_rows(self) -> int:
        """Rows with at least one trained token."""
        return int(self.completion_mask.any(dim=1).sum())

    def to(self, device: torch.device) -> "MicroBatch":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return MicroBatch(self.input_ids.to(device), self.attention_mask.to(device), self.completion_mask.to(device),
                          self.source, self.completions, move(self.rollout_log_probs), move(self.advantages),
                          {name: value.to(device) for name, value in self.extras.items()}, move(self.turns))


def collate(completions: list[Completion], source: str, pad_id: int) -> MicroBatch:
    """Right-padded token tensors for one micro-batch; torch.long even when every completion is empty."""
    lengths = [len(c.prompt_ids) + len(c.completion_ids) for c in completions]
    width = max(lengths)
    input_ids = torch.full((len(completions), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(completions), width), dtype=torch.long)
    completion_mask = torch.zeros((len(completions), width), dtype=torch.bool)
    for row, c in enumerate(completions):
        tokens = torch.tensor(c.prompt_ids + c.completion_ids, dtype=torch.long)
        input_ids[row, : len(tokens)] = tokens
        attention_mask[row, : len(tokens)] = 1
        completion_mask[row, len(c.prompt_ids) : len(tokens)] = torch.tensor(c.mask, dtype=torch.bool)
    log_probs = None
    if completions and all(c.rollout_log_probs is not None for c in completions):
        log_probs = torch.tensor([c.rollout_log_probs[i] for c in completions for i in c.trained_indices()],  # type: ignore[index]
                                 dtype=torch.float32)
    turns = torch.tensor([turn for c in completions for turn in model_turns(c)], dtype=torch.long)
    return MicroBatch(input_ids, attention_mask, completion_mask, source, completions, log_probs,
                      extras=collate_extras([c.extras for c in completions]), turns=turns)


def model_turns(completion: Completion) -> list[int]:
    """For each trained token of `completion`, in order, the index of the model turn it belongs to: a conversation's
    model segments counted from 0 (its layout; turns the teacher wrote count too; a later piece of a conversation
    counts on from the assistant turns of its `history`), 0 for a completion without a layout, -1 for a trained token
    outside every model turn (none in a conversation distill builds)."""
    if completion.layout is None:
        return [0] * completion.num_trained
    per_token: list[int] = []
    turn = sum(message.get("role") == "assistant" for message in completion.layout.history)
    for start, end, segment in completion.layout.spans():
        per_token.extend([turn if segment.assistant else -1] * (end - start))
        turn += segment.assistant
    return [per_token[k] for k in completion.trained_indices()]
