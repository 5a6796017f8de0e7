"""What every location of an external teacher (a model, a server, a cache, one a user registers) shares:
the check that the method's objective can learn from the signal it gives, that a teacher which only scores
is not asked to write completions, and how `distill eval` takes `--teacher` / `--teacher-url`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.config.values import DEFAULT_TEACHER
from distill.locations.base import TeacherLocation
from distill.methods.base import Method

if TYPE_CHECKING:
    from distill.config import DistillConfig


class ExternalLocation(TeacherLocation):
    """A teacher apart from the student, chosen by the user for any method whose `teacher` is "external"."""

    def gives(self, method: Method, config: DistillConfig) -> str:
        """The signal it gives, in words, for the error that refuses a method that cannot learn from it."""
        return f"the {self.name} teacher"

    def validate(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        kind = self.signal_kind(method, config)
        accepted = method.objective(config).signals
        if kind not in accepted:
            raise ValueError(f"method {method.name}'s objective takes {sorted(accepted)} teacher signals, and "
                             f"{self.gives(method, config)} gives {kind} ones; choose a teacher location the method can learn from")
        if not self.samples and "teacher" in sources:
            raise ValueError("seq_kd: true needs a teacher that samples, and a server or cache teacher only scores. Set "
                             "seq_kd: false (dataset completions), or cache teacher-written completions with "
                             "`distill cache-teacher --generate` and train from teacher_cache")
        if not self.samples and method.guided_turns(config) is not None:
            raise ValueError(f"guided_turns_probability > 0 (Guided-OPD) has the teacher write turns of the student's "
                             f"conversations, continuing their ids, and {self.describe(config)} only scores: it cannot "
                             "write a turn. Use a teacher model (`teacher`, with the student's tokenizer), or set "
                             "guided_turns_probability: 0")

    def card_title(self, record: dict) -> str:
        return f"# Student distilled from {self.card_teacher(record)}"

    def card_teacher(self, record: dict) -> str:
        """The teacher as the model card names it (`record`: the run's config.yaml)."""
        return f"the {self.name} teacher"

    def eval_values(self, method: Method, values: dict, record: dict, args) -> dict:
        """`distill eval`'s config values: the run's, with the teacher the flags name (`--teacher`,
        `--teacher-url`) replacing the run's; a bare student directory needs one of them."""
        teacher_url = getattr(args, "teacher_url", None)
        if args.teacher or teacher_url:
            return {**values, "teacher": args.teacher or DEFAULT_TEACHER, "teacher_url": teacher_url, "teacher_cache": None}
        if not record:
            raise ValueError("a student directory without a run's config.yaml: name the teacher with --teacher MODEL or "
                             "--teacher-url URL")
        return values


NOT_EVALUABLE = ("this run's teacher was a Python object or a cache, which cannot be loaded or score new samples here: "
                 "pass --teacher MODEL (a local copy of the teacher) or --teacher-url URL")
