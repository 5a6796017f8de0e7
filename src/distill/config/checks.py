"""`DistillConfig.validate()`: the checks that need no model or data, each written once.

Each field's range here; the method's own rules (`Method.validate`), the teacher's location against the
method (`distill.locations.validate`), and that every field set is read by the run (`distill.config.reads`).
A config is checked against every registered part, so this module imports them; `distill.config` itself
imports none (it is a leaf: no torch, no method).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import TYPE_CHECKING, Any

from distill import locations
from distill.config.reads import check_fields_read
from distill.config.values import DTYPES, SCHEDULERS, TRACKERS
from distill.conversations.environments import EnvironmentFactory
from distill.conversations.tools import load_tools
from distill.generation import AUTO, get_engine
from distill.losses.checks import check_beta
from distill.methods import get_method
from distill.models import parse_student_init
from distill.training.runtime import check_device

if TYPE_CHECKING:
    from distill.config import DistillConfig


def validate(config: DistillConfig):
    """The config with the method's defaults in the fields left at None (a copy: `config` is not changed),
    checked; raises ValueError naming the field and the fix."""
    method = get_method(config.method)
    config = dataclasses.replace(config, **{name: value for name, value in method.defaults.items()
                                            if getattr(config, name) is None})
    _one_of("lr_scheduler_type", config.lr_scheduler_type, SCHEDULERS)
    if config.generation_engine != AUTO:
        engine = get_engine(config.generation_engine)
        unavailable = engine.availability()
        if unavailable is not None:
            raise ValueError(unavailable)
        engine.check_config(config)  # the engine's own settings
    _one_of("dtype", config.dtype, DTYPES)
    if config.tools or config.environment is not None:
        tools = load_tools(list(config.tools))  # every import path resolves, no two tools share a name
        if config.environment is not None:
            EnvironmentFactory.load(config.environment, set(tools))
        if config.max_turns < 1 or not config.tool_timeout > 0:
            raise ValueError(f"max_turns must be >= 1 and tool_timeout > 0, got {config.max_turns!r} and "
                             f"{config.tool_timeout!r}")
    if config.beta is not None:
        check_beta(config.beta)  # the losses' own rule
    for name in ("warmup_ratio", "top_p", "teacher_top_p"):
        if getattr(config, name) is not None and not 0.0 <= getattr(config, name) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {getattr(config, name)!r}")
    if config.top_p == 0 or config.teacher_top_p == 0:
        raise ValueError("top_p and teacher_top_p must be in (0, 1]; use 1.0 to turn nucleus sampling off")
    for name in ("temperature", "sampling_temperature", "teacher_sampling_temperature", "learning_rate"):
        value = getattr(config, name)
        if not value > 0 or math.isinf(value):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    for name in ("max_new_tokens", "max_prompt_length", "max_steps", "per_device_train_batch_size",
                 "gradient_accumulation_steps", "logging_steps", "loss_chunk_size", "eval_max_new_tokens",
                 "eval_batch_size", "lora_r", "seq_kd_generation_steps"):
        value = getattr(config, name)
        if value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name in ("max_time_minutes", "save_steps", "save_total_limit", "warmup_steps", "top_k", "teacher_top_k",
                 "eval_max_prompts", "eval_examples", "weight_decay", "max_grad_norm"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(config, name)!r}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(config, name) < 1.0:
            raise ValueError(f"{name} must be in [0, 1) (AdamW's moment decay; 0.9 and 0.999 are usual), got {getattr(config, name)!r}")
    if not 0.0 <= config.adam_epsilon < math.inf:
        raise ValueError(f"adam_epsilon must be a finite number >= 0 (1e-8 is usual), got {config.adam_epsilon!r}")
    if not 0 <= config.seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {config.seed!r}")
    check_device(config.device)
    for tracker in [t.strip() for t in config.report_to.split(",") if t.strip()]:
        _one_of("report_to", tracker, TRACKERS)
    if config.student_init is not None:
        parse_student_init(config.student_init)
    method.validate(config)
    sources = method.sources(config).possible()
    locations.validate(config, method, sources)
    if config.fsdp and config.dtype == "float16":
        raise ValueError("fsdp: true with dtype float16 is not supported (its loss scaler would need unscaling "
                         "before distill clips the sharded gradients); use dtype bfloat16 or float32")
    if config.fsdp and config.use_peft:
        raise ValueError("fsdp: true with use_peft: true is not supported (LoRA's few trainable parameters gain "
                         "little from sharding); drop one of them")
    _check_staleness(config, sources)
    check_fields_read(config, method, sources)
    return config


def _check_staleness(config: DistillConfig, sources: frozenset[str]) -> None:
    """Asynchronous rollouts' rules (`max_staleness`, `distill.training.ahead`)."""
    from distill.methods.reuse_fields import RolloutReuseFields
    from distill.objectives.staleness import CORRECTIONS, RATIO_LEVELS
    from distill.training.ahead import PACINGS

    if not isinstance(config.max_staleness, int) or config.max_staleness < 0:
        raise ValueError(f"max_staleness must be an integer >= 0 (0: the synchronous loop), got {config.max_staleness!r}")
    _one_of("staleness_pacing", config.staleness_pacing, PACINGS)
    _one_of("staleness_correction", config.staleness_correction, CORRECTIONS)
    _one_of("staleness_ratio", config.staleness_ratio, RATIO_LEVELS)
    if not (config.staleness_ratio_cap > 1 and math.isfinite(config.staleness_ratio_cap)):
        raise ValueError(f"staleness_ratio_cap must be a finite number > 1 (2 is usual), got {config.staleness_ratio_cap!r}")
    if config.max_staleness == 0:
        return
    if "student" not in sources:
        raise ValueError(f"max_staleness {config.max_staleness}: this run never samples from the student (method "
                         f"{config.method}'s completions come from {sorted(sources)}), so nothing can be sampled ahead; "
                         "set max_staleness: 0")
    if RolloutReuseFields.of(config).num_iterations > 1:
        raise ValueError("max_staleness > 0 with num_iterations > 1: a rollout is either reused or sampled ahead, not "
                         "both; set num_iterations: 1 or max_staleness: 0")
    if config.fsdp:
        raise ValueError("max_staleness > 0 with fsdp: true is not supported (the sampler keeps a whole copy of the "
                         "student beside the sharded one); set max_staleness: 0 or fsdp: false")



def _one_of(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}{hint}")
