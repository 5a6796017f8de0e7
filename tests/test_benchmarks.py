"""The benchmarks' results say what they were measured with: every file of benchmarks/results/ has a `provenance`
entry (the commit, and the versions of the packages that shape its numbers, or "not recorded" for the files measured
before they were recorded), and every benchmark script writes its result through `benchmarks/provenance.py`."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from importlib import metadata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _provenance_module():
    spec = importlib.util.spec_from_file_location("benchmark_provenance", BENCHMARKS / "provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_result_file_records_its_commit_and_versions(path):
    """The file's provenance, and where it was built over several invocations that of each part (one entry per
    invocation that made the part, None for an invocation from before they were recorded, or "not recorded")."""
    data = json.loads(path.read_text())
    entry = data.get("provenance")
    assert isinstance(entry, dict), f"{path.name}: no provenance (write it with benchmarks/provenance.py's write_result)"
    for made_in in [entry, *[e for v in data.get("provenance_of_parts", {}).values() if v != "not recorded" for e in v
                             if e is not None]]:
        assert COMMIT.match(made_in.get("commit") or ""), f"{path.name}: provenance without a commit: {made_in}"
        versions = made_in.get("versions")
        if versions != "not recorded":
            assert isinstance(versions, dict) and versions.get("torch") and versions.get("transformers"), (path.name,
                                                                                                           versions)


def _scripts() -> list[Path]:
    """The benchmark scripts that write a result file: their docstring names benchmarks/results/."""
    return [p for p in sorted(BENCHMARKS.glob("*.py"))
            if "benchmarks/results/" in (ast.get_docstring(ast.parse(p.read_text())) or "") and p.name != "provenance.py"]


def test_every_benchmark_script_writes_its_result_with_provenance():
    scripts = _scripts()
    assert len(scripts) >= 20
    for path in scripts:
        tree = ast.parse(path.read_text())
        called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        assert called & {"write_result", "write_results"}, f"{path.name}: writes no result through write_result"
        for node in ast.walk(tree):  # a result file written around the helper: `out.write_text(json.dumps(...))`
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "write_text"
                    and node.args and "json.dumps" in ast.unparse(node.args[0])):
                target = ast.unparse(node.func.value)
                assert target not in ("out", "args.out", "Path(args.out)"), f"{path.name}: {ast.unparse(node)[:80]}"
    generation = (BENCHMARKS / "generation.py").read_text()
    assert "def write_results" in generation and "write_result(args.out" in generation  # vllm_generation's writer too


def test_write_result_adds_the_installed_versions_and_the_commit(tmp_path):
    provenance = _provenance_module()
    path = provenance.write_result(tmp_path / "sub" / "r.json", {"seconds": 1.5, "provenance": "stale"})
    data = json.loads(path.read_text())
    assert data["seconds"] == 1.5
    entry = data["provenance"]
    assert entry["versions"]["torch"] == metadata.version("torch")
    assert entry["versions"]["transformers"] == metadata.version("transformers")
    assert entry["versions"]["vllm"] is None or isinstance(entry["versions"]["vllm"], str)
    assert entry["commit"] is None or COMMIT.match(entry["commit"])
    assert set(entry["cpu"]) == {"model", "vector_isa", "torch_kernels"}
    with pytest.raises(TypeError, match="JSON object"):
        provenance.write_result(tmp_path / "list.json", [1, 2])


def test_the_processor_is_recorded_with_the_instruction_sets_that_pick_torchs_kernels(tmp_path):
    """Same packages, another processor: torch's CPU kernels (AVX2, AVX-512, AMX) round differently, so the
    processor is part of what a number was measured with."""
    provenance = _provenance_module()
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9654\nflags\t\t: fpu sse avx2 fma avx512f avx512_bf16\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 9654\nflags\t\t: fpu sse avx2 fma avx512f avx512_bf16\n")
    recorded = provenance.cpu_model(cpuinfo)
    assert recorded["model"] == "AMD EPYC 9654"
    assert recorded["vector_isa"] == ["avx2", "fma", "avx512f", "avx512_bf16"]
    assert recorded["torch_kernels"] == torch.backends.cpu.get_cpu_capability()  # torch is imported in this process
    missing = provenance.cpu_model(tmp_path / "absent")
    assert missing["vector_isa"] is None


def test_backfill_states_only_what_is_known(tmp_path, monkeypatch):
    """A file measured before provenance was recorded gets "not recorded" versions and its last commit, nothing
    invented; a file that has provenance is left as it is."""
    provenance = _provenance_module()
    old = RESULTS / "step.json"
    copy = tmp_path / "old.json"
    data = {k: v for k, v in json.loads(old.read_text()).items() if k != "provenance"}
    copy.write_text(json.dumps(data, indent=2))
    monkeypatch.setattr(provenance, "_git", lambda *args: "0" * 40)
    assert provenance.backfill([copy]) == [copy]
    entry = json.loads(copy.read_text())["provenance"]
    assert entry["versions"] == "not recorded" and entry["commit"] == "0" * 40
    before = copy.read_text()
    assert provenance.backfill([copy]) == [] and copy.read_text() == before


def _curves_module():
    import sys

    sys.path.insert(0, str(BENCHMARKS))  # curves.py imports its sibling scripts by name
    spec = importlib.util.spec_from_file_location("benchmark_curves", BENCHMARKS / "curves.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_resumed_run_keeps_the_wall_time_of_one_run(tmp_path):
    """A run stopped after its step-40 checkpoint and resumed 5000 s later: the step-60 checkpoint's time is the
    step-40 one's plus the time since the resumed invocation started, never the gap between the two."""
    import os

    curves = _curves_module()
    run_dir, first, second = tmp_path / "arm", 1_000_000.0, 1_005_000.0
    for step, written in ((20, first + 100), (40, first + 200), (60, second + 130)):
        state = run_dir / "checkpoints" / f"step-{step:06d}" / "state.json"
        state.parent.mkdir(parents=True)
        state.write_text(json.dumps({"step": step}))
        os.utime(state, (written, written))
    history = [{"start": first, "resumed_from": None}, {"start": second, "resumed_from": 40}]
    written = curves.checkpoint_seconds(run_dir, history)
    assert written == {20: 100.0, 40: 200.0, 60: 330.0}
    assert curves.seconds_since(history, written, second + 150) == 350.0
    assert curves.checkpoint_seconds(run_dir, history[:1]) == {20: 100.0, 40: 200.0, 60: 5130.0}  # one invocation


def test_a_part_keeps_the_environment_it_was_made_in():
    """A result written over several invocations: each part says what it was made with; a part reused from before
    this was recorded keeps an entry already given, or says it was not recorded, never the present environment."""
    provenance = _provenance_module()
    now = provenance.provenance()
    result: dict = {}
    provenance.record_part(result, "arms/gkd", [now])
    provenance.record_part(result, "arms/gkd", None)
    provenance.record_part(result, "arms/sft", None)
    assert result["provenance_of_parts"] == {"arms/gkd": [now], "arms/sft": "not recorded"}
    provenance.record_part(result, "arms/sft", [now, now])
    assert result["provenance_of_parts"]["arms/sft"] == [now, now]


def test_each_training_invocation_records_its_environment(tmp_path, monkeypatch):
    """train.json lists one environment per invocation of `distill train`: a run resumed from a checkpoint by a
    later invocation lists both (None for an invocation from before they were recorded)."""
    curves = _curves_module()
    commands, run = [], curves.subprocess.run  # one module: what provenance() runs goes through it too

    def not_training(command, *args, **kwargs):
        return commands.append(command) if command[1:4] == ["-m", "distill", "train"] else run(command, *args, **kwargs)

    monkeypatch.setattr(curves.subprocess, "run", not_training)
    (tmp_path / "fresh").mkdir()  # as `distill train` would make it
    record = curves.train(tmp_path / "fresh", ["--max_steps", "2"], resume=False)
    assert len(commands) == 1 and "--output_dir" in commands[0]
    (entry,) = record["provenance"]
    assert entry["versions"]["torch"] == metadata.version("torch") and entry["commit"] == _provenance_module()._git(
        "rev-parse", "HEAD")

    run_dir = tmp_path / "stopped"
    state = run_dir / "checkpoints" / "step-000020" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text("{}")
    (tmp_path / "stopped.invocations.json").write_text(json.dumps([{"start": 0.0, "resumed_from": None, "command": "-m distill train"}]))
    record = curves.train(run_dir, ["--max_steps", "40"], resume=True)
    assert "--resume" in commands[1]
    assert record["provenance"][0] is None and record["provenance"][1]["versions"] == entry["versions"]
    assert json.loads((run_dir / "train.json").read_text())["provenance"] == record["provenance"]


def test_an_invocation_that_failed_before_training_leaves_no_trace_in_the_history(tmp_path, monkeypatch):
    """A resumed `distill train` that fails at once (another run holds the directory) is dropped from the run's
    invocation history, so the checkpoints the live run writes later still count from that run's start."""
    import subprocess

    curves = _curves_module()
    run_dir = tmp_path / "arm"
    state = run_dir / "checkpoints" / "step-000006" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text("{}")
    os.utime(state, (1_000.0, 1_000.0))
    history = [{"start": 900.0, "resumed_from": None, "command": "-m distill train"},
               {"start": 1_100.0, "resumed_from": 6, "command": "-m distill train --resume"}]
    (tmp_path / "arm.invocations.json").write_text(json.dumps(history))
    run = curves.subprocess.run

    def locked(command, *args, **kwargs):
        if command[1:4] == ["-m", "distill", "train"]:
            raise subprocess.CalledProcessError(2, command)
        return run(command, *args, **kwargs)

    monkeypatch.setattr(curves.subprocess, "run", locked)
    with pytest.raises(subprocess.CalledProcessError):
        curves.train(run_dir, ["--max_steps", "60"], resume=True)
    assert json.loads((tmp_path / "arm.invocations.json").read_text()) == history


def test_reused_arms_keep_the_environment_they_were_measured_in(tmp_path):
    """sdft.py's and sdpo.py's arms: a part made now is written with its environment; --resume reads the part back
    with the environment it was made in (here an older one), not the present one."""
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("benchmark_arms", BENCHMARKS / "arms.py")
    arms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arms)
    table = {"sft": ("sft-run", ["--method", "sft"])}
    trained = []

    def train(run_dir, flags):
        run_dir.mkdir(parents=True, exist_ok=True)
        trained.append(flags)
        return {"steps": 3}

    parts: dict = {}
    first = arms.run_arms(tmp_path, table, False, lambda: {"accuracy": 0.1}, train, lambda d: {"accuracy": 0.5}, parts)
    assert first == {"before training": {"accuracy": 0.1}, "sft": {"steps": 3, "accuracy": 0.5}}
    now = parts["provenance_of_parts"]["results/sft"]
    assert now[0]["commit"] == _provenance_module()._git("rev-parse", "HEAD") and len(trained) == 1
    row = json.loads((tmp_path / "sft-run" / "bench_row.json").read_text())
    (tmp_path / "sft-run" / "bench_row.json").write_text(json.dumps({**row, "provenance": [{"commit": "0" * 40}]}))
    again: dict = {}
    assert arms.run_arms(tmp_path, table, True, lambda: {}, train, lambda d: {}, again) == first
    assert len(trained) == 1
    assert again["provenance_of_parts"] == {"results/before training": now, "results/sft": [{"commit": "0" * 40}]}


def test_rewarded_answers_count_the_right_sampled_answers_through_each_checkpoint(tmp_path):
    """A GRPO run's 0/1 rewards, 8 answers a step: each checkpoint row counts the answers rewarded through its step
    (a step logged twice, as after a resume, counted once); a run that logs no reward gets no such field."""
    curves = _curves_module()
    run_dir = tmp_path / "grpo"
    run_dir.mkdir()
    logged = [(1, 0.0), (2, 0.25), (2, 0.25), (3, 0.125), (4, 0.5)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": r}) + "\n" for s, r in logged))
    rows = [{"step": 0}, {"step": 2}, {"step": 4}]
    assert [r["rewarded_answers"] for r in curves.with_rewarded_answers(rows, run_dir, 8)] == [0, 2.0, 7.0]
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    assert curves.with_rewarded_answers(rows, run_dir, 8) == rows


def test_training_signal_is_the_mean_over_the_steps_since_the_previous_checkpoint(tmp_path):
    """Each checkpoint row's grad_norm_mean and forward_kl_mean: the mean over the steps after the previous row up to
    its own (a step logged twice, as after a resume, counted once; a key a step did not log left out of its mean); a
    run without metrics gets its rows back."""
    curves = _curves_module()
    run_dir = tmp_path / "on_policy"
    run_dir.mkdir()
    logged = [{"step": 1, "grad_norm": 4.0, "forward_kl": 20.0}, {"step": 2, "grad_norm": 9.0, "forward_kl": 30.0},
              {"step": 2, "grad_norm": 2.0, "forward_kl": 10.0}, {"step": 3, "grad_norm": 0.5},
              {"step": 4, "grad_norm": 1.5, "forward_kl": 2.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    rows = curves.with_training_signal([{"step": 2, "accuracy": 0.0}, {"step": 4, "accuracy": 0.5}], run_dir)
    assert rows == [{"step": 2, "accuracy": 0.0, "grad_norm_mean": 3.0, "forward_kl_mean": 15.0},
                    {"step": 4, "accuracy": 0.5, "grad_norm_mean": 1.0, "forward_kl_mean": 2.0}]
    assert curves.with_training_signal([{"step": 2}], tmp_path / "gone") == [{"step": 2}]


def test_mcnemar_p_value_is_the_exact_binomial_test_from_its_definition(monkeypatch):
    """bfcl.py's paired comparison against the definition: the probability, under a fair coin for each question only
    one arm answers right, of every split no more likely than the one observed."""
    from fractions import Fraction
    from math import comb

    monkeypatch.syspath_prepend(str(BENCHMARKS))  # bfcl.py imports its sibling scripts by name
    from bfcl import mcnemar_p_value

    for only_first in range(13):
        for only_second in range(13):
            n = only_first + only_second
            chance = [Fraction(comb(n, k), 2**n) for k in range(n + 1)]
            expected = sum(p for p in chance if p <= chance[only_first])
            assert mcnemar_p_value(only_first, only_second) == pytest.approx(float(expected), rel=1e-12)
    assert mcnemar_p_value(0, 0) == 1.0
    assert mcnemar_p_value(7, 11) == pytest.approx(0.480682373046875)
    assert mcnemar_p_value(0, 5) == pytest.approx(2 / 32)


def test_bfcl_arms_that_need_the_teacher_are_known_before_they_start(monkeypatch):
    """bfcl.py stops an arm that reads the trained teacher, with a message, when the teacher is not trained yet: every
    arm that scores with it and sft_teacher (its sampled answers), for both students and a repeated seed; grpo and
    the teacher itself do not need it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bfcl import arms, needs_teacher

    for student, seed in (("full", 0), ("dropped", 1)):
        table = arms(Path("data"), Path("runs"), 60, 20, student, seed)
        assert {name for name, flags in table.items() if needs_teacher(name, flags)} == {
            "sft_teacher", "on_policy", "on_policy_forward_kl", "gkd"}


def test_a_longer_bfcl_budget_keeps_the_one_teacher_and_its_own_runs_and_results(monkeypatch):
    """bfcl.py --steps N (N other than 60): the student arms train N steps in runs and a result file of their own, so
    the 60-step runs and bfcl_dropped.json are untouched, and the teacher is the same 60-step run for every budget."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bfcl import arms, results_path, run_dir

    default, longer = (arms(Path("data"), Path("runs"), steps, every, "dropped", 0) for steps, every in ((60, 20), (240, 60)))
    assert default["teacher"] == longer["teacher"]
    assert longer["gkd"][longer["gkd"].index("--max_steps") + 1] == "240"
    assert run_dir(Path("runs"), "teacher", "dropped", 0, 240) == Path("runs/teacher")
    assert run_dir(Path("runs"), "gkd", "dropped", 1) == Path("runs/dropped/seed1/gkd")
    assert run_dir(Path("runs"), "gkd", "dropped", 1, 240) == Path("runs/dropped/seed1/gkd_240steps")
    assert results_path("dropped", 60) == "benchmarks/results/bfcl_dropped.json"
    assert results_path("dropped", 240) == "benchmarks/results/bfcl_dropped_240steps.json"


def test_bfcls_own_scores_stay_with_a_row_whose_answers_are_gone(monkeypatch, tmp_path):
    """bfcl.py re-measuring some arms on a machine without the others' runs: a row whose answers file is gone keeps
    the "official" it was recorded with (nothing is run on it), a row whose answers have a report reads it, and one
    without a report gets none while the check is off."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bfcl import Official, official_report

    recorded = {"bfcl_accuracy": 0.5, "distill_accuracy": 0.5, "agreement": 1.0}
    gone = {"step": 0, "answers": str(tmp_path / "gone.jsonl"), "official": recorded}
    reported, unreported = tmp_path / "reported.jsonl", tmp_path / "unreported.jsonl"
    for answers in (reported, unreported):
        answers.write_text('{"id": "simple_python_0", "text": ""}\n')
    report = {"bfcl_accuracy": 0.25, "distill_accuracy": 0.25, "agreement": 0.75, "same_calls": 3,
              "same_calls_agreement": 1.0, "disagreements": [{"id": "simple_python_0"}]}
    official_report(reported).write_text(json.dumps(report))
    for check in (Official(run=False), Official(run=True)):
        rows = check.rows([gone, {"step": 20, "answers": str(reported)}])
        assert rows[0] == gone
        assert rows[1]["official"] == {**{k: report[k] for k in Official.KEYS}, "disagreements": 1,
                                       "report": str(official_report(reported))}
    assert "official" not in Official(run=False).rows([{"step": 40, "answers": str(unreported)}])[0]


def test_paired_comparisons_come_from_recorded_answers_when_the_files_are_gone(monkeypatch):
    """A pair whose arms both have right/wrong strings is counted from them (McNemar from its definition's counts);
    a pair with an arm missing keeps its recorded comparison, in either name order; a pair never recorded is left out."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bfcl import mcnemar_p_value, paired

    right = {"a": {"right": "1100"}, "b": {"right": "1010"}}
    recorded = {"c vs a": {"only_c": 1, "only_a": 2, "both": 0, "p_value": 1.0}}
    compared = paired(right, recorded)
    assert compared["a vs b"] == {"only_a": 1, "only_b": 1, "both": 1, "p_value": mcnemar_p_value(1, 1)}
    assert compared["a vs c"] == recorded["c vs a"]
    assert set(compared) == {"a vs b", "a vs c"}


def test_a_repeated_seed_is_compared_with_its_own_arms_and_the_one_teacher(monkeypatch):
    """bfcl.py's comparisons of a repeated seed: each arm's last row of that seed (not seed 0's), and the teacher's,
    which is trained once; a seed without an arm leaves it out."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bfcl import last_rows_of_seed

    def rows(tag: str) -> list[dict]:
        return [{"step": 0, "answers": f"{tag}/0"}, {"step": 60, "answers": f"{tag}/60"}]

    results = {"arms": {"teacher": rows("teacher"), "sft": rows("sft0"), "gkd": rows("gkd0")},
               "repeats": {"1": {"sft": {"rows": rows("sft1")}}, "2": {"sft": {"rows": rows("sft2")},
                                                                        "gkd": {"rows": rows("gkd2")}}}}
    assert last_rows_of_seed(results, "1") == {"teacher": {"step": 60, "answers": "teacher/60"},
                                               "sft": {"step": 60, "answers": "sft1/60"}}
    assert {name: row["answers"] for name, row in last_rows_of_seed(results, "2").items()} == {
        "teacher": "teacher/60", "sft": "sft2/60", "gkd": "gkd2/60"}
    del results["arms"]["teacher"]
    assert list(last_rows_of_seed(results, "1")) == ["sft"]
