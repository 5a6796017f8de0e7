"""The student as its own teacher, shown privileged context (self-distillation: SDFT, and later SDPO).

The self-teacher scores the same completion tokens as the student, after its own prompt: the row's
prompt with the privileged context filled in (`distill.methods.self_teacher_prompts`). Which weights it runs with is
`teacher_model_kind`:

    base   the initial weights, frozen: a copy made before training (and before a resumed run loads its
           checkpoint); with LoRA no copy, the adapter is switched off for the teacher pass
    live   the current weights, under no_grad
    ema    a copy updated after every `teacher_sync_steps` optimizer steps (`EMAUpdate`, a step hook saved
           in checkpoints): theta_T <- (1 - r) theta_T + r theta_S, r = teacher_update_rate. r is the
           student's share: r = 1 copies the student, a small r moves the teacher slowly. (The reference
           library once had the two weights swapped.)

It returns a `SelfSignal` (dense: hidden states at the N trained positions + the lm_head, detached), and
samples from the teacher prompt for `generate_from_teacher`. A method's step stage may annotate rows
(`distill.batch.Annotation`, read here): `TEACHER_PROMPT`, the row's own teacher prompt (sdpo's reprompt),
and `DISTILLED`, False for a row that gets no self-distillation loss (sdpo's rows without a demonstration). The teacher pass runs in eval mode (no
dropout) and in the run's autocast.
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from distill.batch import Annotation, Completion, MicroBatch, collate
from distill.data import Example, RowPrompt
from distill.generation import SamplingParams, generate_completions
from distill.generation.sample import Sample
from distill.losses import LogitHead
from distill.models import logit_head
from distill.no_grad import no_grad
from distill.signals import SelfSignal
from distill.teachers.base import Teacher
from distill.teachers.hidden import backbone_hidden, predicting_positions

if TYPE_CHECKING:  # annotations only: the prompts are built by the self-teacher location
    from distill.methods.self_teacher_prompts import TeacherPrompts

KINDS = ("base", "live", "ema")


TEACHER_PROMPT: Annotation[RowPrompt | None] = Annotation("teacher_prompt", None)
DISTILLED: Annotation[bool] = Annotation("distilled", True)


def distilled_tokens(micro_batch: MicroBatch) -> int:
    """Trained tokens of the rows that get a self-distillation loss (all rows unless a stage says otherwise)."""
    return sum(c.num_trained for c in micro_batch.completions if DISTILLED.of(c))


def is_peft_model(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"teacher_model_kind must be one of {KINDS}, got {kind!r}")


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` that never trains: eval mode, no gradients."""
    return copy.deepcopy(model).eval().requires_grad_(False)


class SelfTeacher(Teacher):
    """Scores micro-batches with the student's own weights (module docstring) after each row's teacher prompt."""

    can_generate = True
    aligned = False

    def __init__(self, kind: str, student: nn.Module, prompts: TeacherPrompts, vocab_size: int, eos_ids: list[int],
                 pad_id: int, device: torch.device, autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        check_kind(kind)
        self.kind, self.student, self.prompts = kind, student, prompts
        self.vocab_size, self.eos_ids, self.pad_id, self.device, self.autocast = vocab_size, eos_ids, pad_id, device, autocast
        self.adapter_off = kind == "base" and is_peft_model(student)
        needs_copy = kind == "ema" or (kind == "base" and not self.adapter_off)
        self.copy = frozen_copy(student).to(device) if needs_copy else None

    @property
    def frozen(self) -> bool:
        """Whether the teacher's weights never change (its samples may be drawn ahead of time)."""
        return self.kind == "base"

    @contextlib.contextmanager
    def model(self):
        """The teacher's weights, ready for a forward pass without gradients."""
        if self.copy is not None:
            with torch.no_grad():
                yield self.copy
            return
        was_training = self.student.training
        self.student.eval()
        try:
            adapter = self.student.disable_adapter() if self.adapter_off else contextlib.nullcontext()
            with adapter, torch.no_grad():
                yield self.student
        finally:
            self.student.train(was_training)

    def teacher_prompt(self, example: Example, observation: str | None = None, history: tuple[dict, ...] = ()) -> RowPrompt:
        """The example's teacher prompt (with an environment's `observation`, as the student's prompt had it, and a
        later piece's `history`): its ids, whether they were cut, and its own image inputs when it shows images the
        row's prompt does not."""
        return self.prompts.ids(example, observation=observation, history=history)

    def score(self, batch: MicroBatch, temperature: float) -> SelfSignal:
        """The teacher's hidden states at the trained positions of `batch`, after each row's teacher prompt:
        the same completion tokens, masks and order, so its N positions are the student's N. Rows a step
        stage marked not distilled (their `DISTILLED` annotation False: sdpo's stage marks rows without a
        demonstration so) skip the teacher pass: zeros at their positions, and `SelfSignal.distilled` says which
        positions are real."""
        completions = batch.completions
        scored = [c for c in completions if DISTILLED.of(c)]
        rows = [self._teacher_row(c) for c in scored]
        with self.model() as model, self.autocast():
            head = _detached(logit_head(model, self.vocab_size))
            hidden = torch.zeros(0, head.weight.shape[1], device=self.device)
            if rows:
                teacher_batch = collate([row for row, _ in rows], batch.source, self.pad_id).to(self.device)
                hidden = backbone_hidden(model, teacher_batch.input_ids, teacher_batch.attention_mask, teacher_batch.extras)
                hidden = hidden[:, :-1][predicting_positions(teacher_batch.completion_mask)]
        hidden, distilled = hidden.float(), None
        if len(scored) < len(completions):  # place the scored rows' positions among all N
            lengths = torch.tensor([c.num_trained for c in completions], device=self.device)
            distilled = torch.tensor([DISTILLED.of(c) for c in completions], device=self.device).repeat_interleave(lengths)
            full = hidden.new_zeros(distilled.shape[0], hidden.shape[1])
            full[distilled] = hidden
            hidden = full
        without_context = sum(not DISTILLED.of(c) or (TEACHER_PROMPT.of(c) is None and (
            c.example is None or c.example.privileged_context is None)) for c in completions)
        return SelfSignal(hidden, head, rows=len(completions), prompts_truncated=sum(cut for _, cut in rows),
                          rows_without_context=without_context, distilled=distilled)

    def _teacher_row(self, completion: Completion) -> tuple[Completion, bool]:
        prompt = TEACHER_PROMPT.of(completion)  # a step stage wrote this row's teacher prompt (sdpo)
        if prompt is None:
            if completion.example is None:
                raise ValueError("a self-teacher needs each completion's dataset example (its prompt and privileged context)")
            layout = completion.layout
            prompt = self.teacher_prompt(completion.example, None if layout is None else layout.observation,
                                         () if layout is None else layout.history)
        extras = completion.extras if prompt.extras is None else prompt.extras
        row = Completion(prompt.ids, completion.completion_ids, completion.source, trained_mask=completion.mask, extras=extras)
        return row, prompt.truncated

    def sampling_models(self, visit) -> None:
        """`visit(model)` for the model `generate` samples from, as `generate` holds it (a base teacher of a
        LoRA student: the student with its adapters off)."""
        with self.model() as model:
            visit(model)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams, batch_size: int | None = None,
                 examples: list[Example] | None = None, seeds: list[int] | None = None,
                 extras=None, seeded_rows: bool = False) -> list[Sample]:
        """Samples after each example's teacher prompt (`prompts`, the student's, are not used: the teacher's
        differ by the privileged context), with the rows' own extras (`extras`, the student's kind), or the teacher
        prompt's where it shows other images (the privileged context's)."""
        if examples is None or len(examples) != len(prompts):
            raise ValueError("a self-teacher samples from its own prompts and needs the examples of the student's prompts")
        teacher_prompts = [self.teacher_prompt(e) for e in examples]
        if any(p.extras is not None for p in teacher_prompts):
            rows = extras if extras is not None else [None] * len(examples)
            extras = [row if p.extras is None else p.extras for p, row in zip(teacher_prompts, rows)]
        with self.model() as model:
            return generate_completions(model, [p.ids for p in teacher_prompts], sampling, self.eos_ids, self.pad_id,
                                        self.device, batch_size, vocab_size=self.vocab_size, seeds=seeds, extras=extras,
                                        seeded_rows=seeded_rows)


def _detached(head: LogitHead) -> LogitHead:
    """The teacher's lm_head without a path back to the student's parameters (a live teacher shares them)."""
    return LogitHead(head.weight.detach(), None if head.bias is None else head.bias.detach(), head.scale, head.softcap)


class EMAUpdate:
    """The EMA self-teacher's update, a step hook: theta_T <- (1 - rate) theta_T + rate theta_S after every
    `every`-th optimizer step, over the parameters the student trains (the rest never differ). Its state
    (the teacher's copies of those parameters) is saved in checkpoints, so a resumed run's teacher is the
    uninterrupted run's."""

    name = "ema_teacher"

    def __init__(self, teacher: nn.Module, student: nn.Module, rate: float, every: int):
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"teacher_update_rate must be in (0, 1], got {rate!r}")
        if every < 1:
            raise ValueError(f"teacher_sync_steps must be >= 1, got {every!r}")
        trained = {name: p for name, p in student.named_parameters() if p.requires_grad}
        self.pairs = [(name, p, trained[name]) for name, p in teacher.named_parameters() if name in trained]
        if len(self.pairs) != len(trained):
            raise ValueError("the EMA teacher's parameters do not match the student's (was it copied from another model?)")
        self.rate, self.every = rate, every

    @no_grad
    def after_optimizer_step(self, step: int) -> None:
        if (step + 1) % self.every:
            return
        for _, teacher, student in self.pairs:
            teacher.lerp_(student.detach().to(teacher.dtype), self.rate)  # t + r (s - t) = (1 - r) t + r s

    def state_dict(self) -> dict:
        return {"weights": {name: teacher.detach().clone() for name, teacher, _ in self.pairs}}

    @no_grad
    def load_state_dict(self, state: dict) -> None:
        saved = state.get("weights", {})
        names = [name for name, _, _ in self.pairs]
        if sorted(saved) != sorted(names):
            raise ValueError("resume: the checkpoint's EMA teacher holds other parameters than this run's student trains "
                             "(another model, or LoRA switched on or off?)")
        for name, teacher, _ in self.pairs:
            if saved[name].shape != teacher.shape:
                raise ValueError(f"resume: the checkpoint's EMA teacher has {name} of shape {tuple(saved[name].shape)}, "
                                 f"this run's {tuple(teacher.shape)}")
            teacher.copy_(saved[name])
