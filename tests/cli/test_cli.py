"""The command line end to end on tiny models: train with a recipe and flags, eval, plot."""

import json

import pytest

from distill.cli import main
from distill.evaluation.repetition import repetition
from tests.conftest import chat_rows


def test_train_eval_plot_commands(tmp_path, model_dirs, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"prompt": row["prompt"]}) + "\n" for row in chat_rows(3, seed=5)))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"teacher: {model_dirs['teacher']}\nstudent: {model_dirs['student']}\ndataset: {data}\n"
        f"eval_dataset: {heldout}\neval_split: train\nmax_steps: 3\nlogging_steps: 1\nmax_new_tokens: 6\n"
        "eval_max_new_tokens: 6\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 1\nprogress_bar: false\n"
    )
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--output-dir", str(run), "--beta", "0", "--lmbda", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "# Evaluation on 3 held-out prompts" in out and "Forward KL on teacher completions" in out
    config = (run / "config.yaml").read_text()
    assert "beta: 0.0" in config and "lmbda: 0.25" in config

    # Repetition of the greedy answers, the teacher's beside the student's before and after, over every prompt.
    run_report = json.loads((run / "eval" / "eval.json").read_text())
    teacher_answers = [example["teacher"] for example in run_report["examples"]]
    assert run_report["teacher"]["repetition"] == repetition(teacher_answers)  # eval_examples (3) = every prompt
    for name in ("before", "after"):
        answers = [example[f"student_{name}"] for example in run_report["examples"]]
        assert run_report["metrics"][name]["repetition"] == repetition(answers)
    eval_md = (run / "eval" / "eval.md").read_text()
    assert "Repetition of the greedy answers" in eval_md and "Repetition of the answers sampled at temperature 1" in eval_md
    # And of the samples at temperature 1 (the student's own, the teacher's): 3 answers each, every prompt.
    assert run_report["teacher"]["sampled_repetition"]["answers"] == 3
    assert all(run_report["metrics"][name]["sampled_repetition"]["answers"] == 3 for name in ("before", "after"))

    assert main(["eval", str(run), "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["num_prompts"] == 3 and "student" in report["metrics"]
    after = json.loads((run / "eval" / "eval.json").read_text())["metrics"]["after"]["on_teacher_completions"]
    assert report["metrics"]["student"]["on_teacher_completions"]["forward_kl"] == after["forward_kl"]

    # A bare student directory has no run config: the teacher must be named, never assumed.
    capsys.readouterr()
    assert main(["eval", str(run / "model"), "--dataset", str(heldout), "--split", "train"]) == 2
    assert "--teacher" in capsys.readouterr().err
    bare = ["eval", str(run / "model"), "--teacher", str(model_dirs["teacher"]), "--dataset", str(heldout), "--split", "train",
            "--max-new-tokens", "6", "--out", str(tmp_path / "eval-bare")]
    assert main(bare) == 0
    bare_report = json.loads((tmp_path / "eval-bare" / "eval.json").read_text())
    assert bare_report["metrics"]["student"]["on_teacher_completions"]["forward_kl"] == after["forward_kl"]

    assert main(["plot", str(run)]) == 0
    assert (run / "plots" / "kl.png").is_file()

    assert main(["train", str(recipe), "--output-dir", str(run)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_eval_reports_a_missing_model_before_any_flag(tmp_path, capsys):
    """The first argument's problem comes first: a dataset whose split is wrong is not reported instead."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(4)))
    missing = tmp_path / "no-such-run"
    assert main(["eval", str(missing), "--teacher", str(tmp_path / "t"), "--dataset", str(data), "--split", "nope"]) == 2
    err = capsys.readouterr().err
    err = err[err.index("distill eval: error"):]  # after datasets' progress lines
    assert f"model: model path {missing} does not exist" in err and "split" in err
    assert err.index(f"model path {missing} does not exist") < err.index("split")  # every problem, the model's first
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text("method: gkd\n")
    assert main(["eval", str(unfinished), "--dataset", str(data), "--split", "nope"]) == 2
    assert "run directory without model/" in capsys.readouterr().err


def test_eval_of_a_server_run_talks_to_the_server_as_training_did(tmp_path, model_dirs, monkeypatch):
    """distill eval builds the server teacher from the run's own settings: concurrency, request size,
    timeout and retries (not the defaults)."""
    import shutil

    import yaml

    import distill.locations.server
    from distill.config import DistillConfig
    from distill.teachers.topk_client import ServerSettings

    run = tmp_path / "run"
    shutil.copytree(model_dirs["student"], run / "model")
    config = DistillConfig(student=str(model_dirs["student"]), teacher_url="http://127.0.0.1:9", teacher_concurrency=3,
                           teacher_request_size=5, teacher_timeout=7.5, teacher_retries=9, teacher_logprobs=11,
                           teacher_model_name="t", seq_kd=False, lmbda=1.0, lmbda_schedule="constant")
    (run / "config.yaml").write_text(yaml.safe_dump(config.to_dict()))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": row["prompt"]}) + "\n" for row in chat_rows(3)))
    seen = []

    class Stop(Exception):
        pass

    def capture(settings, *args, **kwargs):
        seen.append(settings)
        raise Stop

    monkeypatch.setattr(distill.locations.server, "server_teacher", capture)
    with pytest.raises(Stop):
        main(["eval", str(run), "--dataset", str(data), "--split", "train"])
    assert seen == [ServerSettings("http://127.0.0.1:9", 11, "t", 3, 5, 7.5, 9)]


def test_distills_info_lines_follow_sys_stderr_when_it_is_swapped(monkeypatch):
    """The handler `main` installs writes to the current sys.stderr: one made under an earlier (now closed)
    stderr, as in a test session that ran the CLI before, does not fail with 'I/O operation on closed file'."""
    import io
    import logging

    from distill.cli import show_progress_notes

    logger = logging.getLogger("distill")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logger.level)
    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    show_progress_notes()
    first.close()
    second = io.StringIO()
    monkeypatch.setattr("sys.stderr", second)
    logging.getLogger("distill.probe").info("a line")
    assert second.getvalue() == "distill: a line\n"
