"""`DistillConfig.validate()`: the checks that need no model or data, each written once.

Each core field's range here; each run feature's own rules (`Feature.check_settings`, `Feature.check_run`:
conversations, asynchronous rollouts), the method's own rules (`Method.validate`), the teacher's location against
the method (`check_location`), and that every field set is read by the run (`distill.config_rules.reads`; a field a
recipe set that the user's own choice made inert is ignored with a note: `distill.config_rules.inert`). A config
is checked against every registered part, so this module sits above them and imports their tables; `distill.config`
itself imports none (it is a leaf: no torch, no method) and reaches `validate` through the registry, by the import
path the catalogue registers (`distill.parts`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from distill.config.values import DTYPES, SCHEDULERS, TRACKERS, one_of
from distill.config_rules.inert import drop_inert, notes, with_method_defaults
from distill.config_rules.reads import check_fields_read
from distill.features import features
from distill.generation.registry import AUTO, get_engine
from distill.locations.registry import location_of, locations
from distill.losses.checks import check_beta
from distill.methods.base import Method, get_method
from distill.models import parse_student_init
from distill.rendering.base import check_template_kwargs
from distill.training.runtime import check_device

if TYPE_CHECKING:
    from distill.config import DistillConfig

logger = logging.getLogger(__name__)


def validate(config: DistillConfig):
    """The config with the method's defaults in the fields left at None (a copy: `config` is not changed),
    checked; raises ValueError naming the field and the fix. A field a recipe set that the user's own choice made
    inert is back at its default in the copy, with a note on the `distill` logger."""
    method = get_method(config.method)
    raw, config = config, with_method_defaults(config, method)
    one_of("lr_scheduler_type", config.lr_scheduler_type, SCHEDULERS)
    if config.generation_engine != AUTO:
        engine = get_engine(config.generation_engine)
        unavailable = engine.availability()
        if unavailable is not None:
            raise ValueError(unavailable)
        engine.check_config(config)  # the engine's own settings
    one_of("dtype", config.dtype, DTYPES)
    run_features = features()
    for feature in run_features:
        feature.check_settings(config)  # conversations: its tools and environment load
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
    for name in ("chat_template_kwargs", "teacher_chat_template_kwargs"):
        check_template_kwargs(name, getattr(config, name))
    check_device(config.device)
    for tracker in [t.strip() for t in config.report_to.split(",") if t.strip()]:
        one_of("report_to", tracker, TRACKERS)
    if config.student_init is not None:
        parse_student_init(config.student_init)
    method.validate(config)
    sources = method.sources(config).possible()
    config, ignored = drop_inert(config, raw, method, sources)  # a recipe's fields the user's own choices turned off
    sources = method.sources(config).possible()
    check_location(config, method, sources)
    if config.fsdp and config.dtype == "float16":
        raise ValueError("fsdp: true with dtype float16 is not supported (its loss scaler would need unscaling "
                         "before distill clips the sharded gradients); use dtype bfloat16 or float32")
    if config.fsdp and config.use_peft:
        raise ValueError("fsdp: true with use_peft: true is not supported (LoRA's few trainable parameters gain "
                         "little from sharding); drop one of them")
    for feature in run_features:
        feature.check_run(config, method, sources)  # asynchronous rollouts: against the method's sources
    check_fields_read(config, method, sources)
    for note in notes(ignored):
        logger.info(note)
    return config


def check_location(config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
    """The teacher's location against the method (its objective's signals, its completion sources)."""
    named = [loc.selected_by[0] for loc in locations() if loc.selected_by and getattr(config, loc.selected_by[0]) is not None]
    if len(named) > 1:
        raise ValueError(f"{' and '.join(sorted(named, reverse=True))}: a run has one teacher location; set one of them")
    location_of(config, method).validate(config, method, sources)

