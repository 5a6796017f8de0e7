"""The method registry: what a method declares, and the table of registered methods.

A leaf module: it imports nothing from distill but the generic table (`distill.registry`), and no method. A method module builds a `Method` and
calls `register` once; `distill.methods` imports the built-in ones. A method is *what is learned*: its
completion sources and its objective. Where the teacher lives (a model, a server, a cache) is a separate
choice (`distill.placement`); any teacher whose signal kind the objective consumes works with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from distill.registry import Registry

TEACHER_KINDS = ("external", "self", "none")


@dataclass(frozen=True)
class Paper:
    """The paper a method follows: the model card cites it."""

    title: str
    authors: str
    arxiv: str
    bibtex_key: str
    bibtex_authors: str
    venue: str


@dataclass(frozen=True)
class Reads:
    """Config fields a part of a run reads while `when(config)` holds; `needs` names what turns them on
    (it completes the sentence "X is only read with ...")."""

    needs: str
    names: tuple[str, ...]
    when: Callable[[Any], bool] = lambda config: True


class StepHook(Protocol):
    """Runs after every optimizer step; its state is saved in checkpoints and restored on resume.

    `state_dict` returns tensors, numbers, strings, lists and dicts only (checkpoints load with
    torch.load(weights_only=True))."""

    name: str

    def after_optimizer_step(self, step: int) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class StageParts:
    """What a method's step stage may use from the run: the student's tokenizer and EOS ids, the runtime
    (`distill.runtime.Runtime`: collectives, process facts), and this process's first global row."""

    tokenizer: Any
    eos_ids: list[int]
    runtime: Any
    first_row: int


@dataclass(frozen=True)
class Method:
    """Everything the rest of distill knows about a method.

    sources(config) -> a source plan (`distill.rollout.SourcePlan`): which completions each micro-batch uses.
    objective(config) -> an objective (`distill.objectives.Objective`); its `signals` say which teachers fit.
    reads: the config fields the method reads (the generic no-silent-fields check rejects the others).
    validate(config): the method's own rules, raising ValueError naming the field and the fix.
    cross_tokenizer: the teacher model has its own tokenizer (aligned signals) instead of the student's.
    metrics: names of the token-weighted means its objective reports in `DistillLoss.metrics`.
    maxima, minima: names of the extremes it reports in `DistillLoss.extrema` (reduced with max / min).
    needs_rollout_log_probs: record each sampled token's log-prob under the sampling policy (a bool, or a
        function of the config).
    hooks(config, student, teacher) -> step hooks (e.g. an EMA teacher's update), checkpointed with the run.
    describe_loss(config record) -> one line for the model card.
    teacher: where the teacher comes from: "external" (a model, server or cache: `distill.placement`), "self"
        (the student itself, shown privileged context: `distill.teachers.self_teacher`) or "none" (sft).
    defaults: values for config fields whose default is None ("the method's default"), e.g. beta.
    trains_row(config, example) -> False for rows that get no loss (their tokens leave the denominator too);
        None: every row trains.
    check_examples(config, examples, field): the method's checks of the training rows, before models load.
    paper: None for a method that follows no paper (sft).
    group_size(config) -> completions per prompt in a step (GRPO-style groups; `distill.data.StepSampler`).
    stage(config, parts) -> a step stage run on each rollout before any loss (`distill.rollout.StepStage`:
        sdpo's rewards and demonstrations), or None; `parts` is `StageParts`.
    card_title(config record) -> the model card's title line, when the teacher kind's default does not fit.
    teacher_prompt_budget: the config field bounding a self-teacher's prompt (checked against the context).
    """

    name: str
    summary: str
    paper: Paper | None
    sources: Callable[[Any], Any]
    objective: Callable[[Any], Any]
    reads: tuple[Reads, ...] = ()
    validate: Callable[[Any], None] = lambda config: None
    cross_tokenizer: bool = False
    metrics: tuple[str, ...] = ()
    maxima: tuple[str, ...] = ()
    minima: tuple[str, ...] = ()
    needs_rollout_log_probs: bool | Callable[[Any], bool] = False
    hooks: Callable[[Any, Any, Any], list] = lambda config, student, teacher: []
    describe_loss: Callable[[dict], str] = lambda record: ""
    teacher: str = "external"
    defaults: dict[str, Any] = field(default_factory=dict)
    trains_row: Callable[[Any, Any], bool] | None = None
    check_examples: Callable[[Any, list, str], None] = lambda config, examples, field: None
    group_size: Callable[[Any], int] = lambda config: 1
    stage: Callable[[Any, "StageParts"], Any] | None = None
    card_title: Callable[[dict], str] | None = None
    teacher_prompt_budget: str = "max_teacher_prompt_length"

    def __post_init__(self) -> None:
        if self.teacher not in TEACHER_KINDS:
            raise ValueError(f"Method.teacher must be one of {TEACHER_KINDS}, got {self.teacher!r}")

    def records_log_probs(self, config) -> bool:
        value = self.needs_rollout_log_probs
        return bool(value(config) if callable(value) else value)


# Names that once were methods, with what to write instead.
RETIRED = {
    "server": "method 'server' is gone: the teacher's location is its own choice now. Write `method: gkd` (or "
              "on_policy) with `teacher_url: URL`; any method whose objective takes sparse teacher log-probs can use "
              "a server teacher",
    "offline": "method 'offline' is gone: the teacher's location is its own choice now. Write `method: gkd` with "
               "`teacher_cache: DIR`, `lmbda: 0`, `lmbda_schedule: constant` and `seq_kd: false` (a cache scores only "
               "the completions it holds)",
}


_METHODS: Registry[Method] = Registry("method", "method", RETIRED)


# The registry's interface: register(method), unregister(name), method_names(), get_method(name) (a retired or
# unknown name is a ValueError that says what to write).
register, unregister, method_names, get_method = _METHODS.register, _METHODS.unregister, _METHODS.names, _METHODS.get
