"""The teacher's lm_head on the trainer, for a teacher whose forward pass runs elsewhere (hidden-state payload).

A server or a cache that sends the teacher's final hidden states (after the final norm, H numbers per token)
gives back the exact full distribution once the trainer applies the teacher's head: weight (V, H), optional
bias (V,), logit scale and soft-cap (`distill.losses.LogitHead`). The head travels once, as a safetensors
file (`head_bytes` / `head_from_bytes`: the tensors in float32 and the scalars in its metadata), or is read
from the teacher's own files without loading the model (`head_from_model_files`: only the lm_head tensor, or
the tied input embedding, is read from its safetensors). Either way it is checked against the fingerprint the
server or cache announces (`head_fingerprint`), so a head of another model, another revision or another
vocabulary cut is refused before the first step.

Memory: V x H float32 on the trainer, 113 MB for the default teacher (49,152 x 576); 2.1 GB for an 8B-class
teacher (V = 128,256, H = 4,096).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from distill.losses import LogitHead

HEAD_FORMAT = "distill-teacher-head"


def head_fingerprint(head: LogitHead) -> str:
    """SHA-256 of the head's float32 weight and bias bytes, their shapes, the scale and the soft-cap."""
    digest = hashlib.sha256()
    weight = head.weight.detach().to("cpu", torch.float32).contiguous()
    digest.update(json.dumps({"shape": list(weight.shape), "bias": head.bias is not None, "scale": float(head.scale),
                              "softcap": None if head.softcap is None else float(head.softcap)}).encode())
    digest.update(weight.numpy().tobytes())
    if head.bias is not None:
        digest.update(head.bias.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def head_bytes(head: LogitHead) -> bytes:
    """The head as a safetensors file: `weight` (and `bias`) in float32, scale / soft-cap / fingerprint in metadata."""
    from safetensors.torch import save

    tensors = {"weight": head.weight.detach().to("cpu", torch.float32).contiguous()}
    if head.bias is not None:
        tensors["bias"] = head.bias.detach().to("cpu", torch.float32).contiguous()
    metadata = {"format": HEAD_FORMAT, "scale": repr(float(head.scale)),
                "softcap": "" if head.softcap is None else repr(float(head.softcap)), "sha256": head_fingerprint(head)}
    return save(tensors, metadata=metadata)


def head_from_bytes(data: bytes, where: str) -> LogitHead:
    """A head written by `head_bytes`; ValueError naming `where` when it is not one or its bytes do not match
    its own fingerprint (a truncated or altered file)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
        metadata = _metadata(data)
    except (SafetensorError, ValueError, json.JSONDecodeError) as error:
        raise ValueError(f"{where}: not a teacher head file ({error})") from None
    if metadata.get("format") != HEAD_FORMAT or "weight" not in tensors or set(tensors) - {"weight", "bias"}:
        raise ValueError(f"{where}: not a teacher head file (format {metadata.get('format')!r}, tensors {sorted(tensors)})")
    softcap = float(metadata["softcap"]) if metadata.get("softcap") else None
    head = LogitHead(tensors["weight"], tensors.get("bias"), float(metadata.get("scale", "1.0")), softcap)
    if head_fingerprint(head) != metadata.get("sha256"):
        raise ValueError(f"{where}: the head's bytes do not match its fingerprint (truncated or altered)")
    return head


def _metadata(data: bytes) -> dict:
    """A safetensors file's `__metadata__` (its header is 8 bytes of length, then JSON)."""
    length = int.from_bytes(data[:8], "little")
    if not 0 < length <= len(data) - 8:
        raise ValueError("no safetensors header")
    return json.loads(data[8 : 8 + length]).get("__metadata__") or {}


def head_from_model_files(directory: str | Path, vocab_size: int) -> LogitHead:
    """The lm_head of a Hugging Face model directory, read from its safetensors files without loading the model:
    `lm_head.weight` (and its bias), or the input embedding when the config ties them; the first `vocab_size`
    rows (padding cut, as `distill.models.logit_head` does); the logit transforms its config names."""
    from safetensors import safe_open

    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"teacher_head: {directory} has no config.json; name a model directory with safetensors "
                         "weights, or leave teacher_head unset to take the head from the server")
    config = json.loads(config_path.read_text())
    config = {**config.get("text_config", {}), **config}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"teacher_head: {directory} has no .safetensors weights (a GGUF or .bin model): leave teacher_head "
                         "unset to take the head from the server")
    tied = config.get("tie_word_embeddings", True)
    wanted = ["lm_head.weight"] + (["model.embed_tokens.weight", "embed_tokens.weight",
                                    "model.language_model.embed_tokens.weight"] if tied else [])
    tensors = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                if name in wanted or name == "lm_head.bias":
                    tensors[name] = handle.get_tensor(name)
    weight_name = next((name for name in wanted if name in tensors), None)
    if weight_name is None:
        raise ValueError(f"teacher_head: no lm_head.weight{' or tied input embedding' if tied else ''} in {directory}")
    cut = lambda t: t[:vocab_size].to(torch.float32)  # noqa: E731
    scale = float(config.get("logit_scale") or 1.0)
    if config.get("logits_scaling"):
        scale /= float(config["logits_scaling"])
    softcap = config.get("final_logit_softcapping")
    bias = tensors.get("lm_head.bias")
    return LogitHead(cut(tensors[weight_name]), None if bias is None else cut(bias), scale, float(softcap) if softcap else None)
