"""`scripts/bfcl_agreement.py`, distill's side of `bfcl_official_check.sh`: a run's saved answers read back from
eval.json, hand-made answers to real questions, and both scores with their agreement from BFCL's verdicts (here
written by hand: BFCL's whole path needs its full install, which the check script makes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bfcl_agreement.py"
RIGHT = '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}\n</tool_call>'
WRONG = '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"base": 11, "height": 5}}\n</tool_call>'


def run(*args: str) -> str:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, text=True).stdout


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_answers_come_from_an_evaluations_bfcl_calls(tmp_path):
    report = {"bfcl_calls": {"before": [{"id": "simple_python_0", "text": WRONG}],
                             "after": [{"id": "simple_python_0", "text": RIGHT}, {"id": "simple_python_1", "text": "5"}]}}
    (tmp_path / "eval.json").write_text(json.dumps(report))
    after = lines(run("answers", str(tmp_path / "eval.json")))
    assert after == [{"id": "simple_python_0", "text": RIGHT, "calls": [{"calculate_triangle_area": {"base": 10, "height": 5}}]},
                     {"id": "simple_python_1", "text": "5", "calls": []}]
    assert lines(run("answers", str(tmp_path / "eval.json"), "before"))[0]["text"] == WRONG


def test_hand_made_answers_are_right_and_wrong_answers_to_real_questions():
    made = lines(run("examples", "--rows", "2"))
    assert len(made) == 3 * 2 * 10 and {m["id"].rsplit("_", 1)[0] for m in made} == {"simple_python", "multiple", "parallel"}
    assert lines(run("examples", "--rows", "2")) == made  # seeded
    by_kind = {m["kind"]: m for m in made if m["id"] == made[0]["id"]}
    assert by_kind["prose"]["calls"] == [] and by_kind["a broken block beside a right call"]["calls"] is None


def test_compare_prints_both_scores_the_agreement_and_each_disagreement(tmp_path):
    answers = [{"id": "simple_python_0", "kind": "right", "text": RIGHT},
               {"id": "simple_python_0", "kind": "wrong", "text": WRONG},
               {"id": "simple_python_0", "kind": "one line", "text": RIGHT.replace("\n", "")}]
    official = [{"id": "simple_python_0", "text_valid": True, "text_error_type": "", "calls_valid": True, "calls_error_type": ""},
                {"id": "simple_python_0", "text_valid": False, "text_error_type": "value_error:others", "calls_valid": False,
                 "calls_error_type": "value_error:others"},
                {"id": "simple_python_0", "text_valid": False, "text_error_type": "simple_function_checker:wrong_count",
                 "calls_valid": True, "calls_error_type": ""}]
    for name, rows in (("answers.jsonl", answers), ("official.jsonl", official)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run("compare", str(tmp_path / "answers.jsonl"), str(tmp_path / "official.jsonl"), "--json", str(tmp_path / "r.json"))
    assert "distill's scorer: 0.6667 right;  BFCL's checker: 0.3333 right" in out
    assert "agreement on the whole answer (each decodes the text): 0.6667" in out
    assert "disagree: simple_python_0 (one line): distill right, BFCL simple_function_checker:wrong_count" in out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["same_calls"] == 3 and result["same_calls_agreement"] == 1.0 and len(result["disagreements"]) == 1


def test_the_check_script_installs_nothing_when_told_not_to(tmp_path):
    """BFCL_INSTALL=0 (what `benchmarks/bfcl.py --official` sets): a missing environment is named, exit 3, and no
    environment is made."""
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"id": "simple_python_0", "text": RIGHT}) + "\n")
    venv = tmp_path / "venv"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BFCL_VENV": str(venv), "BFCL_INSTALL": "0"}
    done = subprocess.run(["bash", str(SCRIPT.with_name("bfcl_official_check.sh")), str(answers)], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert f"not installed in {venv}" in done.stderr and "BFCL_INSTALL=0" in done.stderr
    assert not venv.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["answers.jsonl"]
