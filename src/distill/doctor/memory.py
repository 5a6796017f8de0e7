"""The memory a run needs, by part (the doctor's `memory` check reads it): an estimate from the models, the config and
the run's parts, and what lowers each part."""

from __future__ import annotations

from distill.doctor.context import DoctorContext
from distill.generation import AUTO, get_engine
from distill.methods.async_fields import AsyncFields

GIB = float(1 << 30)

SAMPLER_COPY = "sampler copy"
# What lowers each part of the estimate: a finding's fix names the fields of the parts that need the most.
PART_FIXES = {
    "student weights": "a smaller student (student_init: drop_every:N drops layers)",
    "gradients": "LoRA (use_peft: true: gradients and optimizer state for the adapters only)",
    "optimizer state": "LoRA (use_peft: true: gradients and optimizer state for the adapters only)",
    "teacher": "a teacher held elsewhere (teacher_url, or a teacher_cache)",
    "activations": "lower per_device_train_batch_size or the lengths (raise gradient_accumulation_steps to keep the "
                   "batch), or set gradient_checkpointing: true",
    "loss chunk": "lower loss_chunk_size",
    SAMPLER_COPY: "lower max_staleness (with staleness_pacing wait the producer holds max_staleness + 1 snapshots of "
                  "the trainable weights beside its copy of the student; 0 holds none)",
}


def memory_fix(parts: dict[str, float]) -> str:
    """What lowers the estimate most: the fixes of its largest parts, largest first, until they cover half of it."""
    fixes: list[str] = []
    covered, need = 0.0, sum(parts.values())
    for name, value in sorted(parts.items(), key=lambda item: -item[1]):
        if covered >= need / 2:
            break
        covered += value
        fix = PART_FIXES.get(name, f"lower what {name} holds")
        if fix not in fixes:
            fixes.append(fix)
    return "; or ".join(fixes)


def memory_estimate(context: DoctorContext) -> dict[str, float]:
    """Bytes a training step needs, by part (an estimate: the formulas are in the docstring of `memory`)."""
    config, student = context.config, context.student
    trainable = sum(p.numel() for p in student.parameters() if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in student.parameters())
    teacher = 0.0 if context.teacher is None or context.teacher is student else float(
        sum(p.numel() * p.element_size() for p in context.teacher.parameters()))
    model_config = getattr(student, "config", None)
    hidden = getattr(model_config, "hidden_size", 0) or 0
    layers = getattr(model_config, "num_hidden_layers", 0) or 0
    vocabulary = student.get_output_embeddings().weight.shape[0]
    tokens = config.per_device_train_batch_size * (config.max_prompt_length + config.max_new_tokens)
    activations = 0.0 if config.gradient_checkpointing else float(tokens * hidden * layers * 16 * 4)
    parts = {"student weights": float(weights), "gradients": float(trainable * 4), "optimizer state": float(trainable * 8),
             "teacher": teacher, "activations": activations, "loss chunk": float(4 * config.loss_chunk_size * vocabulary * 4)}
    if config.generation_engine != AUTO:  # an engine's own copy of the student (vLLM's replica and KV cache)
        engine = get_engine(config.generation_engine)
        held = engine.resident_bytes(student, config)
        if held:
            parts[f"{engine.label}"] = held
    snapshots = AsyncFields.of(config).snapshots_held(config.max_steps)
    if snapshots:  # the asynchronous producer's copy of the student, and the versions its pacing holds for it
        trainable_bytes = sum(p.numel() * p.element_size() for p in student.parameters() if p.requires_grad)
        parts[SAMPLER_COPY] = float(weights + trainable_bytes * snapshots)
    head = context.teacher_head.weight if context.teacher_head is not None else None
    if head is not None:  # the hidden-state payload's teacher head, held here
        parts["teacher head"] = float(head.numel() * head.element_size())
    return parts
