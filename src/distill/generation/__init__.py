"""Generation engines: how completions are sampled, one part behind one interface.

- `engine.py`: `SamplingParams` and the `Engine` interface. `registry.py`: the engine table (`register_engine`), a
  leaf: the built-in engines are declared by `distill.parts` and imported when first asked for.
- `complete.py`: `generate_completions`, the one entry every sampler calls (the student's rollouts, a
  teacher's seq_kd samples, a self-teacher's, the evaluation's): batching, left padding, padded vocabulary
  rows, the cut at the first EOS, and the engine chosen by `SamplingParams.engine`.
- `sync.py`: `WeightSync`, the step hook that keeps an engine's own copy of the student's weights current
  (for engines that define `sync_weights`; the built-ins need none).
- `hf.py`: transformers' `generate` (any model). `lean.py`: distill's lean decode loop (`distill.generation.lean_decode`;
  Llama-family float32 models on CPU: the same distribution in less time).
- `vllm_engine.py`: vLLM colocated (`generation_engine: vllm`, the optional extra): a `vllm.LLM` replica per
  model in the training process, its weights reloaded in place whenever the model's change.
- `vllm_server.py`: a vLLM server samples the student (`generation_engine: vllm_server`); the trainer writes
  the student's weights to a shared directory and asks the server to reload them. `weights.py`: what both
  vLLM engines share (checkpoint names, LoRA merged, the weights' fingerprint).
- `seeds.py`: the per-row sampling seeds every caller passes, from (seed, purpose, step, process, row).

`generation_engine: auto` (the default) takes the lean loop where it applies and `generate` otherwise; vLLM
only when named. Importing this package imports no engine and no torch: the names of `engine.py` and `complete.py`
re-exported here are imported when read.
"""

from typing import TYPE_CHECKING, Any

from distill.generation.registry import AUTO, engine_names, get_engine, register_engine, unregister_engine

if TYPE_CHECKING:  # what `__getattr__` gives, for the type checker
    from distill.generation.complete import first_eos_mask, generate_completions
    from distill.generation.engine import Engine, SamplingParams

_INTERFACE = ("Engine", "SamplingParams")
_SAMPLING = ("first_eos_mask", "generate_completions")


def __getattr__(name: str) -> Any:
    """The engine interface's and the sampling entry's names (they import torch), imported when read."""
    if name in _INTERFACE:
        from distill.generation import engine

        return getattr(engine, name)
    if name in _SAMPLING:
        from distill.generation import complete

        return getattr(complete, name)
    raise AttributeError(f"module 'distill.generation' has no attribute {name!r}")


__all__ = ["AUTO", "Engine", "SamplingParams", "engine_names", "first_eos_mask", "generate_completions", "get_engine",
           "register_engine", "unregister_engine"]
