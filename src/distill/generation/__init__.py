"""Generation engines: how completions are sampled, one part behind one interface.

- `engine.py`: `SamplingParams`, the `Engine` protocol and the engine registry (`register_engine`).
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
only when named.
"""

from distill.generation import hf, lean, vllm_engine, vllm_server  # noqa: F401  (they register the built-in engines)
from distill.generation.complete import first_eos_mask, generate_completions
from distill.generation.engine import (
           AUTO,
           Engine,
           SamplingParams,
           engine_names,
           get_engine,
           register_engine,
           unregister_engine,
)

__all__ = ["AUTO", "Engine", "SamplingParams", "engine_names", "first_eos_mask", "generate_completions", "get_engine",
           "register_engine", "unregister_engine"]
