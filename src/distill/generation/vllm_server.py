"""A vLLM server as the generation engine: the student samples on a server of its own (its own GPUs), and
the trainer pushes the student's weights to it (`generation_engine: vllm_server`, `vllm_server_url`).

The protocol, all of it stock vLLM (0.32), with the server started in development mode
(`VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model STUDENT_DIR
--logprobs-mode processed_logprobs ...`, docs/vllm.md):
- weights: the trainer writes the student's weights as a transformers checkpoint (`model.safetensors`, LoRA
  merged, names as `distill.generation.weights.checkpoint_weights`) into a directory both machines see
  (`vllm_weights_dir`, default: the run directory), then asks the server to reload them in place:
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`, then
  `POST /reset_prefix_cache` (cached prefixes hold the old weights' keys and values). A file on shared storage
  is the one transport stock vLLM offers that works on every device, CPUs included; its other weight-transfer
  engines (NCCL, CUDA IPC) need GPUs on both sides.
- a LoRA student: only its adapters travel, where the server takes them (started with `--enable-lora` and
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`, from the student's base model): peft's adapter files are written into the
  directory, then `POST /v1/load_lora_adapter {"lora_name": "distill-student", "lora_path": DIR, "load_inplace":
  true}`, and rows are sampled with `"model": "distill-student"`. A server without that endpoint gets the merged
  weights as above (logged once).
- when: before a decode, when the student's weights differ from the last pushed (`weights_fingerprint`): after
  every optimizer step that a rollout follows (after each `num_iterations` window when rollouts are reused; with
  `max_staleness`, the asynchronous producer's copy of each version, pushed from its worker).
- sampling: one `POST /v1/completions` per row (each row has its own `seed`; a request's seed is shared by
  all its prompts), sent concurrently: the prompt as token ids, `return_token_ids`, `logprobs: 0` when
  log-probs are recorded, the run's EOS ids as `stop_token_ids` (and `ignore_eos`), padded vocabulary rows
  excluded through `allowed_token_ids`.

The server holds one model, the student: teacher and self-teacher samples are refused (use `vllm` or
`auto` for runs that draw them). One training process (each would push and sample on its own).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from distill.generation.engine import DecodeRequest, Engine
from distill.generation.vllm_fields import VllmServerFields
from distill.generation.weights import (
    check_decodable,
    checkpoint_weights,
    config_of,
    padded,
    weights_fingerprint,
)
from distill.models.vision import VLLM_REFUSAL, is_vision_language

if TYPE_CHECKING:
    from distill.config import DistillConfig


logger = logging.getLogger("distill.rollout")

WEIGHTS_FILE = "model.safetensors"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
ADAPTER_NAME = "distill-student"  # the name the student's adapters are loaded under on the server


class VllmServerError(RuntimeError):
    """The generation server failed or answered something that is not vLLM's protocol."""


class VllmServerEngine(Engine):
    name = "vllm_server"
    label = "a vLLM server"
    auto_order = None
    keeps_weights = True
    elsewhere = True
    fields = (VllmServerFields,)

    def __init__(self):
        self.url: str | None = None
        self.weights_root: Path | None = None
        self.timeout_s, self.concurrency = 600.0, 8
        self._student: weakref.ref | None = None
        self._pushed: tuple | None = None
        self._directory: Path | None = None
        self._served_name: str | None = None
        self._adapters_taken: bool | None = None  # whether the server loads LoRA adapters (None: not asked yet)
        self.pushes = 0
        self.adapter_pushes = 0

    def configure(self, config: DistillConfig) -> None:
        own = VllmServerFields.of(config)
        self.url = (own.vllm_server_url or "").rstrip("/")
        self.weights_root = Path(own.vllm_weights_dir or config.output_dir)
        self._student, self._pushed, self._directory, self._served_name, self.pushes = None, None, None, None, 0
        self._adapters_taken, self.adapter_pushes = None, 0

    def check_config(self, config: DistillConfig) -> None:
        url = VllmServerFields.of(config).vllm_server_url
        if not url or not url.startswith(("http://", "https://")):
            raise ValueError(f"generation_engine vllm_server needs vllm_server_url, the server's http(s) address "
                             f"(e.g. http://127.0.0.1:8000), got {url!r}")

    def refusal(self, model, device: torch.device) -> str | None:
        if self.url is None:
            return "generation_engine vllm_server needs vllm_server_url"
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            return "the vLLM server engine runs with a single training process for now"
        if is_vision_language(model):
            return VLLM_REFUSAL
        return None

    def sync_weights(self, model: nn.Module) -> None:
        """The student is the model this engine serves; its weights reach the server before the next decode."""
        self._student = weakref.ref(model)

    # ------------------------------------------------------------------------------------- decode --
    def decode(self, model, request: DecodeRequest) -> tuple[torch.Tensor, torch.Tensor | None]:
        check_decodable(self.name, request)
        sampling, seeds, with_log_probs, suppress_tokens = request.sampling, request.seeds, request.with_log_probs, request.suppress_ids
        if self._student is None or self._student() is not model:
            raise ValueError("generation_engine vllm_server samples the student only (the server holds the student's "
                             "weights); a run that samples a teacher or a self-teacher needs generation_engine vllm or auto")
        self._push_if_changed(model)
        allowed = list(range(min(suppress_tokens))) if suppress_tokens else None
        rows = [row[mask.bool()].tolist() for row, mask in zip(request.input_ids, request.attention_mask)]

        def ask(row_and_seed):
            prompt, seed = row_and_seed
            payload = {"model": ADAPTER_NAME if self._serving_adapters(model) else self._model_name(), "prompt": prompt, "max_tokens": sampling.max_new_tokens, "seed": seed,
                       "temperature": sampling.temperature if sampling.do_sample else 0.0,
                       "top_p": sampling.top_p if sampling.do_sample else 1.0,
                       "top_k": sampling.top_k if sampling.do_sample else 0, "stop_token_ids": list(request.stop_ids),
                       "ignore_eos": True, "return_token_ids": True, "skip_special_tokens": False,
                       "logprobs": 0 if with_log_probs else None, "allowed_token_ids": allowed}
            return _completion(self._post("/v1/completions", payload), with_log_probs)

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            answers = list(pool.map(ask, zip(rows, seeds)))
        return padded([ids for ids, _ in answers], [values for _, values in answers] if with_log_probs else None, request.pad_id)

    # ------------------------------------------------------------------------------------ weights --
    def _push_if_changed(self, model: nn.Module) -> None:
        fingerprint = weights_fingerprint(model)
        if fingerprint == self._pushed:
            return
        from safetensors.torch import save_file

        start = time.perf_counter()
        if self._directory is None:
            self.weights_root.mkdir(parents=True, exist_ok=True)
            self._directory = Path(tempfile.mkdtemp(prefix="vllm-weights-", dir=self.weights_root))
            config_of(model).save_pretrained(self._directory)
        if _is_lora(model) and self._push_adapters(model):
            self._pushed, self.adapter_pushes = fingerprint, self.adapter_pushes + 1
            logger.debug("pushed the student's adapters to %s in %.2f s", self.url, time.perf_counter() - start)
            return
        weights = {name: tensor.detach().contiguous().cpu() for name, tensor in checkpoint_weights(model).items()}
        partial = self._directory / (WEIGHTS_FILE + ".partial")
        save_file(_untied(weights), str(partial))
        partial.replace(self._directory / WEIGHTS_FILE)  # the server never reads a half-written file
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(self._directory)}})
        self._post("/reset_prefix_cache", None)
        self._pushed, self.pushes = fingerprint, self.pushes + 1
        logger.debug("pushed the student's weights to %s in %.2f s", self.url, time.perf_counter() - start)

    def _push_adapters(self, model: nn.Module) -> bool:
        """Write the LoRA adapters and have the server load them in place; False when the server does not take
        adapters (no `/v1/load_lora_adapter`: not started with runtime LoRA updating), then the merged weights go."""
        if self._adapters_taken is False:
            return False
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        adapters = {name: tensor.detach().contiguous().cpu() for name, tensor in get_peft_model_state_dict(model).items()}
        partial = self._directory / (ADAPTER_FILES[0] + ".partial")
        save_file(adapters, str(partial))
        partial.replace(self._directory / ADAPTER_FILES[0])
        model.peft_config[model.active_adapter].save_pretrained(str(self._directory))  # adapter_config.json
        try:
            self._post("/v1/load_lora_adapter", {"lora_name": ADAPTER_NAME, "lora_path": str(self._directory),
                                                 "load_inplace": True})
        except VllmServerError as error:
            if self._adapters_taken is None and " answered 404" in str(error):
                self._adapters_taken = False
                logger.info("the vLLM server at %s takes no LoRA adapters (start it with --enable-lora and "
                            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 to push only them): pushing the merged weights", self.url)
                return False
            raise
        self._adapters_taken = True
        return True

    def _serving_adapters(self, model: nn.Module) -> bool:
        return bool(self._adapters_taken) and _is_lora(model)

    def close(self) -> None:
        """Remove the weights directory this engine wrote (its own files only)."""
        if self._directory is not None:
            for name in (WEIGHTS_FILE, WEIGHTS_FILE + ".partial", "config.json", *ADAPTER_FILES, ADAPTER_FILES[0] + ".partial"):
                (self._directory / name).unlink(missing_ok=True)
            if not any(self._directory.iterdir()):  # anything else in it is not ours: left where it is
                self._directory.rmdir()
        self._directory, self._student, self._pushed = None, None, None

    # -------------------------------------------------------------------------------------- HTTP --
    def _model_name(self) -> str:
        if self._served_name is None:
            body = self._get("/v1/models")
            try:
                self._served_name = body["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise VllmServerError(f"{self.url}/v1/models did not list a model: {str(body)[:300]}") from None
        return self._served_name

    def _get(self, path: str):
        return self._send(urllib.request.Request(self.url + path), path)

    def _post(self, path: str, payload: dict | None):
        data = json.dumps({k: v for k, v in (payload or {}).items() if v is not None}).encode()
        return self._send(urllib.request.Request(self.url + path, data=data, method="POST",
                                                 headers={"Content-Type": "application/json"}), path)

    def _send(self, request, path: str):
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                body = answer.read()
        except urllib.error.HTTPError as error:
            detail = error.read()[:500].decode(errors="replace")
            hint = (" (is the server in development mode? start it with VLLM_SERVER_DEV_MODE=1)"
                    if error.code == 404 and path in ("/collective_rpc", "/reset_prefix_cache") else "")
            raise VllmServerError(f"vllm_server_url {self.url}: {path} answered {error.code}: {detail}{hint}") from None
        except OSError as error:
            raise VllmServerError(f"vllm_server_url {self.url}: {path} failed: {error}") from None
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except json.JSONDecodeError:  # vLLM's LoRA endpoints answer in plain text
            return body.decode(errors="replace")


def _is_lora(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _untied(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors sharing memory (a tied lm_head): such a name gets its own copy."""
    seen, out = set(), {}
    for name, tensor in weights.items():
        key = (tensor.data_ptr(), tensor.shape)
        out[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return out


def _completion(body, with_log_probs: bool) -> tuple[list[int], list[float] | None]:
    """(token ids, their log-probs or None) of a /v1/completions answer with one choice."""
    try:
        choice = body["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        values = [float(v) for v in choice["logprobs"]["token_logprobs"]] if with_log_probs else None
    except (KeyError, IndexError, TypeError, ValueError):
        raise VllmServerError(f"a /v1/completions answer without token ids{' and log-probs' if with_log_probs else ''} "
                              f"(vLLM >= 0.10 returns them with return_token_ids): {str(body)[:300]}") from None
    if values is not None and len(values) != len(ids):
        raise VllmServerError(f"a /v1/completions answer with {len(ids)} tokens and {len(values)} log-probs")
    return ids, values


ENGINE = VllmServerEngine()  # the instance the engine table serves (declared by distill.parts)
