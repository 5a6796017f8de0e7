"""What the vLLM engines share: how a model's weights are named for vLLM, merged when LoRA is on, and how a
change is noticed; what they refuse; how their per-row answers become the engine interface's tensors."""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from distill.no_grad import no_grad


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


@no_grad
def weights_fingerprint(model: nn.Module) -> tuple[float, ...]:
    """Each parameter's sum in float64: it moves whenever training changes the parameter. Contents, not
    version counters: torch's fused AdamW updates parameters without moving their `_version` (measured,
    torch 2.13). One pass over the weights (a reload is a copy of them); an update whose float64 sum is
    exactly unchanged in every tensor is not a case training produces."""
    sums = [p.detach().sum(dtype=torch.float64) for p in model.parameters()]
    return tuple(torch.stack(sums).tolist()) if sums else ()


def adapters_off(model: nn.Module) -> bool:
    """Whether `model`'s LoRA adapters are switched off now (peft's `disable_adapter()`: a base self-teacher
    decodes the student this way, and must not be sampled from the student's merged weights)."""
    return any(getattr(module, "disable_adapters", False) for module in model.modules() if hasattr(module, "lora_A"))


def checkpoint_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s weights by their names in a transformers checkpoint, in its order (its state dict: a tied lm_head is
    listed, which vLLM's in-place reload needs to finish the layer), a LoRA model's merged:
    W + scaling * B @ A for each adapted linear layer (W alone while the adapters are off), the adapters
    themselves left out."""
    try:
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
    except ImportError:
        PeftModel = None
    if PeftModel is None or not isinstance(model, PeftModel):
        return dict(model.state_dict())
    base = model.get_base_model()
    merged = {}
    for module_name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight.detach()
            for adapter in ([] if module.disable_adapters else module.active_adapters):  # off: the base model
                if adapter in module.lora_A:
                    weight = weight + module.get_delta_weight(adapter).detach().to(weight.dtype)
            merged[f"{module_name}.weight"] = weight
    weights = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        weights[plain] = merged.get(plain, tensor)
    return weights


def config_of(model: nn.Module):
    """The transformers config of `model` (a LoRA model's: its base model's)."""
    return model.get_base_model().config if hasattr(model, "get_base_model") else model.config


def check_decodable(engine: str, request) -> None:
    """A vLLM engine seeds every row, and cannot run a stopping criterion (gold's byte budget)."""
    if request.seeds is None:
        raise ValueError(f"generation_engine {engine} seeds every row: pass seeds (distill.seeds) to "
                         "generate_completions")
    if request.stopping_criteria is not None:
        raise ValueError(f"generation_engine {engine} cannot apply a stopping criterion (a cross-tokenizer teacher's byte "
                         "budget); sample those with generation_engine: auto")


def padded(rows: list[list[int]], log_probs: list[list[float]] | None, pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, L) new tokens, padded with `pad_id`, and (B, L) float32 log-probs (zeros past each row) or None."""
    width = max((len(ids) for ids in rows), default=0)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    values = torch.zeros(len(rows), width) if log_probs is not None else None
    for row, ids in enumerate(rows):
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        if values is not None and log_probs is not None:
            values[row, : len(ids)] = torch.tensor(log_probs[row], dtype=torch.float32)
    return tokens, values
