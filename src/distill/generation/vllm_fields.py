"""The vLLM engines' own settings (`generation_engine: vllm`, `vllm_server`): a leaf, so the config composes them while
the engines are declared (`distill.parts`) without importing vLLM's engine code or torch."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting


@dataclass
class VllmFields(PartFields):
    """The colocated vLLM engine's own settings."""

    vllm_kv_cache_gib: float = setting(1.0, "KV cache of each vLLM replica, in GiB (generation_engine: vllm; one replica "
                                       "per model it samples from: the student, a teacher, an EMA self-teacher).")


@dataclass
class VllmServerFields(PartFields):
    """The vLLM server engine's own settings."""

    vllm_server_url: str | None = setting(None, "generation_engine: vllm_server: the address of the vLLM server that "
                                          "samples the student (started with VLLM_SERVER_DEV_MODE=1; docs/vllm.md).")
    vllm_weights_dir: str | None = setting(None, "generation_engine: vllm_server: a directory the trainer and the server "
                                           "both see, where the student's weights are written for the server to reload "
                                           "after each optimizer step (default: the run directory).")
