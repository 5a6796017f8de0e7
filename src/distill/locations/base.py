"""What a teacher location is: the interface every place a teacher can live implements, and their table.

A location answers, for one run: does it hold this run's teacher (`claims`), what signal it gives a method
(`signal_kind`), which config fields it reads and their rules (`reads`, `validate`), what it asks of the
dataset and the arguments given from Python, and how it is built. Building is one path for every command
that needs a teacher (`distill train`, `distill eval`, `distill cache-teacher`):

    location.load_model(source, device)  -> the teacher model it holds on this process, or None
    location.build(request)              -> `Teachers`: the teacher that scores training steps, and the
                                            one the evaluation compares the student with
    location.hooks(teachers)             -> step hooks: what it checkpoints (none for the built-ins)
    location.close(teachers)             -> release connections, once, at the end

A `TeacherRequest` carries what a teacher is built against (the student's tokenizer, vocabulary, EOS ids,
device, a probe prompt) and the purpose (TRAIN, EVAL, CACHE). The trainer, `distill eval`, the model card
and the run directory ask the location object; none of them compares location names.

Their table is `distill.locations.registry` (a leaf): torch is imported only by the locations'
build code.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from distill.methods.base import Method
from distill.methods.mixing_fields import MixingFields
from distill.registry import Reads
from distill.teachers.base import Teacher, check_teacher

if TYPE_CHECKING:
    from distill.config import DistillConfig

TRAIN, EVAL, CACHE = "train", "eval", "cache"


@dataclass
class TeacherRequest:
    """What a teacher is built against, for one `purpose` (TRAIN, EVAL or CACHE).

    config: the run's `DistillConfig` (for `distill cache-teacher`, one made from its flags).
    tokenizer, vocab_size, eos_ids, pad_id: the student's side of the comparison (for a cache: the
        tokenizer the cache is for).
    teacher_model, teacher_tokenizer: what `load_model` returned (None for a location without a model).
    student: the student model (the self location's weights; at EVAL, the trained student).
    probe_ids: a prompt for checks that score one (a server's temperature handling).
    temperature: the loss temperature the teacher will score at.
    evaluating: the training run evaluates before and after (the self location then builds an evaluation
        teacher from the initial weights too).
    examples, encoded: the training rows and their encodings (a cache replaces the completions it holds).
    eval_examples: the held-out rows (checked against several teachers' routes).
    autocast: the training precision's context for the self-teacher's forward passes.
    """

    config: Any
    method: Method
    purpose: str
    tokenizer: Any
    vocab_size: int
    eos_ids: list[int]
    pad_id: int
    device: Any
    probe_ids: list[int] = field(default_factory=list)
    temperature: float = 1.0
    teacher_model: Any = None
    teacher_tokenizer: Any = None
    student: Any = None
    evaluating: bool = False
    examples: list = field(default_factory=list)
    encoded: list = field(default_factory=list)
    eval_examples: list = field(default_factory=list)
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


@dataclass
class Teachers:
    """train: scores the training steps (None when the method takes no signal); eval: the evaluation's."""

    train: Teacher | None = None
    eval: Teacher | None = None

    def __post_init__(self) -> None:
        check_teacher(self.train, "the location (training teacher)")
        check_teacher(self.eval, "the location (evaluation teacher)")

    def sampling_models(self, visit) -> None:
        """`visit(model)` for each model these teachers sample from (a generation engine with replicas
        prepares them at start)."""
        for teacher in {id(t): t for t in (self.train, self.eval) if t is not None}.values():
            if teacher.can_generate:
                teacher.sampling_models(visit)


class TeacherLocation(ABC):
    """Where a teacher lives. Subclasses set `name` and implement `claims`, `signal_kind`, `card_title`, `build` and
    `eval_values` (abstract: registering a class that leaves one out is refused, naming it); every other member has
    a default that fits a location holding an external teacher.

    name: the location's name (in messages and the field help).
    fields: its own settings (`distill.config.io.PartFields` dataclasses), composed into `DistillConfig` while it
        is registered; read back typed with `TheFields.of(config)`.
    reads: the config fields it reads, and when (`distill.config_rules.reads` rejects the unread ones).
    samples: it can write completions (seq_kd); a scoring-only teacher cannot.
    scores_ahead: it scores a whole step before any loss, in one round (a remote teacher: the trainer
        agrees over processes whether it failed before anyone enters a collective).
    student_origin: where the student starts when `student` is not given, for the model card.
    selected_by: the config field whose value selects it, with an example value and the settings a run
        with it needs (the field help lists the methods that validate with it); None when nothing does.
    reads_images: its teachers read a row's images (`distill.images`) from somewhere other than a model object held
        here (a server that takes them); a teacher model held here reads them through its own kind.
    """

    name: str = ""
    fields: tuple[type, ...] = ()
    reads: tuple[Reads, ...] = ()
    samples: bool = False
    scores_ahead: bool = False
    student_origin: str = "initialised from the teacher"
    selected_by: tuple[str, Any, tuple[dict, ...]] | None = None
    reads_images: bool = False

    # ------------------------------------------------------------------------------ choosing it --
    @abstractmethod
    def claims(self, config: DistillConfig, method: Method) -> bool:
        """Whether this run's teacher lives here."""

    @abstractmethod
    def signal_kind(self, method: Method, config: DistillConfig) -> str | None:
        """The signal kind (`distill.signals`) it gives `method`'s objective with this run's `config`; None: no
        signal."""

    # ------------------------------------------------------------------------ checks, no model --
    def validate(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        """Its fields' rules against the method and the completion sources it draws; ValueError naming
        the field and the fix."""

    def inputs(self, config: DistillConfig) -> dict[str, str]:
        """Its inputs named by path in `config` (label -> path): the run directory must not lie inside one."""
        return {}

    @abstractmethod
    def card_title(self, record: dict) -> str:
        """The model card's title line for a run of this location (`record`: the run's config.yaml)."""

    def check_arguments(self, config: DistillConfig, teacher, teacher_tokenizer) -> None:
        """A teacher model or tokenizer passed from Python that this location would not read is an error."""
        if teacher is not None:
            raise ValueError(f"teacher: this run's teacher is {self.describe(config)}; do not also pass a teacher model")
        if teacher_tokenizer is not None:
            raise ValueError(f"teacher_tokenizer: this run's teacher is {self.describe(config)}, which is checked against "
                             "the student's tokenizer; do not pass a teacher tokenizer")

    def describe(self, config: DistillConfig) -> str:
        """A few words naming this run's teacher, for messages ("teacher_url")."""
        return self.name

    def model_source(self, config: DistillConfig, teacher):
        """The teacher model this location loads (a spec or a module), given the `teacher` argument; None
        when it holds no model here."""
        return None

    def default_student(self, config: DistillConfig) -> str | None:
        """The student to start from when none is given and the location holds no teacher weights to start
        from; None: `student` must be given."""
        return None

    def check_dataset(self, config: DistillConfig, method: Method, possible_sources: frozenset[str], examples: list) -> None:
        """What the location asks of the training rows: dataset completions for the micro-batches that use them."""
        if "dataset" not in possible_sources:
            return
        missing = [e.index for e in examples if not e.has_completion]
        if missing:
            mixing = MixingFields.of(config)
            raise ValueError(
                f"lmbda={mixing.lmbda} (schedule {mixing.lmbda_schedule!r}) makes some micro-batches off-policy, but "
                f"{len(missing)} dataset rows have no completion (first: row {missing[0]}). Add a 'completion' column "
                "(or assistant turns in 'messages'), set seq_kd: true to let the teacher write them, or set lmbda: 1 "
                "with lmbda_schedule: constant")

    def prompt_budgets(self, config: DistillConfig, method: Method, takes_signal: bool, evaluating: bool) -> set[str]:
        """Config fields bounding prompts the *student's* weights see as a teacher (checked against its context)."""
        return set()

    # --------------------------------------------------------------------------------- building --
    def load_model(self, source, device, method: Method, teacher_tokenizer=None, tokenizer=None):
        """(model, tokenizer) of the teacher model `source` (from `model_source`) on `device`; a module given
        from Python comes with `teacher_tokenizer`, or shares the student's `tokenizer`. None when it holds none."""
        return None

    @abstractmethod
    def build(self, request: TeacherRequest) -> Teachers:
        """The teachers this location holds for `request` (module docstring)."""

    @abstractmethod
    def eval_values(self, method: Method, values: dict, record: dict, args) -> dict:
        """`distill eval`'s config values for a run of this location: the run's (`values`, from `record`, its
        config.yaml; empty for a bare student directory) with what the flags (`args.teacher`,
        `args.teacher_url`) say."""

    def hooks(self, teachers: Teachers) -> list:
        """Step hooks for what the built teachers change as training goes (`distill.methods.base.StepHook`):
        called after every optimizer step, their state saved in checkpoints and restored on resume. None by
        default (the built-in locations' teachers keep no state of their own; an EMA self-teacher's is its
        method's hook)."""
        return []

    def close(self, teachers: Teachers) -> None:
        """Release what the built teachers hold open (a server teacher's connections); once, at the end."""
        for teacher in {id(t): t for t in (teachers.train, teachers.eval) if t is not None}.values():
            teacher.close()

    def check_evaluable(self, config: DistillConfig) -> None:
        """`distill eval` of a run with this location: ValueError when its teacher cannot score new samples here."""
