"""Offline teacher caches: format, resume, checksums, settings checks, training from them, routing."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch

from distill.commands.cache_teacher import CacheJob, run_cache_teacher
from distill.objectives import DivergenceObjective, StepContext
from distill.objectives.student import student_loss
from distill.teachers import LocalTeacher
from distill.teachers.cache import TeacherCache, pack_ids, unpack_ids
from distill.teachers.hidden import (
    backbone_hidden,
    completion_targets,
    predicting_positions,
)
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, train_tiny_tokenizer
from tests.helpers.training import make_config, with_holes
from tests.teachers.conftest import cache_rows
from tests.teachers.servers import serve_teacher

K = 8


def _job(model_dir, data_file, out, **overrides) -> CacheJob:
    values = dict(teacher=str(model_dir) if model_dir is not None else None, teacher_url=None, tokenizer=None, dataset=str(data_file), split="train", top_k=K,
                  out=str(out), max_new_tokens=12, max_prompt_length=48, shard_size=4, batch_size=3, progress=False, device="cpu")
    return CacheJob(**{**values, **overrides})


@pytest.fixture(scope="module")
def cache_dir(model_dirs, data_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "teacher"
    run_cache_teacher(_job(model_dirs["teacher"], data_file, out))
    return out


@pytest.mark.parametrize("nbytes, high", [(2, 1 << 16), (3, 1 << 24)])
def test_id_packing_round_trips(nbytes, high):
    ids = np.random.default_rng(0).integers(0, high, size=(7, 5))
    packed = pack_ids(ids, nbytes)
    assert packed.dtype == np.uint8 and packed.shape == (7, 5, nbytes)
    assert np.array_equal(unpack_ids(packed), ids)


def test_cache_holds_the_teachers_top_k_within_the_byte_budget(cache_dir, model_dirs, tokenizer):
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["shards"]) == 3 and manifest["num_examples"] == 10
    assert manifest["token_bytes_per_token"] == 4 * K + 6 <= 6 * K + 4  # 16-bit ids (V = 320)
    headers = sum(s["bytes"] - s["token_bytes"] for s in manifest["shards"])
    assert headers / len(manifest["shards"]) < 2000  # per-file overhead, amortised over real shard sizes
    cache = TeacherCache(cache_dir)

    from transformers import AutoModelForCausalLM

    from distill.batch import Completion, collate
    from distill.rendering import TextRenderer

    model = AutoModelForCausalLM.from_pretrained(model_dirs["teacher"], dtype=torch.float32)
    encoder = TextRenderer(tokenizer, 48, 12, [tokenizer.eos_token_id])
    row = cache_rows()[5]
    entry = cache.get(5)
    prompt = encoder.prompt_ids(row["prompt"])[0]
    assert entry.tokens.tolist() == encoder.completion_ids(row["completion"]) and entry.tokens.dtype == torch.long
    batch = collate([Completion(prompt, entry.tokens.tolist(), "dataset")], "dataset", tokenizer.pad_token_id)
    with torch.no_grad():
        hidden = backbone_hidden(model, batch.input_ids, batch.attention_mask)[:, :-1][predicting_positions(batch.completion_mask)]
        log_p = torch.log_softmax(model.lm_head(hidden).double(), -1)
    top = log_p.topk(K, dim=1)
    assert torch.equal(entry.topk_ids, top.indices)
    torch.testing.assert_close(entry.topk_logprobs.double(), top.values, atol=1e-2, rtol=2e-3)  # float16 storage
    targets = completion_targets(batch.input_ids, batch.completion_mask)
    torch.testing.assert_close(entry.token_logprobs.double(), log_p.gather(1, targets[:, None]).squeeze(1), atol=1e-2, rtol=2e-3)
    rest = log_p.exp().scatter(1, top.indices, 0.0).scatter(1, targets[:, None], 0.0).sum(1).log()
    torch.testing.assert_close(entry.tail_logprobs.double(), rest, atol=1e-2, rtol=2e-3)


def test_rerun_skips_complete_shards_and_rewrites_missing_or_corrupt_ones(model_dirs, data_file, tmp_path, monkeypatch):
    out = tmp_path / "cache"
    run_cache_teacher(_job(model_dirs["teacher"], data_file, out))
    original = {p.name: p.read_bytes() for p in out.glob("shard-*")}
    import distill.commands.cache_teacher as module

    written = []
    real_write = module.write_shard
    monkeypatch.setattr(module, "write_shard", lambda directory, index, *a: written.append(index) or real_write(directory, index, *a))
    run_cache_teacher(_job(model_dirs["teacher"], data_file, out))
    assert written == []

    (out / "shard-00001.safetensors").unlink()
    corrupt = bytearray(original["shard-00002.safetensors"])
    corrupt[-3] ^= 0xFF
    (out / "shard-00002.safetensors").write_bytes(bytes(corrupt))
    with pytest.raises(ValueError, match="shard-00001.*missing or corrupt"):
        TeacherCache(out)
    run_cache_teacher(_job(model_dirs["teacher"], data_file, out))
    assert written == [1, 2]
    assert {p.name: p.read_bytes() for p in out.glob("shard-*")} == original  # deterministic rewrite
    TeacherCache(out)


def test_run_interrupted_inside_its_first_shard_resumes(model_dirs, data_file, tmp_path, monkeypatch):
    """The manifest is written before the first shard, so a half-written first shard leaves a resumable cache
    (not a directory that `cache-teacher` refuses as "not a teacher cache")."""
    import distill.commands.cache_teacher as module

    out = tmp_path / "cache"
    real_write = module.write_shard

    def interrupted(directory, index, *args):
        (directory / f".shard-{index:05d}.safetensors.tmp").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_cache_teacher(_job(model_dirs["teacher"], data_file, out))
    monkeypatch.setattr(module, "write_shard", real_write)
    assert run_cache_teacher(_job(model_dirs["teacher"], data_file, out))["complete"]
    assert TeacherCache(out).get(9).tokens.numel() > 0


def test_corrupt_shard_is_detected_by_checksum(cache_dir, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(cache_dir, copy)
    data = bytearray((copy / "shard-00000.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / "shard-00000.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt.*re-run"):
        TeacherCache(copy)


def test_rerun_with_other_settings_is_refused_and_keeps_the_cache(cache_dir, model_dirs, data_file):
    before = (cache_dir / "manifest.json").read_text()
    with pytest.raises(ValueError, match="other settings.*top_k"):
        run_cache_teacher(_job(model_dirs["teacher"], data_file, cache_dir, top_k=K + 1))
    assert (cache_dir / "manifest.json").read_text() == before


def test_run_rejects_a_cache_of_another_tokenizer_k_or_temperature(cache_dir, tokenizer):
    cache = TeacherCache(cache_dir)
    cache.check_run(tokenizer, K, 1.0, 48, 12)
    with pytest.raises(ValueError, match="top_k 8.*teacher_logprobs"):
        cache.check_run(tokenizer, K * 2, 1.0, 48, 12)
    with pytest.raises(ValueError, match="temperature 1.0.*set temperature"):
        cache.check_run(tokenizer, K, 2.0, 48, 12)
    with pytest.raises(ValueError, match="another tokenizer"):
        cache.check_run(train_tiny_tokenizer(600), K, 1.0, 48, 12)
    with pytest.raises(ValueError, match="max_new_tokens 12.*set max_new_tokens"):
        cache.check_run(tokenizer, K, 1.0, 48, 16)


def _offline_config(tmp_path, cache, **overrides):
    values = {"method": "gkd", "teacher_cache": str(cache), "lmbda": 0.0, "teacher_logprobs": K, "max_new_tokens": 12, **overrides}
    return make_config(tmp_path, **values)


def test_offline_training_reads_the_cache(cache_dir, model_dirs, data_file, tmp_path):
    config = _offline_config(tmp_path, cache_dir, max_steps=3)
    config.student = str(model_dirs["student"])
    distiller = Distiller(config, train_dataset=datasets.load_dataset("json", data_files=str(data_file), split="train"))
    before = {k: v.clone() for k, v in distiller.student_model.state_dict().items()}
    result = distiller.train()
    after = distiller.parts.with_student.current().state_dict()
    assert result["steps"] == 3 and np.isfinite(result["train"]["loss"]) and result["train"]["loss"] > 0
    assert not all(torch.equal(before[k], after[k]) for k in before)

    from distill.cli import main

    assert main(["eval", str(tmp_path / "run"), "--dataset", str(data_file), "--split", "train"]) == 2  # no teacher to score


def test_offline_run_refuses_another_dataset(cache_dir, model_dirs, tmp_path):
    config = _offline_config(tmp_path, cache_dir)
    config.student = str(model_dirs["student"])
    other = datasets.Dataset.from_list(chat_rows(10, seed=3))
    with pytest.raises(ValueError, match="another prompt than the one the cache scored"):
        Distiller(config, train_dataset=other)


def test_offline_loss_at_k_equals_vocab_matches_the_dense_loss(model_dirs, data_file, tokenizer, tmp_path):
    """A cache with K = V holds the whole distribution: the offline loss equals the local teacher's (to float16)."""
    vocab = len(tokenizer)
    out = tmp_path / "full"
    run_cache_teacher(_job(model_dirs["teacher"], data_file, out, top_k=vocab))
    config = _offline_config(tmp_path, out, teacher_logprobs=vocab)
    config.student = str(model_dirs["student"])
    distiller = Distiller(config, train_dataset=datasets.load_dataset("json", data_files=str(data_file), split="train"))
    mb = distiller.rollout.take(0, {})[0]

    from transformers import AutoModelForCausalLM

    local = LocalTeacher(AutoModelForCausalLM.from_pretrained(model_dirs["teacher"], dtype=torch.float32), vocab,
                         [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    objective = DivergenceObjective.constant(0.5, 1.0, 16)

    def loss(batch, signal):
        return student_loss(distiller.student_model, vocab, batch, signal, objective, StepContext("dataset"))

    for batch in (mb, with_holes(mb, tokenizer.pad_token_id)):  # a mask with holes reads the same cache
        with torch.no_grad():
            offline, dense = loss(batch, distiller.teacher.score(batch, 1.0)), loss(batch, local.score(batch, 1.0))
        assert float(offline.num_tokens) == float(dense.num_tokens) == batch.num_completion_tokens
        torch.testing.assert_close(offline.loss_sum, dense.loss_sum, rtol=1e-2, atol=1e-3)


def test_several_teachers_are_routed_by_teacher_id_with_per_teacher_metrics(cache_dir, model_dirs, data_file, tmp_path):
    other = tmp_path / "other-teacher"
    run_cache_teacher(_job(model_dirs["student"], data_file, other))  # a second, different teacher
    config = _offline_config(tmp_path, f"a={cache_dir},b={other}", max_steps=2)
    config.student = str(model_dirs["student"])
    rows = datasets.load_dataset("json", data_files=str(data_file), split="train")
    distiller = Distiller(config, train_dataset=rows)
    distiller.train()
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["loss/teacher/a"] > 0
    # The student starts as teacher b's model: far closer to b than to a.
    assert record["loss/teacher/b"] < 0.5 * record["loss/teacher/a"]

    config = _offline_config(tmp_path / "x", f"a={cache_dir},c={other}")
    config.student = str(model_dirs["student"])
    with pytest.raises(ValueError, match="teacher_id 'b' is not one of"):
        Distiller(config, train_dataset=rows)


def test_generated_completions_are_the_teachers_and_reproducible(model_dirs, data_file, tokenizer, tmp_path):
    first = run_cache_teacher(_job(model_dirs["teacher"], data_file, tmp_path / "g1", generate=True))
    second = run_cache_teacher(_job(model_dirs["teacher"], data_file, tmp_path / "g2", generate=True))
    assert [s["sha256"] for s in first["shards"]] == [s["sha256"] for s in second["shards"]]
    assert first["completions"].startswith("generated")
    cache = TeacherCache(tmp_path / "g1")

    from transformers import AutoModelForCausalLM

    from distill.rendering import TextRenderer

    # The stored log-probs are the teacher's at the generated tokens: recomputed here from its logits, in float64.
    model = AutoModelForCausalLM.from_pretrained(model_dirs["teacher"], dtype=torch.float32)
    encoder = TextRenderer(tokenizer, 48, 12, [tokenizer.eos_token_id])
    for i, row in enumerate(cache_rows()):
        entry = cache.get(i)
        tokens = entry.tokens.tolist()
        assert entry.tokens.dtype == torch.long and 0 < len(tokens) <= 12
        assert tokens != encoder.completion_ids(row["completion"])[: len(tokens)]  # sampled, not the dataset's answer
        prompt = encoder.prompt_ids(row["prompt"])[0]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        log_p = torch.log_softmax(logits.double(), -1)
        top = log_p.topk(K, dim=1)
        assert torch.equal(entry.topk_ids, top.indices)
        torch.testing.assert_close(entry.topk_logprobs.double(), top.values, atol=1e-2, rtol=2e-3)  # float16 storage
        torch.testing.assert_close(entry.token_logprobs.double(), log_p.gather(1, entry.tokens[:, None]).squeeze(1), atol=1e-2, rtol=2e-3)
        rest = log_p.exp().scatter(1, top.indices, 0.0).scatter(1, entry.tokens[:, None], 0.0).sum(1).log()
        torch.testing.assert_close(entry.tail_logprobs.double(), rest, atol=1e-2, rtol=2e-3)


def test_cache_through_a_server_matches_the_local_cache(cache_dir, model_dirs, data_file, tmp_path):
    from tests.teachers.servers import FaultProxy

    with serve_teacher(model_dirs["teacher"]) as (url, _):
        manifest = run_cache_teacher(_job(None, data_file, tmp_path / "served", teacher_url=url, tokenizer=str(model_dirs["teacher"])))
        with FaultProxy(url, [], ignore_temperature=True) as stock_vllm_like:
            with pytest.raises(ValueError, match="ignores prompt_logprobs_temperature"):
                run_cache_teacher(_job(None, data_file, tmp_path / "t2", teacher_url=stock_vllm_like.url,
                                       tokenizer=str(model_dirs["teacher"]), temperature=2.0))
    assert manifest["teacher"] == url
    local, served = TeacherCache(cache_dir), TeacherCache(tmp_path / "served")
    for i in range(10):
        a, b = local.get(i), served.get(i)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.topk_ids, b.topk_ids)
        torch.testing.assert_close(a.topk_logprobs, b.topk_logprobs, atol=2e-3, rtol=0)
        torch.testing.assert_close(a.tail_logprobs, b.tail_logprobs, atol=2e-2, rtol=0)


def test_cli_writes_a_cache(model_dirs, data_file, tmp_path, capsys):
    from distill.cli import main

    code = main(["cache-teacher", "--teacher", str(model_dirs["teacher"]), "--dataset", str(data_file), "--top-k", "4",
                 "--out", str(tmp_path / "c"), "--max-prompt-length", "48", "--no-progress", "--device", "cpu"])
    assert code == 0 and "bytes/token" in capsys.readouterr().out
    assert TeacherCache(tmp_path / "c").top_k == 4


def _rank_with_a_failing_teacher(rank, world_size, cache_dir, student_dir, data_file, out):
    from distill import DistillConfig
    from distill.errors import TeacherServerError

    config = DistillConfig(method="gkd", teacher_cache=cache_dir, student=student_dir, dataset=data_file, lmbda=0.0,
                           lmbda_schedule="constant", seq_kd=False, eval_before_after=False, progress_bar=False,
                           teacher_logprobs=K, max_new_tokens=12, max_prompt_length=48, per_device_train_batch_size=2,
                           gradient_accumulation_steps=1, max_steps=3, save_steps=0, output_dir=out)
    distiller = Distiller(config)
    if rank == 1:
        def down(*args, **kwargs):
            raise TeacherServerError("rank 1's teacher is down")

        distiller.teacher.score = down
    try:
        distiller.train()
        return "finished"
    except TeacherServerError as error:
        return str(error)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_teacher_failing_on_one_process_stops_every_process_with_a_checkpoint(cache_dir, model_dirs, data_file, tmp_path):
    """No process is left waiting in a collective: all agree on the failure, checkpoint together, and stop."""
    from distill.rundir.checkpoint import latest_checkpoint
    from tests.distributed import run_in_processes

    out = tmp_path / "run"
    first, second = run_in_processes(_rank_with_a_failing_teacher, world_size=2,
                                     args=(str(cache_dir), str(model_dirs["student"]), str(data_file), str(out)))
    assert "another process" in first and "checkpointed at step 0" in first
    assert "rank 1's teacher is down" in second and "checkpointed at step 0" in second
    assert latest_checkpoint(out) is not None


@pytest.mark.parametrize("state", ["missing", "empty", "manifest deleted", "manifest deleted, a foreign shard-named file"])
def test_every_fix_a_missing_manifest_error_suggests_works_when_followed(cache_dir, model_dirs, data_file, tmp_path, state):
    """The training-side error names the cache-teacher command that then succeeds, --overwrite included when
    the directory holds files; following it (with the flags filled in) writes a cache the run accepts."""
    import shlex
    import shutil

    from distill.cli import main

    out = tmp_path / "cache"
    if state == "empty":
        out.mkdir()
    elif state.startswith("manifest deleted"):
        shutil.copytree(cache_dir, out)
        (out / "manifest.json").unlink()
        if "foreign" in state:
            (out / "shard-00099.safetensors").write_text("my notes")
    with pytest.raises(ValueError, match="teacher_cache") as refused:
        TeacherCache(out)
    message = str(refused.value)
    command = shlex.split(message[message.index("`") + 1 : message.rindex("`")])
    assert ("--overwrite" in command) == state.startswith("manifest deleted")
    if "foreign" in state:
        assert "shard-00099.safetensors" in message and "move them away" in message
        (out / "shard-00099.safetensors").rename(tmp_path / "my-notes.txt")
    filled = {"MODEL": str(model_dirs["teacher"]), "DATASET": str(data_file), "K": str(K)}
    command = [filled.get(word, word) for word in command]
    assert command[:2] == ["distill", "cache-teacher"]
    assert main(command[1:] + ["--max-prompt-length", "48", "--max-new-tokens", "12", "--no-progress", "--device", "cpu"]) == 0
    assert TeacherCache(out).top_k == K


def test_a_cache_renders_prompts_with_the_runs_template_arguments(tmp_path):
    """`distill cache-teacher --chat-template-kwargs` renders the prompts as the run does: a run with the same arguments
    reads the cache, one without is refused naming them; a conversation trained in pieces (Qwen3's template) is
    refused, naming its row, since a cache holds one sequence per row."""
    from tests.conftest import tiny_lm
    from tests.conversations.conftest import family_tokenizer

    tokenizer, _ = family_tokenizer("qwen3")
    model_dir = tmp_path / "teacher"
    tiny_lm(len(tokenizer), layers=2, seed=1, eos_token_id=tokenizer.eos_token_id).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(4)))
    off = {"enable_thinking": False}
    cache = tmp_path / "cache"
    run_cache_teacher(_job(model_dir, data, cache, max_prompt_length=96, chat_template_kwargs=off))
    rows = datasets.load_dataset("json", data_files=str(data), split="train")
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)

    def run(name: str, **fields):
        config = _offline_config(tmp_path / name, cache, max_prompt_length=96, **fields)
        return Distiller(config, student=student, tokenizer=tokenizer, train_dataset=rows)

    run("same", chat_template_kwargs=off).setup()
    with pytest.raises(ValueError, match=r"another prompt than the one the cache scored \(.*chat_template_kwargs"):
        run("other").setup()
    conversation = [{"role": "user", "content": "2 + 3?"},
                    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                        "name": "calc", "arguments": {"expr": "2+3"}}}]},
                    {"role": "tool", "name": "calc", "content": "5"}, {"role": "assistant", "content": "5."}]
    data.write_text(json.dumps({"messages": conversation}) + "\n")
    with pytest.raises(ValueError, match=r"dataset row 0 is a conversation trained in pieces"):
        run_cache_teacher(_job(model_dir, data, tmp_path / "other", max_prompt_length=96, max_new_tokens=400))
