"""The teacher is the student itself (a method with teacher "self": sdft, sdpo), shown each row's
privileged context; its weights are the student's initial ones, live ones or an EMA of them
(`teacher_model_kind`, `distill.teachers.self_teacher`). Dense signals; no external teacher field is read.

`StudentOnlyLocation` is also the base of the "none" location (sft): both start from the default model
when no student is given, and their evaluation compares the student with its initial weights, shown each
row's privileged context when it has one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.agents.setup import offering_tools
from distill.config.io import OBJECT_RECORD
from distill.config.values import DEFAULT_TEACHER
from distill.locations.base import TeacherLocation, TeacherRequest, Teachers
from distill.locations.registry import locations
from distill.methods.base import Method
from distill.methods.self_teacher_fields import SelfTeacherFields
from distill.methods.self_teacher_prompts import TeacherPrompts
from distill.models import check_context, make_student
from distill.models.kinds import model_kind_of
from distill.signals import DENSE
from distill.teachers.build import load_model
from distill.teachers.self_teacher import SelfTeacher

if TYPE_CHECKING:
    from distill.config import DistillConfig


class StudentOnlyLocation(TeacherLocation):
    """A run whose only model is the student: no external teacher field may be set."""

    kind = ""  # the `Method.teacher` it holds
    words = ""  # its teacher, in messages
    why = ""  # why a method of that kind takes no external teacher
    signal: str | None = None  # the signal kind it gives
    title = ""  # the model card's title line
    student_origin = "the default model"

    def signal_kind(self, method: Method, config: DistillConfig) -> str | None:
        return self.signal

    def card_title(self, record: dict) -> str:
        return self.title

    def claims(self, config: DistillConfig, method: Method) -> bool:
        return method.teacher == self.kind

    def describe(self, config: DistillConfig) -> str:
        return f"{self.words} (method {config.method})"

    def validate(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        for other in locations():
            field = other.selected_by[0] if other.selected_by else None
            if field is not None and getattr(config, field) is not None:
                raise ValueError(f"{field}: method {method.name} takes no external teacher ({self.why}); remove {field}")
        if config.teacher != DEFAULT_TEACHER:
            raise ValueError(f"teacher: method {method.name} takes no teacher model ({self.why}); remove teacher and name "
                             "the model to train as student")

    def default_student(self, config: DistillConfig) -> str:
        return DEFAULT_TEACHER  # no teacher to start from: the default model trains

    def prompt_budgets(self, config: DistillConfig, method: Method, takes_signal: bool, evaluating: bool) -> set[str]:
        return {"max_teacher_prompt_length"} if evaluating else set()

    def build(self, request: TeacherRequest) -> Teachers:
        """Training: the self-teacher (when the objective takes a signal) and the evaluation's, both from the
        student's initial weights (copies are made here, before a resumed run loads its checkpoint).
        `distill eval`: the run's initial model, loaded again."""
        config, own = request.config, SelfTeacherFields.of(request.config)
        if request.purpose != "train":
            return Teachers(eval=self._initial_model(request))
        encoder = offering_tools(config, model_kind_of(request.student).encoder(
            request.tokenizer, own.max_teacher_prompt_length, config.max_new_tokens, request.eos_ids, request.student,
            config.teacher_template_kwargs()))
        prompts = TeacherPrompts(encoder, own.teacher_prompt_template)

        def self_teacher(kind: str) -> SelfTeacher:
            return SelfTeacher(kind, request.student, prompts, request.vocab_size, request.eos_ids, request.pad_id,
                               request.device, request.autocast)

        train = self_teacher(own.teacher_model_kind) if request.method.objective(config).signals else None
        evaluation = None
        if request.evaluating:
            evaluation = train if own.teacher_model_kind == "base" and train else self_teacher("base")
        return Teachers(train, evaluation)

    def _initial_model(self, request: TeacherRequest) -> SelfTeacher:
        config, own, tokenizer = request.config, SelfTeacherFields.of(request.config), request.tokenizer
        initial, _ = load_model(config.student or DEFAULT_TEACHER, "teacher (the run's initial model)", request.device)
        initial = make_student(initial, config.resolved_student_init(True))
        max_new_tokens = config.eval_max_new_tokens
        check_context(initial, "teacher (the run's initial model)",
                      {"max_teacher_prompt_length": own.max_teacher_prompt_length, "max_new_tokens": max_new_tokens})
        encoder = offering_tools(config, model_kind_of(initial).encoder(tokenizer, own.max_teacher_prompt_length, max_new_tokens,
                                                                        request.eos_ids, initial,
                                                                        config.teacher_template_kwargs()))
        prompts = TeacherPrompts(encoder, own.teacher_prompt_template)
        # "live" on a model that never trains is its initial weights, without the copy "base" would make.
        return SelfTeacher("live", initial.eval(), prompts, request.vocab_size, request.eos_ids, tokenizer.pad_token_id,
                           request.device)

    def eval_values(self, method: Method, values: dict, record: dict, args) -> dict:
        """`--teacher` names the run's initial model (its `student`)."""
        name = method.name
        if getattr(args, "teacher_url", None):
            raise ValueError(f"--teacher-url: a {name} run is compared with its own initial model (shown the rows' "
                             "privileged context), not a server; pass that model as --teacher MODEL, or nothing to use "
                             "the run's")
        if args.teacher:
            return {**values, "student": args.teacher}
        if not record:
            raise ValueError(f"a student directory without a run's config.yaml: name the {name} run's initial model "
                             "with --teacher MODEL")
        if isinstance(values.get("student"), str) and OBJECT_RECORD.fullmatch(values["student"]):
            raise ValueError("this run's student was a Python object, which cannot be loaded here: pass its initial "
                             "weights as --teacher MODEL")
        return values


class SelfLocation(StudentOnlyLocation):
    name = kind = "self"
    reads_images = True  # the student itself: its teacher rows carry the student rows' image inputs
    words, signal = "the student itself", DENSE
    why = "its teacher is the student itself, shown privileged context"
    title = "# Student distilled from itself, shown privileged context (self-distillation)"

    def validate(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        super().validate(config, method, sources)
        if config.fsdp and method.objective(config).signals:
            raise ValueError(f"fsdp: true with method {method.name}'s self-teacher is not supported: the self-teacher "
                             "runs the student's own weights outside the sharded forward. Train it without fsdp "
                             "(sdpo with distillation_weight 0, GRPO, has no self-teacher and shards)")

    def prompt_budgets(self, config: DistillConfig, method: Method, takes_signal: bool, evaluating: bool) -> set[str]:
        budgets = super().prompt_budgets(config, method, takes_signal, evaluating)
        return budgets | {method.teacher_prompt_budget} if takes_signal else budgets
