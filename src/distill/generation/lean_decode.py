"""distill's own decode loop for Llama-family models in float32 on CPU: HF `generate`'s samples, in less time.

Why: a CPU decode step of the default student (4 rows) reads all of its weights for a handful of rows, and
HF `generate` spends about 55 ms per step there: 33 ms in matrix products (MKL's small-row sgemm re-packs
every weight on every call), 4 ms drawing the sample (`torch.multinomial` draws an exponential for each of
the 4 x 49152 entries) and the rest in the layers' small ops, a cache grown by `cat` and per-step masks.
This loop packs each weight once per call (`torch.ops.mkl._mkl_reorder_linear_weight`, for exactly the
batch's row count), writes keys and values into a preallocated cache, and samples by inverting the CDF
with one uniform draw per row. Numbers: docs/scaling.md, "Time per step".

What stays HF's: the model's own modules compute the embeddings, the rotary cos/sin and the activation; each
RMSNorm is `F.rms_norm` on its own weight and epsilon (LlamaRMSNorm's float32 formula in one op, the same
bits); the prompt's forward (many rows per product) uses the unpacked weights; the logits processors
are transformers' own classes, in the order and under the conditions `generate` uses; position ids,
padding of finished rows, EOS and stopping criteria follow `generate`. What differs: a packed product
rounds differently from an unpacked one (about 1e-6 relative on a logit), so greedy tokens equal
`generate`'s except at a near tie, and sampling draws from the same distribution with a different use
of the random stream (one float64 uniform per row and step), so seeded samples differ from `generate`'s.

Anything else falls back to HF `generate` (`refusal` says why): another architecture or a subclass of one of
its modules, a dtype other than float32, a device other than CPU, sharded (DTensor) weights, LoRA's layers
(PEFT's wrapper or its injected projections), weights off the CPU (offloaded), a forward hook other than FSDP's
own or a forward replaced on an instance (the loop calls no layer's forward, so such a hook would not run), or a
generation config that sets anything beyond token ids, the sampling settings distill passes, and no-op values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from distill.no_grad import no_grad

# What a model's generation config may set for the lean loop to decode it as `generate` would: token ids, the
# sampling settings distill always passes explicitly (they override the config's), and bookkeeping.
_HARMLESS_GENERATION_FIELDS = frozenset({
    "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "do_sample", "temperature", "top_k",
    "top_p", "max_length", "max_new_tokens", "use_cache", "output_attentions", "output_hidden_states", "output_scores",
    "output_logits", "return_dict_in_generate", "_from_model_config", "transformers_version",
})
# Fields that add a processor or change the search, at the values where `generate` does neither.
_NO_OP_GENERATION_VALUES = {
    "num_beams": 1, "num_return_sequences": 1, "num_beam_groups": 1, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "min_length": 0, "min_new_tokens": 0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "remove_invalid_values": False, "renormalize_logits": False, "typical_p": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "guidance_scale": 1.0, "length_penalty": 1.0, "diversity_penalty": 0.0,
}


def refusal(model: nn.Module, device: torch.device) -> str | None:
    """Why `model` must be decoded by HF `generate`, or None when `lean_generate` can decode it."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import (
        LlamaAttention,
        LlamaDecoderLayer,
        LlamaMLP,
        LlamaRMSNorm,
    )

    if device.type != "cpu":
        return f"device {device.type} (the lean loop is for CPU)"
    if _built_as(model) is not LlamaForCausalLM:
        return f"{type(model).__name__} is not transformers' LlamaForCausalLM"
    layers = model.model.layers
    if not all(_built_as(layer) is LlamaDecoderLayer and _built_as(layer.self_attn) is LlamaAttention
               and _built_as(layer.mlp) is LlamaMLP and _built_as(layer.input_layernorm) is LlamaRMSNorm
               and _built_as(layer.post_attention_layernorm) is LlamaRMSNorm for layer in layers):
        return "a decoder layer is not transformers' Llama layer"
    if _built_as(model.model.norm) is not LlamaRMSNorm:
        return "the final norm is not transformers' LlamaRMSNorm"
    projections = [model.lm_head] + [linear for layer in layers for linear in _projections(layer)]
    if not all(type(linear) is nn.Linear for linear in projections):  # e.g. LoRA's layers, which add to the product
        return "a projection is not a plain nn.Linear"
    for name, parameter in model.named_parameters():
        if type(parameter.data) is not torch.Tensor:  # a DTensor (FSDP), a quantized or fake tensor
            return f"parameter {name} is a {type(parameter.data).__name__}"
        if parameter.dtype != torch.float32:
            return f"parameter {name} is {parameter.dtype} (the lean loop is float32)"
        if parameter.device.type != "cpu":  # e.g. offloaded to the meta device by accelerate's hooks
            return f"parameter {name} is on {parameter.device.type}"
    hooked = _hooked_module(model)
    if hooked is not None:
        return f"module {hooked or 'the model'} has a forward hook or its own forward, which the lean loop would not run"
    for field, value in model.generation_config.to_diff_dict().items():
        if field not in _HARMLESS_GENERATION_FIELDS and _NO_OP_GENERATION_VALUES.get(field, object()) != value:
            return f"the model's generation config sets {field}={value!r}"
    return None


def _hooked_module(model: nn.Module) -> str | None:
    """The name of the first module whose forward does more than its class's (a hook that is not FSDP's own,
    accelerate's `_hf_hook`, a forward set on the instance), "" for a global module hook, else None."""
    from torch.nn.modules import module as module_globals

    if module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks:
        return ""
    # transformers' `enable_input_require_grads` (gradient checkpointing) only marks the embeddings' output as
    # requiring grad, which means nothing under no_grad.
    require_grads = getattr(model, "_require_grads_hook", None)
    harmless = {require_grads.id} if require_grads is not None else set()
    for name, module in model.named_modules():
        hooks = [hook for key, hook in (*module._forward_hooks.items(), *module._forward_pre_hooks.items()) if key not in harmless]
        if any(not _is_fsdp_hook(hook) for hook in hooks) or hasattr(module, "_hf_hook") or "forward" in vars(module):
            return name or "(root)"
    return None


def _is_fsdp_hook(hook) -> bool:
    """FSDP's pre/post-forward hooks: they gather and reshard parameters, which `gathered` has already done."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError:
        return False
    return isinstance(getattr(hook, "__self__", None), FSDPState)


def _built_as(module: nn.Module) -> type:
    """The module's class, seen through the subclass FSDP's `fully_shard` swaps in (it only adds hooks to
    forward, which this loop does not call; sharded weights are refused by the parameter check)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module, FSDPModule):
        return next(base for base in type(module).__bases__ if base is not FSDPModule)
    return type(module)


def _projections(layer: nn.Module) -> tuple[nn.Linear, ...]:
    """q, k, v, o, gate, up, down of a Llama decoder layer."""
    attention, mlp = layer.self_attn, layer.mlp
    return (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)


class _Linear:
    """nn.Linear's product, with the weight pre-packed by MKL for inputs of exactly `rows` rows."""

    def __init__(self, linear: nn.Linear, rows: int):
        self.weight, self.bias, self.rows = linear.weight, linear.bias, rows
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, rows) if _has_mkl_packing() else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        # Inputs of another row count (the prompt's forward) use the unpacked weight inside the same op.
        return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, self.rows)


def _has_mkl_packing() -> bool:
    return torch._C.has_mkl and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")


@dataclass
class _Layer:
    module: nn.Module
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    gate: _Linear
    up: _Linear
    down: _Linear


class LlamaDecoder:
    """One batch's forward over a preallocated KV cache: `prefill` the prompts, then `step` one token per row; `append`
    feeds each row more ids after what the cache holds (a conversation's next turn, `distill.generation.lean_turns`).

    Shapes: B rows, each row's ids in slots of a cache (B, kv_heads, capacity, head_dim); a slot that holds no id of
    its row (a left-padded batch's padding) is masked by `key_bias`. Rotary positions count a row's real ids (0 for
    its first), whatever slot they sit in. `prefill`, `append` and `step` return the last position's logits, (B, V)
    float32, as `generate` takes them.
    """

    def __init__(self, model: nn.Module, rows: int, capacity: int):
        config = model.config
        self.model = model
        self.capacity = capacity
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.rows = rows
        self._pack(rows)
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        self.keys = [torch.zeros(shape) for _ in self.layers]
        self.values = [torch.zeros(shape) for _ in self.layers]
        # (B, 1, 1, T): 0 at the real keys so far, -inf elsewhere; SDPA adds a float mask as it is (a bool one
        # it converts to this on every call)
        self.key_bias = torch.full((rows, 1, 1, capacity), float("-inf"))
        self.length = 0
        self.next_position = torch.zeros(rows, 1, dtype=torch.long)  # (B, 1): each row's next rotary position

    def _pack(self, rows: int) -> None:
        """The projections packed for inputs of `rows` rows (a step's)."""
        model = self.model
        self.layers = [_Layer(layer, *(_Linear(linear, rows) for linear in _projections(layer))) for layer in model.model.layers]
        self.lm_head = _Linear(model.lm_head, rows)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: (B, W), left-padded, into an empty cache. Position ids as `generate` makes them."""
        assert self.length == 0, "LlamaDecoder.prefill into a cache that holds ids; append instead"
        return self.append(input_ids, attention_mask)

    def append(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: (B, W), left-padded, each row at least one real id: fed after what the cache holds
        of the row, at its next positions. A real id attends to its row's real ids before it; a padding one only to
        itself and those (no row of the mask is empty: an empty row would make NaN that reaches the real positions
        through the cache as 0 x NaN)."""
        rows, width = input_ids.shape
        start = self.length
        if start + width > self.capacity:
            raise RuntimeError(f"LlamaDecoder: the cache holds {self.capacity} positions")
        real = attention_mask.bool()
        positions = (self.next_position + attention_mask.long().cumsum(-1) - 1).masked_fill(~real, 0)
        self.key_bias[:, 0, 0, start : start + width].masked_fill_(real, 0.0)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        mask = (causal & real[:, None, None, :]) | torch.eye(width, dtype=torch.bool)
        if start:
            earlier = (self.key_bias[:, :, :, :start] == 0).expand(rows, 1, width, start)
            mask = torch.cat((earlier, mask.expand(rows, 1, width, width)), dim=-1)
        self.next_position = positions[:, -1:] + 1
        return self._forward(input_ids, positions, mask)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B,) the tokens just chosen, fed at the next position of every row."""
        if self.length >= self.capacity:
            raise RuntimeError(f"LlamaDecoder: the cache holds {self.capacity} positions")
        self.key_bias[:, 0, 0, self.length] = 0.0
        logits = self._forward(tokens[:, None], self.next_position, self.key_bias[:, :, :, : self.length + 1])
        self.next_position = self.next_position + 1
        return logits

    def mask(self, row: int, start: int, end: int | None = None) -> None:
        """Slots start..end (default: all filled so far) of `row` hold nothing of it from now on."""
        self.key_bias[row, 0, 0, start : self.length if end is None else end] = float("-inf")

    def forget(self, row: int) -> None:
        """`row` holds nothing: every slot masked, its next id at position 0 (a conversation started over)."""
        self.mask(row, 0)
        self.next_position[row] = 0

    def select(self, rows: list[int | None]) -> None:
        """Keep the rows `rows` names by their index, in that order; None: a new row that holds nothing."""
        index = torch.tensor([0 if row is None else row for row in rows], dtype=torch.long)
        fresh = torch.tensor([row is None for row in rows], dtype=torch.bool)
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.key_bias = self.key_bias.index_select(0, index)
        self.key_bias[fresh] = float("-inf")
        self.next_position = self.next_position.index_select(0, index).masked_fill(fresh[:, None], 0)
        if len(rows) != self.rows:
            self.rows = len(rows)
            self._pack(self.rows)

    def reserve(self, capacity: int) -> None:
        """Room for `capacity` slots in all (grown, the filled slots kept; never shrunk)."""
        if capacity <= self.capacity:
            return
        extra = capacity - self.capacity
        grow = lambda t: torch.cat((t, t.new_zeros(*t.shape[:2], extra, t.shape[3])), dim=2)  # noqa: E731
        self.keys = [grow(k) for k in self.keys]
        self.values = [grow(v) for v in self.values]
        self.key_bias = torch.cat((self.key_bias, torch.full((self.rows, 1, 1, extra), float("-inf"))), dim=-1)
        self.capacity = capacity


    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows, count = input_ids.shape
        start, end = self.length, self.length + count
        hidden = self.model.model.embed_tokens(input_ids)
        cos, sin = self.model.model.rotary_emb(hidden, positions)
        rotary = _Rotary(cos.unsqueeze(1), sin.unsqueeze(1))
        for index, layer in enumerate(self.layers):
            attention, block = layer.module.self_attn, layer.module
            normed = _rms_norm(block.input_layernorm, hidden)
            q = layer.q(normed).view(rows, count, self.heads, self.head_dim).transpose(1, 2)
            k = layer.k(normed).view(rows, count, self.kv_heads, self.head_dim).transpose(1, 2)
            v = layer.v(normed).view(rows, count, self.kv_heads, self.head_dim).transpose(1, 2)
            self.keys[index].narrow(2, start, count).copy_(rotary(k))
            self.values[index].narrow(2, start, count).copy_(v)
            out = F.scaled_dot_product_attention(rotary(q), self.keys[index][:, :, :end], self.values[index][:, :, :end],
                                                 attn_mask=mask, scale=attention.scaling, enable_gqa=True)
            hidden = hidden + layer.o(out.transpose(1, 2).reshape(rows, count, -1))
            normed = _rms_norm(block.post_attention_layernorm, hidden)
            hidden = hidden + layer.down(block.mlp.act_fn(layer.gate(normed)) * layer.up(normed))
        self.length = end
        last = _rms_norm(self.model.model.norm, hidden[:, -1])
        return self.lm_head(last).float()


def _rms_norm(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm's forward in one op (its float32 case: x / sqrt(mean(x^2) + eps) * weight), the same values."""
    return F.rms_norm(hidden, norm.weight.shape, norm.weight, norm.variance_epsilon)


class _Rotary:
    """Rotary embedding of queries or keys (B, heads, T, D), as HF's `x cos + rotate_half(x) sin`.

    rotate_half(x) = (-x2, x1) for the halves x1, x2 of the last dimension, which is x rolled by half a
    dimension times (-1, +1): the sign goes on sin, once per forward, instead of on every layer's q and k.
    """

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.half = cos.shape[-1] // 2
        self.cos = cos
        self.signed_sin = torch.cat((-sin[..., : self.half], sin[..., self.half :]), dim=-1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cos + x.roll(self.half, dims=-1) * self.signed_sin


def logits_processors(do_sample: bool, temperature: float, top_k: int, top_p: float, suppress_tokens: list[int]):
    """transformers' own processors, in the order and under the conditions `generate` adds them."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import (
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList()
    if suppress_tokens:
        processors.append(SuppressTokensLogitsProcessor(suppress_tokens, device="cpu"))
    if do_sample:
        if temperature is not None and temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if top_k:
            processors.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
        if top_p is not None and top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return processors


def sample_from_logits(scores: torch.Tensor, generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """(B, V) processed logits -> (B,) tokens drawn from softmax(scores), one float64 uniform per row: from torch's
    process RNG, or with `generators` (B) each row's from its own (`seeded_rows`: independent of the process RNG).

    Inverse CDF: token j is drawn when u * total falls in [cdf[j-1], cdf[j]), so a token of probability 0
    (an empty interval) is never drawn. The CDF is summed in float64 to keep the 49152-term sum exact enough.
    """
    probs = torch.softmax(scores, dim=-1, dtype=torch.float64)
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1]
    if not bool(torch.isfinite(total).all() and (total > 0).all()):  # NaN or inf logits, or every token masked
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0 (the logits of a row are "
                           "not finite, or every token of a row is masked)")
    if generators is None:
        uniforms = torch.rand(scores.shape[0], 1, dtype=torch.float64, device=scores.device)
    else:
        uniforms = torch.cat([torch.rand(1, 1, dtype=torch.float64, generator=g) for g in generators]).to(scores.device)
    draw = uniforms * total[:, None]
    return torch.searchsorted(cdf, draw, right=True).clamp_(max=scores.shape[-1] - 1).squeeze(1)


class ConversationTurns(Protocol):
    """Where a batch of conversations' earlier turns are kept (`distill.generation.lean_turns.TurnCache`)."""

    def resume(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, keys: list[int],
               max_new_tokens: int) -> tuple[LlamaDecoder, torch.Tensor]: ...

    def turn_ended(self, first_slot: int, generated: torch.Tensor, fed: list[torch.Tensor]) -> None: ...


@no_grad
def lean_generate(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                  do_sample: bool, temperature: float, top_k: int, top_p: float, eos_ids: list[int], pad_id: int,
                  suppress_tokens: list[int] | None = None, stopping_criteria=None, with_log_probs: bool = False,
                  generators: list[torch.Generator] | None = None, conversations: ConversationTurns | None = None,
                  keys: list[int] | None = None):
    """`generate`'s loop on `LlamaDecoder`: (B, L) new tokens (finished rows padded with `pad_id`, L the steps run)
    and, with `with_log_probs`, (B, L) float32 log-probs of each chosen token under the processed scores.
    `generators`: one per row to sample from (`sample_from_logits`), or None for torch's process RNG.
    `conversations`, `keys`: the rows are conversations (one key each) whose earlier turns `conversations` may hold:
    only the ids after what it holds of a row are fed (`distill.generation.lean_turns`), and it keeps this turn's."""
    rows, width = input_ids.shape
    if conversations is None:
        decoder = LlamaDecoder(model, rows, width + max_new_tokens)
        logits = decoder.prefill(input_ids, attention_mask)
    else:
        assert keys is not None and len(keys) == rows, "lean_generate: one conversation key per row"
        decoder, logits = conversations.resume(model, input_ids, attention_mask, keys, max_new_tokens)
    first_slot = decoder.length
    fed: list[torch.Tensor] = []  # per step fed to the cache, the rows whose token was theirs (not padding)
    processors = logits_processors(do_sample, temperature, top_k, top_p, suppress_tokens or [])
    sequences = torch.full((rows, width + max_new_tokens), pad_id, dtype=torch.long)
    sequences[:, :width] = input_ids
    unfinished = torch.ones(rows, dtype=torch.bool)
    eos = torch.tensor(eos_ids, dtype=torch.long)
    log_probs = []
    steps = 0
    while steps < max_new_tokens:
        live = unfinished.clone()
        scores = processors(sequences[:, : width + steps], logits)
        tokens = sample_from_logits(scores, generators) if do_sample else scores.argmax(dim=-1)
        if eos_ids:
            tokens = torch.where(unfinished, tokens, pad_id)
        if with_log_probs:
            log_probs.append(torch.log_softmax(scores, dim=-1).gather(1, tokens[:, None]).squeeze(1))
        sequences[:, width + steps] = tokens
        steps += 1
        if eos_ids:
            unfinished &= ~torch.isin(tokens, eos)
        if stopping_criteria is not None:  # `generate` passes the stored scores, None unless asked to keep them
            unfinished &= ~stopping_criteria(sequences[:, : width + steps], None).to(torch.bool)
        if not unfinished.any() or steps == max_new_tokens:
            break
        logits = decoder.step(tokens)
        fed.append(live)
    generated = sequences[:, width : width + steps]
    if conversations is not None:
        conversations.turn_ended(first_slot, generated, fed)
    return generated, (torch.stack(log_probs, dim=1) if with_log_probs else None)
