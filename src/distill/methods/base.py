"""The method interface: what a method declares (`Method`), and the table of registered methods.

A leaf module: at run time it imports nothing from distill but the generic table (`distill.registry`), and
no method (the types it names are imported for annotations only). A method module subclasses `Method`; the
built-in ones are declared by the catalogue (`distill.parts`: name, settings, import path) and imported when first
asked for, a method of one's own is passed to `register`. A method is *what is learned*: its
completion sources and its objective. Where the teacher lives (a model, a server, a cache) is a separate
choice (`distill.locations`); any teacher whose signal kind the objective consumes works with it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from distill.registry import Reads, Registry, load_built_in_parts

if TYPE_CHECKING:  # annotations only: this module stays a leaf
    from distill.agents.guidance import DepthCurriculum, GuidedTurns
    from distill.config import DistillConfig
    from distill.objectives.base import Objective
    from distill.training.plan import SourcePlan, StepStage

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
    (`distill.training.runtime.Runtime`: collectives, process facts), this process's first global row, and the
    student (its model kind encodes the stage's own prompts: a vision-language student's show the row's images)."""

    tokenizer: Any
    eos_ids: list[int]
    runtime: Any
    first_row: int
    student: Any = None


class Method(ABC):
    """What a method is. Subclass it, set `name` and `summary`, implement `sources` and `objective` (abstract:
    `register` refuses a class that leaves one out, naming it), and `register(MyMethod())`; every other member is
    optional, with a default that fits most methods.

    Declarations (class attributes):
      paper: the paper it follows (the model card cites it); None for one that follows none (sft).
      teacher: where its teacher comes from: "external" (a model, server or cache: the user's choice of
          `distill.locations`), "self" (the student itself, shown privileged context) or "none" (sft).
      cross_tokenizer: the teacher model has its own tokenizer (aligned signals) instead of the student's.
      reads: the config fields it reads, and when (the generic no-silent-fields check rejects the others).
      defaults: values for config fields whose default is None ("the method's default"), e.g. beta.
      metrics: names of the token-weighted means its objective reports in `DistillLoss.metrics`.
      maxima, minima: names of the extremes it reports in `DistillLoss.extrema` (reduced with max / min).
      teacher_prompt_budget: the config field bounding a self-teacher's prompt (checked against the context).
      template_fields: the config fields holding the prompt templates its self-teacher sees (or, for a baseline,
          the one of the method it is measured against); the evaluation reports how often the student's greedy
          answers repeat their words (`distill.evaluation.leakage`).
      fields: its own settings: a `distill.config.io.PartFields` dataclass of fields with defaults (`setting`), or a
          tuple of them (methods may share one: gkd's mixing fields); registering composes them into
          `DistillConfig`, flat, and its code reads them typed (`MixingFields.of(config)`). A setting that no
          `reads` names is read whenever the method runs (the built-ins declare theirs in `methods/*_fields.py`).
    """

    name: str = ""
    summary: str = ""
    paper: Paper | None = None
    teacher: str = "external"
    cross_tokenizer: bool = False
    reads: tuple[Reads, ...] = ()
    defaults: Mapping[str, Any] = MappingProxyType({})
    metrics: tuple[str, ...] = ()
    maxima: tuple[str, ...] = ()
    minima: tuple[str, ...] = ()
    teacher_prompt_budget: str = "max_teacher_prompt_length"
    template_fields: tuple[str, ...] = ()
    fields: type | tuple[type, ...] = ()

    # ------------------------------------------------------------------------------------ required --
    @abstractmethod
    def sources(self, config: DistillConfig) -> SourcePlan:
        """Which completions each micro-batch uses (`distill.training.plan.SourcePlan`)."""

    @abstractmethod
    def objective(self, config: DistillConfig) -> Objective:
        """The loss (`distill.objectives.Objective`); its `signals` say which teachers fit."""

    # -------------------------------------------------------------------------------- optional hooks --
    def validate(self, config: DistillConfig) -> None:
        """Its own rules, raising ValueError naming the field and the fix (before anything loads)."""

    def check_examples(self, config: DistillConfig, examples: list, field: str) -> None:
        """Its checks of the training rows, before models load."""

    def records_log_probs(self, config: DistillConfig) -> bool:
        """Record each sampled token's log-prob under the sampling policy (pi_old)."""
        return False

    def group_size(self, config: DistillConfig) -> int:
        """Completions per prompt in a step (GRPO-style groups; `distill.data.StepSampler`)."""
        return 1

    def rollout_reuse(self, config: DistillConfig) -> int:
        """Optimizer steps one rollout serves (a method that reuses rollouts returns its `num_iterations`)."""
        return 1

    def loss_tokens_to_skip(self, config: DistillConfig) -> int:
        """Leading completion tokens each row leaves out of the loss (sdft's `num_loss_tokens_to_skip`)."""
        return 0

    def guided_turns(self, config: DistillConfig) -> GuidedTurns | None:
        """Who writes the turns of the student's conversations: the teacher some of them (Guided-OPD,
        `distill.agents.guidance`), or None: the student every one."""
        return None

    def depth_curriculum(self, config: DistillConfig) -> DepthCurriculum | None:
        """How many turns the student's training conversations may have as training goes (TCOD), or None:
        `max_turns` throughout."""
        return None

    def trains_row(self, config: DistillConfig, example) -> bool:
        """False for rows that get no loss (their tokens leave the denominator too)."""
        return True

    def stage(self, config: DistillConfig, parts: StageParts) -> StepStage | None:
        """Work run on each rollout before any loss (`distill.training.plan.StepStage`: sdpo's rewards and
        demonstrations), or None."""
        return None

    def hooks(self, config: DistillConfig, student, teacher) -> list[StepHook]:
        """Step hooks (an EMA teacher's update), checkpointed with the run."""
        return []

    def describe_loss(self, record: dict) -> str:
        """One line for the model card (`record`: the run's config.yaml)."""
        return ""

    def card_title(self, record: dict) -> str | None:
        """The model card's title line; None: the teacher location's."""
        return None


# Names that once were methods, with what to write instead.
RETIRED = {
    "server": "method 'server' is gone: the teacher's location is its own choice now. Write `method: gkd` (or "
              "on_policy) with `teacher_url: URL`; any method whose objective takes sparse teacher log-probs can use "
              "a server teacher",
    "offline": "method 'offline' is gone: the teacher's location is its own choice now. Write `method: gkd` with "
               "`teacher_cache: DIR`, `lmbda: 0`, `lmbda_schedule: constant` and `seq_kd: false` (a cache scores only "
               "the completions it holds)",
}


# The built-in methods are declared by the catalogue (`distill.parts`: name, settings, import path), which the table
# loads when first used; a method's code is imported when it is first asked for, so the config composes the methods'
# settings (`distill.methods.*_fields`) without loading any method's code or torch.
def _check_method(method: Method) -> None:
    if not method.name or not method.summary:
        raise ValueError(f"register: a method is a Method subclass instance with a name and a summary, got {method!r}")
    if method.teacher not in TEACHER_KINDS:
        raise ValueError(f"Method.teacher must be one of {TEACHER_KINDS}, got {method.teacher!r}")


METHODS: Registry[Method] = Registry("method", "method", RETIRED, load=load_built_in_parts,
                                     interface="distill.methods.base:Method", check=_check_method)


def register(method: Method | type[Method]) -> Method:
    """Add a method (an instance, or its class: an abstract member left out is refused, named); a name may be
    registered once."""
    if not isinstance(method, (Method, type)):
        raise ValueError(f"register: a method is a Method subclass instance with a name and a summary, got {method!r}")
    return METHODS.register(method)


def unregister(name: str) -> None:
    """Remove a method and its own settings (tests that register a toy clean up with this)."""
    METHODS.unregister(name)


def method_names() -> tuple[str, ...]:
    """The registered methods' names, sorted (no method's code is imported)."""
    return tuple(sorted(METHODS.names()))


def get_method(name: str) -> Method:
    """The method `name` (its code imported when first asked for); a retired or unknown name is a ValueError that
    says what to write."""
    return METHODS.get(name)
