"""The checks, in the order they are reported; each names the failure it comes from.

Enforced elsewhere as errors, before any model loads or as models load (listed on the Troubleshooting page too):
prompt + completion lengths against each model's context (`distill.models.loading.check_context`), the sampling
settings against the estimator that reads the sampling distribution (`distill.methods.sampling_rules`), the
vocabularies of a same-tokenizer pair (`distill.models.shared_vocab_size`), and a conversation template that does
not preserve prefixes when the run trains on conversations (`distill.rendering.probes`).
"""

from __future__ import annotations

import os

import psutil
import torch

from distill.conversations.fields import ConversationFields
from distill.doctor.context import DoctorContext
from distill.doctor.findings import Finding, register_check
from distill.doctor.memory import GIB, memory_estimate, memory_fix
from distill.doctor.timing import estimate, step_seconds, steps_to_time, unit_costs
from distill.generation import AUTO, get_engine
from distill.methods.async_fields import AsyncFields
from distill.models import cut_from_layers, eos_token_ids

ON_POLICY_METHODS = ("on_policy", "iw_opd", "gkd", "sdft", "sdpo", "gold")
PRETRAINED_LR = 2e-5  # measured: benchmarks/sums.py (see `learning_rate`)


def _name(tokenizer, token_id: int) -> str:
    return f"{tokenizer.convert_ids_to_tokens(int(token_id))!r} ({int(token_id)})"


@register_check("end_of_turn", "The teacher's end of turn is one the student stops at",
                "a base student whose EOS (151643) is not the instruct teacher's end of turn (151645) never stops: "
                "modelscope/ms-swift#9526")
def end_of_turn(context: DoctorContext) -> list[Finding]:
    if context.teacher is None or not context.same_tokenizer:
        return []
    teacher_ids = eos_token_ids(context.teacher_tokenizer or context.tokenizer, context.teacher)
    missing = [t for t in teacher_ids[:1] if t not in context.eos_ids]
    if not missing:
        return []
    tokenizer = context.tokenizer
    return [Finding("end_of_turn", "warning",
                    f"the teacher ends a turn with {_name(tokenizer, missing[0])}, which is not among the student's stop "
                    f"ids {[_name(tokenizer, t) for t in context.eos_ids]}: the teacher's samples and its signal end "
                    "turns with a token the student neither stops at nor is trained to end with",
                    "give the student the teacher's chat template (save its tokenizer with the teacher's "
                    "`chat_template`) or a generation_config whose eos_token_id includes the teacher's end of turn")]


@register_check("pad_is_eos", "A pad token equal to EOS is masked, never trained as padding",
                "trainers that mask padding by id also mask the real EOS, and the model never learns to stop")
def pad_is_eos(context: DoctorContext) -> list[Finding]:
    pad = context.tokenizer.pad_token_id
    if pad is None or pad not in context.eos_ids:
        return []
    return [Finding("pad_is_eos", "info",
                    f"the pad token is the end of turn {_name(context.tokenizer, pad)}: distill selects trained tokens "
                    "by masks, never by id, so each completion's EOS is trained and its padding is not")]


@register_check("plain_text_prompts", "Chat models get chat prompts",
                "plain-text prompts to an instruct teacher and student gave '' answers before and after training "
                "(tried here with an outside fact set; the reference library does the same)")
def plain_text_prompts(context: DoctorContext) -> list[Finding]:
    if getattr(context.tokenizer, "chat_template", None) is None:
        return []
    text = [e for e in context.examples if isinstance(e.prompt, str)]
    if not text:
        return []
    return [Finding("plain_text_prompts", "warning",
                    f"{len(text)} of {len(context.examples)} dataset rows have a plain-text `prompt` (first: row "
                    f"{text[0].index}) while the student's tokenizer has a chat template: they are tokenized as they are, "
                    "without the template's turn headers, and a chat model often answers such text with nothing",
                    "give the prompts as chat messages ({\"prompt\": [{\"role\": \"user\", \"content\": ...}]} or a "
                    "`messages` column), or use a model without a chat template")]


@register_check("template_prefixes", "The chat template preserves prefixes (multi-turn rows, tool calls)",
                "templates that strip earlier `<think>` blocks (Qwen3) re-render history: verl#6854, verl#3720")
def template_prefixes(context: DoctorContext) -> list[Finding]:
    from distill.rendering.probes import prefix_problem

    if getattr(context.tokenizer, "chat_template", None) is None:
        return []
    problem = prefix_problem(context.tokenizer, context.eos_ids, context.config.chat_template_kwargs)
    if problem is not None:
        conversation = ConversationFields.of(context.config)
        uses = any(e.is_conversation for e in context.examples) or bool(conversation.tools) or (
            conversation.environment is not None)
        return [Finding("template_prefixes", "warning" if uses else "info",
                        f"{problem}: a conversation is trained in pieces, a new one at each turn whose context the "
                        "template re-renders, each with that context as its prompt (every turn trained in the context "
                        "it was generated in; each piece re-reads its history, which costs forward passes)",
                        "nothing to fix for correctness; for speed, a template (or chat_template_kwargs) that keeps "
                        "earlier turns as they were rendered makes each conversation one sequence")]
    return []


@register_check("thinking_boundary", "Teacher and student templates open the answer alike (thinking mode)",
                "a teacher that expects `<think>` at the first student token scores every answer as off-format: "
                "siyan-zhao/OPSD#10")
def thinking_boundary(context: DoctorContext) -> list[Finding]:
    if context.teacher_tokenizer is None or context.teacher_tokenizer is context.tokenizer:
        return []
    from distill.rendering.probes import generation_prompt

    student = generation_prompt(context.tokenizer, context.config.chat_template_kwargs)
    teacher = generation_prompt(context.teacher_tokenizer, context.config.teacher_template_kwargs())
    if student is None or teacher is None or ("<think>" in student) == ("<think>" in teacher):
        return []
    opens, other = ("teacher", "student") if "<think>" in teacher else ("student", "teacher")
    scored = ("the teacher scores the student's prompt rendering" if context.same_tokenizer
              else "each model renders its own prompt")
    return [Finding("thinking_boundary", "warning",
                    f"the {opens}'s chat template opens the assistant turn with <think> and the {other}'s does not "
                    f"(generation prompts {teacher!r} for the teacher, {student!r} for the student); {scored}, so one of "
                    "them reads every answer as starting out of its format",
                    "render both with the same thinking mode: save the teacher's tokenizer with a template that does "
                    "not open <think> (or the student's with one that does)")]


@register_check("padded_rows", "Output rows past the tokenizer's vocabulary are never sampled or trained",
                "heads padded to a multiple of 64 (Qwen's 151936 rows for 151665 tokens) sampled ids the tokenizer "
                "cannot decode")
def padded_rows(context: DoctorContext) -> list[Finding]:
    rows = context.student.get_output_embeddings().weight.shape[0]
    vocabulary = len(context.tokenizer)
    if rows <= vocabulary:
        return []
    return [Finding("padded_rows", "info",
                    f"the student's head has {rows} rows for {vocabulary} tokens: the {rows - vocabulary} padded rows are "
                    "suppressed in sampling and left out of every loss")]


@register_check("learning_rate", "The learning rate fits the student (pretrained or freshly cut)",
                "measured here (benchmarks/sums.py): iw_opd's 3e-4 suits the layer-dropped student, but on a pretrained "
                "student 5e-5 already collapsed iw_opd and 1e-5 did better for on_policy")
def learning_rate(context: DoctorContext) -> list[Finding]:
    config = context.config
    # cut_from_layers: also a model that an earlier distill run cut and saved, given back as `student`
    whole = config.resolved_student_init(context.student_given) == "all" and cut_from_layers(context.student) is None
    if not whole or config.method not in ON_POLICY_METHODS or config.learning_rate <= PRETRAINED_LR or config.use_peft:
        return []
    return [Finding("learning_rate", "warning",
                    f"learning_rate {config.learning_rate:g} with method {config.method} on a whole pretrained student "
                    f"(student_init all): above {PRETRAINED_LR:g}, where such students were measured to collapse on their "
                    "own samples",
                    f"start from learning_rate {PRETRAINED_LR:g} or lower (the recipes' larger rates are tuned for the "
                    "layer-dropped demo student), or use LoRA (use_peft: true)")]


@register_check("teacher_is_student", "The student is not already the teacher",
                "a student that starts as the teacher has zero divergence: the run spends its budget learning nothing")
def teacher_is_student(context: DoctorContext) -> list[Finding]:
    teacher = context.teacher
    if teacher is None or context.method.teacher == "self":
        return []
    same = teacher is context.student or _same_weights(teacher, context.student)
    if not same:
        return []
    return [Finding("teacher_is_student", "warning",
                    "the student starts with the teacher's weights, every layer kept (student_init all): the divergence "
                    "is zero at the first step and the loss has nothing to teach",
                    "give a smaller `student`, or drop layers (student_init: drop_every:3)")]


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    if pa.keys() != pb.keys():
        return False
    return all(x.shape == pb[name].shape and torch.equal(x.detach(), pb[name].detach()) for name, x in pa.items())


@register_check("memory", "The run fits in this machine's memory",
                "runs that do not fit are found out an hour in, at the first long batch")
def memory(context: DoctorContext) -> list[Finding]:
    """Student weights in their dtype, fp32 gradients and AdamW's two fp32 moments per trainable parameter, the
    teacher's weights, activations at the configured batch and lengths (about 16 fp32 values per token, layer and
    hidden unit; none kept with gradient checkpointing), the chunked loss's logits (4 x chunk x vocabulary fp32), a
    colocated vLLM replica (weights and `vllm_kv_cache_gib`), with `max_staleness` s the sampler's copy of the student
    and the snapshots of its trainable weights the pacing holds (`AsyncFields.snapshots_held`: s + 1 at most when
    waiting, 2s + 1 when dropping; counted here though they live in host memory), and a hidden-state teacher's head;
    against the machine's memory, or a GPU's (`torch.cuda.mem_get_info`) when the models are there. The fix names what
    lowers the largest parts (`memory_fix`)."""
    device = next(context.student.parameters()).device
    parts = memory_estimate(context)
    need = sum(parts.values())
    if device.type == "cuda":  # the device's memory (the process holds the models there)
        available, total = (float(v) for v in torch.cuda.mem_get_info(device))
        where = f"on {torch.cuda.get_device_name(device)}"
    else:
        total, available = float(psutil.virtual_memory().total), float(psutil.virtual_memory().available)
        where = "of this machine's memory"
    shown = ", ".join(f"{name} {value / GIB:.2f}" for name, value in parts.items() if value)
    measured = (f"about {need / GIB:.2f} GiB ({shown}) against {available / GIB:.1f} GiB available of {total / GIB:.1f} "
                f"GiB {where}")
    if need > total:
        return [Finding("memory", "error", measured, memory_fix(parts))]
    if need > 0.8 * available:
        return [Finding("memory", "warning", measured, f"the run may swap or be killed: {memory_fix(parts)}; or free "
                        "memory")]
    return [Finding("memory", "info", measured)]


@register_check("prompt_truncation", "Prompts fit max_prompt_length",
                "prompts cut silently lose their system prompt or the tools' schemas (they keep their end)")
def prompt_truncation(context: DoctorContext) -> list[Finding]:
    if context.encoded is None:
        return []
    cut = [e.index for e, row in zip(context.examples, context.encoded) if row.prompt_truncated]
    if not cut:
        return []
    return [Finding("prompt_truncation", "warning",
                    f"{len(cut)} of {len(context.examples)} prompts are longer than max_prompt_length "
                    f"({context.config.max_prompt_length} tokens; first: row {cut[0]}): they keep their last "
                    f"{context.config.max_prompt_length} tokens, so their start (a system prompt, the tools) is lost",
                    "raise max_prompt_length (within the models' context, with max_new_tokens), or shorten the prompts")]


@register_check("eos_in_completions", "Dataset completions do not spell the end of turn inside their text",
                "a completion holding the EOS string is cut there: the rest is never trained")
def eos_in_completions(context: DoctorContext) -> list[Finding]:
    names = {context.tokenizer.convert_ids_to_tokens(t) for t in context.eos_ids}
    holding = [e.index for e in context.examples if e.completion and any(name and name in e.completion for name in names)]
    if not holding:
        return []
    return [Finding("eos_in_completions", "warning",
                    f"{len(holding)} dataset completions (first: row {holding[0]}) contain an end-of-turn token's text "
                    f"({sorted(n for n in names if n)}): each is cut at it, and what follows is not trained",
                    "remove the token from the completions' text (distill appends the end of turn itself)")]


@register_check("tool_format", "Tool calls in a format the template renders",
                "templates without tool support drop `tool_calls` silently in other trainers (the reference library "
                "probes with sentinels)")
def tool_format(context: DoctorContext) -> list[Finding]:
    from distill.rendering import ConversationRenderer

    conversation = ConversationFields.of(context.config)
    uses_tools = bool(conversation.tools) or conversation.environment is not None or any(
        e.tools is not None for e in context.examples)
    if not uses_tools or getattr(context.tokenizer, "chat_template", None) is None:
        return []
    renderer = ConversationRenderer(context.tokenizer, context.eos_ids, context.config.chat_template_kwargs)
    found, written = renderer.call_format()
    samples = bool(conversation.tools) or conversation.environment is not None  # the tool-call loop reads turns
    if found is None:
        return [Finding("tool_format", "error" if samples else "info",
                        f"the chat template writes a tool call as {written!r}, a format distill cannot read back from "
                        "a sampled turn" + (": the tool-call loop would see no call, so the run stops as it builds it"
                                            if samples else " (dataset conversations still train as the template "
                                                            "renders them)"),
                        "use a chat template that writes calls in the Hermes format or as Llama 3's JSON object"
                        if samples else "")]
    if renderer.template_renders_tools:
        return [Finding("tool_format", "info", "the chat template renders `tool_calls` and `tools` itself, a call "
                        f"in the {found.name} format ({found.example}), which the model must write for a call to "
                        "run; sampled turns are read in that format")]
    return [Finding("tool_format", "info",
                    "the chat template has no tool support: distill writes the tools into the system message and the "
                    "calls in the Hermes format (<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>) into the "
                    "assistant's text, and parses the same format in sampled turns")]


ASYNC_FEW_CORES = 4  # at most this many cores shared by the worker and training: little to gain (measured on 2)


@register_check("async_cores", "Asynchronous rollouts have cores (or a device) of their own to overlap on",
                "measured here (benchmarks/async_rollouts.py, on_policy on 2 CPU cores): the worker thread sampling beside "
                "training took 9.9 s per step at max_staleness 1 and 2 against 10.9 s at 0 (1.1x), its generation "
                "slowed from 4.5 to 8.0 s by sharing the cores")
def async_cores(context: DoctorContext) -> list[Finding]:
    config = context.config
    max_staleness = AsyncFields.of(config).max_staleness
    if not max_staleness or (config.generation_engine != AUTO and get_engine(config.generation_engine).elsewhere):
        return []
    if next(context.student.parameters()).device.type != "cpu":
        return []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores > ASYNC_FEW_CORES:
        return []
    return [Finding("async_cores", "warning",
                    f"max_staleness {max_staleness} with the student sampling in this process on {cores} CPU "
                    "core(s): the worker and training share them, so the overlap gains little (measured on 2 cores: "
                    "1.1x) while the samples are a step older",
                    "sample on a device or machine of its own (generation_engine: vllm_server), or keep max_staleness: 0")]


@register_check("step_time", "How long the run's steps take (measured, `distill doctor` only)",
                "runs that cannot finish in their budget are found out hours in", runs_the_run=True)
def step_time(context: DoctorContext) -> list[Finding]:
    """The first step, and the first that generates each other sampled source, run as training runs them and timed by
    phase (`distill.doctor.timing`); the run's steps extrapolated from those unit costs over the sources every step
    draws. The evaluation before and after training comes on top. A step that fails is an error: it fails as the
    run's would, and `distill train` would stop there."""
    if context.steps is None:
        return []
    config = context.config
    if config.generation_engine != AUTO and get_engine(config.generation_engine).keeps_weights:
        return [Finding("step_time", "info", f"not measured: generation_engine {config.generation_engine} samples from "
                        "weights of its own, which only a run pushes to it", "run a few steps (`--max_steps 5`) and read "
                        "the tokens_per_second/* and timings in metrics.jsonl")]
    sources = context.steps.generated_sources()
    steps = steps_to_time(sources)
    timed: list[dict[str, float]] = []
    try:
        for step in steps:
            timed.append(context.steps.time_step(step))
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit from an environment, CancelledError from a reward: the run's too
        said = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        return [Finding("step_time", "error", f"step {steps[len(timed)]} failed as it would in `distill train`, which "
                        f"stops there: {said}", "fix what the error names, then run `distill doctor` again")]
    accumulation = config.gradient_accumulation_steps
    seconds = estimate(unit_costs(timed, accumulation), sources, accumulation)
    measured = "; ".join(f"step {step} ({', '.join(sources[step]) or 'a reused rollout'}) "
                         f"{step_seconds(t):.1f} s"
                         for step, t in zip(steps, timed))
    phases = ", ".join(f"{name.replace('/', ' by the ')} {value / 60:.1f}" for name, value in seconds.items()
                       if name != "total" and value)
    max_staleness = AsyncFields.of(config).max_staleness
    overlap = (f"; steps timed one after the other: with max_staleness {max_staleness} the student's sampling "
               "overlaps training, so at most this" if max_staleness else "")
    stand_in = context.steps.tool_stand_in()
    stood_in = (f"; no tool or environment ran: every call was answered {stand_in!r} and no environment was made (no "
                "reset: prompts without its observation; its reward counted 0), so the tools' own time is not in it "
                "(`distill doctor --run-tools` runs them)" if stand_in is not None else "")
    return [Finding("step_time", "info",
                    f"measured {measured}: about {seconds['total'] / 60:.1f} minutes for {config.max_steps} steps "
                    f"({phases} minutes), the evaluation before and after training on top{overlap}{stood_in}")]
