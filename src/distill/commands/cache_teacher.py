"""`distill cache-teacher`: run a teacher over a dataset once and store its sparse log-probs on disk, or
(`--payload hidden`) its final hidden states and its lm_head, in float32, bfloat16 or int8 (`--hidden-dtype`).

The completions scored are the dataset's own, or, with `--generate`, ones the teacher samples (seeded per
shard, so a resumed run samples the same ones). The format is documented in `distill.teachers.cache`.
Re-running the same command resumes: complete shards whose checksum matches are skipped. A directory that
is not a cache (no manifest.json, or other settings) is refused; `--overwrite` rebuilds it from scratch,
deleting only the cache's own files (`distill.teachers.cache.cache_files`), never anything else there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distill.batch import Completion, collate
from distill.data import examples_from_dataset
from distill.data_files import data_root, load_dataset_spec
from distill.generation import SamplingParams
from distill.losses import DEFAULT_CHUNK_SIZE
from distill.losses.sparse import DEFAULT_MIN_TAIL_MASS, teacher_cells
from distill.models.kinds import model_kind_of
from distill.rendering import Renderer
from distill.seeds import cache_shard_seed, row_seeds
from distill.signals import DenseSignal, SparseSignal
from distill.teachers.cache import (
    FORMAT,
    HIDDEN_ARRAYS,
    MANIFEST,
    ONLY_CACHE_FILES,
    SETTING_KEYS,
    VERSION,
    HiddenShardRecords,
    ShardRecords,
    cache_files,
    id_bytes_for,
    prompt_crc,
    sha256_file,
    shard_name,
    tokenizer_hash,
    write_head,
    write_manifest,
    write_shard,
)
from distill.teachers.head import head_fingerprint
from distill.teachers.hidden import completion_targets
from distill.teachers.topk import TopK, topk_log_probs
from distill.training.runtime import eval_device
from distill.training.teacher_assembly import Comparison


@dataclass
class CacheJob:
    teacher: str | None
    teacher_url: str | None
    tokenizer: str | None
    dataset: str
    split: str
    top_k: int | None
    out: str
    temperature: float | None = 1.0
    generate: bool = False
    max_new_tokens: int = 48
    max_prompt_length: int = 256
    shard_size: int = 256
    batch_size: int = 8
    seed: int = 42
    sampling_temperature: float = 1.0
    device: str = "auto"
    progress: bool = True
    overwrite: bool = False
    payload: str = "topk"
    hidden_dtype: str = "float32"
    chat_template_kwargs: dict | None = None  # the student's template arguments (the run's chat_template_kwargs)


def sparse_top_k(signal, batch, k: int, temperature: float) -> TopK:
    """The cacheable top-k of any teacher signal: exact from a dense one, tail derived for a sparse one."""
    if isinstance(signal, DenseSignal):
        targets = completion_targets(batch.input_ids, batch.completion_mask)
        return topk_log_probs(signal.hidden.float(), signal.head, targets.to(signal.hidden.device), k, temperature, DEFAULT_CHUNK_SIZE)
    if isinstance(signal, SparseSignal):
        targets = completion_targets(batch.input_ids, batch.completion_mask).to(signal.topk_ids.device)
        # The loss's own coarsening gives the tail: 1 - (top-k + token) mass, floored; its last cell.
        _, cells, _ = teacher_cells(signal.topk_ids, signal.topk_log_probs, targets, signal.sampled_log_probs, None,
                                    True, DEFAULT_MIN_TAIL_MASS)
        return TopK(signal.topk_ids, signal.topk_log_probs, signal.sampled_log_probs, cells[:, -1])
    raise TypeError(f"cannot cache a {type(signal).__name__}")


@dataclass
class OpenTeacher:
    """The teacher a cache is written from: `name` (its model or URL, for the manifest), the `tokenizer` the
    cache is for, its `model` here (None for a server) and what it is built against (`against`)."""

    teacher: Any  # a LocalTeacher or a server's (its `head` and `device` are read for the hidden payload)
    tokenizer: Any
    name: str
    model: Any
    against: Comparison


def _open_teacher(job: CacheJob, device: torch.device) -> OpenTeacher:
    """A local model or a server, built by their teacher locations as training builds them
    (`distill.training.teacher_assembly`, purpose CACHE), for a run whose tokenizer is the teacher's own (a model) or
    `--tokenizer` (a server)."""
    from distill.config import DistillConfig
    from distill.locations import CACHE, location_of
    from distill.methods import get_method
    from distill.models import DEFAULT_TEACHER, check_context, load_tokenizer, resolve_model_source
    from distill.training.teacher_assembly import assemble_teachers, comparison

    # The default method, a same-tokenizer one: the cache holds the teacher's own top-k or hidden states.
    method = get_method(DistillConfig().method)
    remote = {} if job.teacher_url is None else (
        {"teacher_payload": "hidden"} if job.payload == "hidden" else {"teacher_logprobs": job.top_k})
    config = DistillConfig(method=method.name, teacher=job.teacher or DEFAULT_TEACHER, teacher_url=job.teacher_url,
                           temperature=job.temperature or 1.0, max_prompt_length=job.max_prompt_length,
                           max_new_tokens=job.max_new_tokens, **remote)
    location = location_of(config, method)
    if job.generate and not location.samples:
        raise ValueError(f"--generate needs a local --teacher model: a {location.name} teacher only scores")
    source = location.model_source(config, None)
    model, tokenizer = location.load_model(source, device, method) if source is not None else (None, None)
    if model is None:
        if not job.tokenizer:
            raise ValueError("--tokenizer: with --teacher-url give the tokenizer the cache is for (a model directory or .gguf)")
        tokenizer = load_tokenizer(resolve_model_source(job.tokenizer, "tokenizer"))
    else:
        check_context(model, "teacher", {"--max-prompt-length": job.max_prompt_length, "--max-new-tokens": job.max_new_tokens})
    # A server that ignores the temperature (stock vLLM) would fill a cache labelled with the wrong one.
    probe = tokenizer("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)["input_ids"]
    against = comparison(method, tokenizer, None, model, tokenizer)  # the cache is for the teacher's own tokenizer
    teacher = assemble_teachers(location, CACHE, config, method, tokenizer, against, device, probe_ids=probe,
                                temperature=config.temperature, teacher_model=model, teacher_tokenizer=tokenizer).train
    return OpenTeacher(teacher, tokenizer, job.teacher_url or job.teacher, model, against)


def run_cache_teacher(job: CacheJob) -> dict:
    """Write (or finish) the cache; returns the manifest."""
    if (job.teacher is None) == (job.teacher_url is None):
        raise ValueError("give exactly one of --teacher MODEL and --teacher-url URL")
    _check_payload(job)
    if job.shard_size < 1 or job.batch_size < 1:
        raise ValueError("--shard-size and --batch-size must be >= 1")
    out = Path(job.out)
    _check_out(out, job.overwrite)
    examples = examples_from_dataset(load_dataset_spec(job.dataset, job.split, "dataset"), "dataset", data_root(job.dataset))
    if not job.generate:
        missing = [e.index for e in examples if not e.has_completion]
        if missing:
            raise ValueError(f"dataset row {missing[0]} (and {len(missing) - 1} more) has no completion; add a 'completion' "
                             "column or pass --generate to let the teacher write them")
    device = eval_device(job.device)
    opened = _open_teacher(job, device)
    teacher, tokenizer, teacher_name = opened.teacher, opened.tokenizer, opened.name
    eos_ids, vocab = opened.against.eos_ids, opened.against.vocab_size
    encoder = model_kind_of(opened.model).encoder(tokenizer, job.max_prompt_length, job.max_new_tokens, eos_ids,
                                                  opened.model, job.chat_template_kwargs)
    head = teacher.head if job.payload == "hidden" else None
    settings = {"teacher": teacher_name, "tokenizer_hash": tokenizer_hash(tokenizer), "vocab_size": vocab, "top_k": job.top_k,
                "temperature": job.temperature, "max_prompt_length": job.max_prompt_length, "max_new_tokens": job.max_new_tokens,
                "completions": f"generated (temperature {job.sampling_temperature})" if job.generate else "dataset",
                "dataset": str(job.dataset), "split": job.split, "shard_size": job.shard_size, "num_examples": len(examples),
                "seed": job.seed, "payload": job.payload,
                "hidden_dtype": job.hidden_dtype if head is not None else None,
                "head_sha256": head_fingerprint(head) if head is not None else None}
    manifest: dict[str, Any] = {"format": FORMAT, "version": VERSION, **settings, "id_bytes": id_bytes_for(vocab), "shards": [], "complete": False}
    if head is not None:
        manifest["hidden_size"] = head.weight.shape[1]
    if job.overwrite:
        if out.is_dir():
            _check_out(out, True)  # again, just before deleting: the teacher took a while to load
            for path in cache_files(out)[0]:
                path.unlink()
    elif (out / MANIFEST).is_file():
        import json

        existing = json.loads((out / MANIFEST).read_text())
        differing = [k for k in SETTING_KEYS if existing.get(k, "topk" if k == "payload" else None) != settings[k]]
        if differing:
            shown = ", ".join(f"{k}: {existing.get(k)!r} vs {settings[k]!r}" for k in differing)
            raise ValueError(f"--out {out} holds a cache made with other settings ({shown}); re-run with the same settings "
                             f"to resume it, choose another --out, or pass --overwrite to rebuild it ({ONLY_CACHE_FILES})")
        manifest["shards"] = existing["shards"]
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MANIFEST).is_file():
        write_manifest(out, manifest)  # before the first shard: a run interrupted inside it still resumes
    if head is not None:
        manifest["head"] = write_head(out, head)
        write_manifest(out, manifest)

    num_shards = math.ceil(len(examples) / job.shard_size)
    done = {s["file"]: s for s in manifest["shards"] if (out / s["file"]).is_file() and sha256_file(out / s["file"]) == s["sha256"]}
    progress = None
    if job.progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=len(examples), desc="cache-teacher", unit="ex", dynamic_ncols=True)
    entries = []
    for shard in range(num_shards):
        name = shard_name(shard)
        part = examples[shard * job.shard_size : (shard + 1) * job.shard_size]
        if name in done:
            entries.append(done[name])
        else:
            records = _score_shard(job, shard, part, teacher, encoder, tokenizer.pad_token_id, eos_ids)
            hidden = (job.hidden_dtype, head.weight.shape[1]) if head is not None else None
            entries.append(write_shard(out, shard, records, manifest["id_bytes"], job.top_k, hidden))
            manifest["shards"] = sorted(entries + [s for s in manifest["shards"] if s["file"] not in {e["file"] for e in entries}],
                                        key=lambda s: s["file"])
            write_manifest(out, manifest)
        if progress is not None:
            progress.update(len(part))
    if progress is not None:
        progress.close()
    manifest["shards"] = entries
    manifest["tokens"] = sum(e["tokens"] for e in entries)
    manifest["bytes"] = sum(e["bytes"] for e in entries)
    manifest["bytes_per_token"] = manifest["bytes"] / max(manifest["tokens"], 1)
    manifest["token_bytes_per_token"] = sum(e["token_bytes"] for e in entries) / max(manifest["tokens"], 1)
    manifest["complete"] = True
    write_manifest(out, manifest)
    return manifest




def _check_payload(job: CacheJob) -> None:
    """--top-k and --temperature belong to a top-k cache; hidden states hold neither (the loss applies any)."""
    if job.payload not in ("topk", "hidden"):
        raise ValueError(f"--payload must be topk or hidden, got {job.payload!r}")
    if job.payload == "hidden":
        if job.top_k is not None or job.temperature is not None:
            raise ValueError("--top-k and --temperature: a hidden-state cache keeps the teacher's hidden states and head, "
                             "which give the full distribution at any temperature; drop them")
        if job.hidden_dtype not in HIDDEN_ARRAYS:
            raise ValueError(f"--hidden-dtype must be one of {sorted(HIDDEN_ARRAYS)}, got {job.hidden_dtype!r}")
        return
    if job.hidden_dtype != "float32":
        raise ValueError("--hidden-dtype is read with --payload hidden only")
    if job.top_k is None or job.top_k < 1:
        raise ValueError("--top-k K (>= 1): the log-probs kept per token (or --payload hidden)")
    if job.temperature is None:
        job.temperature = 1.0
    if not job.temperature > 0:
        raise ValueError("--temperature must be > 0")


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse an --out that is not (or not only) a teacher cache, before anything is loaded, with the way out."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory; choose a directory for the cache")
    own, foreign = cache_files(out)
    if foreign:
        names = ", ".join(p.name for p in foreign)
        raise ValueError(f"--out {out} holds {names}, named like the cache's files but not written by cache-teacher; "
                         "move them away or choose another directory (--overwrite never deletes them)")
    if overwrite or (out / MANIFEST).is_file() or not any(out.iterdir()):
        return
    if own:
        raise ValueError(f"--out {out} exists and is not a teacher cache: it holds {len(own)} cache file(s) but no {MANIFEST} "
                         f"(deleted?); pass --overwrite to rebuild it ({ONLY_CACHE_FILES}), or choose another directory")
    raise ValueError(f"--out {out} exists and is not a teacher cache; choose another directory, or pass --overwrite to "
                     f"write the cache next to what is there ({ONLY_CACHE_FILES})")


def _score_shard(job: CacheJob, shard: int, examples, teacher, encoder: Renderer, pad_id: int, eos_ids) -> ShardRecords:
    encoded = [encoder.row(e) for e in examples]
    split = next((e.index for e, row in zip(examples, encoded) if row.later), None)
    if split is not None:
        raise ValueError(f"dataset row {split} is a conversation trained in pieces (its chat template re-renders its "
                         "history), and a cache holds one sequence per row; score it with a teacher model or server, or "
                         "pass --chat-template-kwargs (or a template) that keeps earlier turns as they were")
    prompts, extras = [row.prompt_ids for row in encoded], [row.extras for row in encoded]
    if job.generate:
        sampling = SamplingParams(job.sampling_temperature, 1.0, 0, job.max_new_tokens)
        with torch.random.fork_rng(devices=[teacher.device] if teacher.device.type == "cuda" else []):
            torch.manual_seed(cache_shard_seed(job.seed, shard))
            seeds = row_seeds(len(prompts), job.seed, "cache", shard)
            completions = [sample.ids for sample in teacher.generate(prompts, sampling, job.batch_size, seeds=seeds, extras=extras)]
    else:
        # Every token is scored (a conversation's tool turns too): a run selects the ones it trains on.
        completions = [list(row.completion_ids or []) for row in encoded]
    records = ShardRecords.empty() if job.payload == "topk" else HiddenShardRecords.empty()
    for start in range(0, len(examples), job.batch_size):
        part = slice(start, start + job.batch_size)
        rows = [Completion(p, c, "cache", example=e, extras=x)
                for p, c, e, x in zip(prompts[part], completions[part], examples[part], extras[part])]
        batch = collate(rows, "cache", pad_id)
        device = teacher.device
        signal = teacher.score(batch.to(device), job.temperature or 1.0)
        if job.payload == "hidden":
            position = 0
            for row in rows:
                n = len(row.completion_ids)
                records.add(row.example.index, prompt_crc(row.prompt_ids, row.example.images), np.asarray(row.completion_ids, dtype=np.int64),
                            signal.hidden[position : position + n])
                position += n
            continue
        top = sparse_top_k(signal, batch, job.top_k, job.temperature)
        position = 0
        for row in rows:
            n = len(row.completion_ids)
            span = slice(position, position + n)
            records.add(row.example.index, prompt_crc(row.prompt_ids, row.example.images), np.asarray(row.completion_ids, dtype=np.int64),
                        top.ids[span].cpu().numpy(), top.log_probs[span].cpu().numpy(), top.target_log_probs[span].cpu().numpy(),
                        top.tail_log_probs[span].cpu().numpy())
            position += n
    return records
