"""No silent fields: every config field is read by some part of the chosen run, or rejected.

A run is made of parts: the core loop, the method (`Method.reads`), the teacher's location
(`TeacherLocation.reads`), the generation engine, the run features (`Feature.reads`: conversations, asynchronous
rollouts, vision, the doctor), student sampling, LoRA, the evaluation, trackers. Each declares the fields it reads
and when it is active. A field changed from its default (the dataclass's, or the method's for a field it
fills in: `Method.defaults`) that no active part reads is an error that says what would read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from distill.features import features
from distill.generation.registry import engine_names, get_engine
from distill.locations.registry import location_of, locations
from distill.methods.base import Method, get_method, method_names
from distill.registry import Reads

if TYPE_CHECKING:
    from distill.config import DistillConfig

CORE = Reads("every run", (
    "method", "dataset", "dataset_split", "output_dir", "overwrite_output_dir", "student", "student_init",
    "max_new_tokens", "max_prompt_length", "chat_template_kwargs", "generation_engine", "loss_chunk_size", "learning_rate", "weight_decay", "adam_beta1",
    "adam_beta2", "adam_epsilon", "max_grad_norm", "lr_scheduler_type", "warmup_steps", "max_steps", "max_time_minutes",
    "per_device_train_batch_size", "gradient_accumulation_steps", "seed", "gradient_checkpointing", "use_peft", "fsdp", "device",
    "dtype", "logging_steps", "save_steps", "save_total_limit", "report_to", "progress_bar", "eval_before_after"))


def run_reads(sources: frozenset[str]) -> tuple[Reads, ...]:
    """What every run reads, whatever its method (the core, the engines, the run features); `sources`: the completion sources the method's plan can draw."""
    return (
        CORE,
        Reads("warmup_steps: 0 (warmup_steps > 0 overrides it)", ("warmup_ratio",), lambda c: c.warmup_steps == 0),
        Reads("on-policy micro-batches (the student samples; lmbda > 0)", ("sampling_temperature", "top_p", "top_k"),
              lambda c: "student" in sources),
        *engine_reads(),
        *(part for feature in features() for part in feature.reads(sources)),
        Reads("use_peft: true", ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"), lambda c: c.use_peft),
        Reads("eval_before_after: true", ("eval_dataset", "eval_split", "eval_max_prompts", "eval_max_new_tokens",
                                          "eval_batch_size", "eval_examples"), lambda c: c.eval_before_after),
        Reads("a tracker (report_to other than none)", ("run_name",), lambda c: c.report_to.strip() not in ("", "none")),
        Reads("a teacher that renders its own prompts (a method with another tokenizer's teacher, gold; or a "
              "self-teacher, sdft and sdpo)", ("teacher_chat_template_kwargs",), renders_own_prompts),
        *location_reads(),
    )


def renders_own_prompts(config: DistillConfig) -> bool:
    """Whether the run's teacher renders prompts of its own (with `teacher_chat_template_kwargs`), rather than scoring
    the student's rendering."""
    method = get_method(config.method)
    return method.cross_tokenizer or method.teacher == "self"


def location_reads() -> tuple[Reads, ...]:
    """Every registered location's `reads`."""
    return tuple(part for location in locations() for part in location.reads)


def engine_reads() -> tuple[Reads, ...]:
    """The fields each registered engine reads (`Engine.reads` and its own settings), active when the run names it."""
    def named(name: str) -> Callable[[DistillConfig], bool]:
        return lambda config: config.generation_engine == name

    engines = [get_engine(name) for name in engine_names()]
    return tuple(Reads(f"generation_engine: {engine.name}", (*engine.reads, *own_fields(engine)), named(engine.name))
                 for engine in engines if engine.reads or own_fields(engine))


def own_fields(part) -> tuple[str, ...]:
    """The names of a part's own settings (`fields`: a settings class or a tuple of them, composed into the config
    when it registered)."""
    declared = part.fields if isinstance(part.fields, (tuple, list)) else (part.fields,) if part.fields else ()
    return tuple(f.name for fields_class in declared for f in dataclasses.fields(fields_class))


def implicit_reads(method: Method, sources: frozenset[str]) -> tuple[Reads, ...]:
    """A part's own settings that no part's `reads` names are read whenever the part runs (a toy method's scale):
    the method's while it runs, a location's while it holds the teacher. Settings a part shares with others (gkd's
    mixing fields, declared by every method that reads one of them) are read only as the `reads` say."""
    named = {name for part in run_reads(sources) for name in part.names}
    named |= {name for other in method_names() for part in get_method(other).reads for name in part.names}
    own = tuple(name for name in own_fields(method) if name not in named)
    found: list[Reads] = [Reads(f"method {method.name}", own)] if own else []
    for location in locations():
        unnamed = tuple(name for name in own_fields(location) if name not in named)
        if unnamed:
            found.append(Reads(f"the {location.name} teacher location", unnamed, holds_the_teacher(location, method)))
    return tuple(found)


def holds_the_teacher(location, method: Method) -> Callable[[DistillConfig], bool]:
    return lambda config: location_of(config, method) is location


@dataclass(frozen=True)
class Unread:
    """A field changed from its default that no active part of the run reads. `needs`: what would read it ("eval_before_after:
    true"), None when no part of a run of this method does; `readers`: then, the methods that read it."""

    name: str
    needs: str | None
    readers: tuple[str, ...] = ()

    def refusal(self, method: Method) -> str:
        """The error for a field the user set."""
        if self.needs is not None:
            return (f"{self.name} is only read with {self.needs}; this configuration would ignore it. "
                    "Remove it or enable what it belongs to.")
        by = f" (methods {', '.join(self.readers)} read it)" if self.readers else ""
        return f"{self.name} is not read by method {method.name}{by}; this configuration would ignore it. Remove it."


def read_by(config: DistillConfig, method: Method, sources: frozenset[str]) -> tuple[set[str], dict[str, str]]:
    """(the fields an active part of the run reads, {field: what would read it} for the others of its parts)."""
    active: set[str] = set()
    inactive: dict[str, str] = {}
    for part in (*run_reads(sources), *method.reads, *implicit_reads(method, sources)):
        if part.when(config):
            active.update(part.names)
        else:
            for name in part.names:
                inactive.setdefault(name, part.needs)
    return active, inactive


def unread_fields(config: DistillConfig, method: Method, sources: frozenset[str]) -> list[Unread]:
    """Every field changed from its default (the dataclass's, or the method's for a field it fills in:
    `Method.defaults`) that no active part of the run reads, in the config's order."""
    active, inactive = read_by(config, method, sources)
    found = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in active or value == field_default(f) or (f.name in method.defaults and value == method.defaults[f.name]):
            continue
        readers = () if f.name in inactive else tuple(
            name for name in method_names() if any(f.name in part.names for part in get_method(name).reads))
        found.append(Unread(f.name, inactive.get(f.name), readers))
    return found


def field_default(f: dataclasses.Field):
    return f.default_factory() if callable(f.default_factory) else f.default


def check_fields_read(config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
    """Raise ValueError for the first field changed from its default that no active part of the run reads."""
    unread = unread_fields(config, method, sources)
    if unread:
        raise ValueError(unread[0].refusal(method))


def declared_fields(method: Method, sources: frozenset[str]) -> set[str]:
    """Every field some part of a run of `method` can read (a test checks no config field is left out)."""
    return {name for part in (*run_reads(sources), *method.reads, *implicit_reads(method, sources)) for name in part.names}
