"""The examples of the Quickstart, the tutorial and the method pages run, so that they cannot rot.

Every fenced block of those pages declares its language. Each `bash` line that calls `distill` runs through
`distill.cli.main` and each `python` block is executed, in a temporary directory holding the files the examples
name (`./teacher`, `./student`, `./llama-teacher`, `./qwen-student`, `data.jsonl`, `qa.jsonl`, `facts.jsonl`,
`sums.jsonl`, and for the vision guide `./qwen2-vl-teacher`, `./qwen2-vl-student` and `shapes.jsonl` with its images). The models are tiny and random, and so is the default SmolLM2 teacher's stand-in: every
`Distiller` the examples build gets its models swapped for those and its budget cut to 2 optimizer steps and a
short evaluation (`_shrink`). A block of benchmark commands (`python benchmarks/...`) is not run; another block that
cannot run in seconds (an install, a server) is listed in NOT_RUN with the reason; a new block must be run or listed,
and a listed one must still exist.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from distill.config import DEFAULT_TEACHER, DistillConfig
from tests.conftest import chat_rows, tiny_lm, train_tiny_tokenizer

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = ["quickstart.md", "tutorial.md", "faq.md", *sorted(str(p.relative_to(DOCS)) for p in (DOCS / "guides").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
LANGUAGES = {"bash", "python", "yaml", "text", "json", "benchmark-table"}  # json: a data row, not run

REPO_URL = yaml.safe_load((DOCS.parent / "mkdocs.yml").read_text())["repo_url"]  # the README's clone command names it
NOT_RUN = {  # (page, the block's first line) -> why the test suite does not run it
    ("quickstart.md", f"git clone {REPO_URL} && cd distill"):
        "the README's install: it clones and installs packages (CI runs the test command itself)",
    ("faq.md", "accelerate launch --multi_gpu --num_processes 4 -m distill train --teacher ./teacher --student ./student "
               "--dataset data.jsonl"):
        "several GPUs (tests/training/test_fsdp.py runs 2 processes; the command is validated below)",
    ("faq.md", "torchrun --nnodes 2 --nproc_per_node 8 --node_rank R --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\"):
        "several machines (the command is validated below)",
    ("guides/async.md", "distill train on_policy --max_staleness 2 --generation_engine vllm_server --vllm_server_url "
                        "http://127.0.0.1:8000"):
        "needs a running vLLM server (tests/vllm runs the engine against one)",
    ("guides/bfcl.md", "distill train bfcl_teacher   # writes data/bfcl (tools in the prompt), then sft of the default model "
                       "on the train split"):
        "its `# first:` command writes BFCL's rows first; tests/recipes/test_recipe_runs.py runs it and `bfcl` one step each",
    ("guides/bfcl.md", "pip install --no-deps bfcl-eval==2026.3.23"):
        "installs a package (the README's test command installs it for the tests)",
    ("guides/bfcl.md", "python -m distill.tasks.bfcl --out data/bfcl                               # simple_python + multiple"):
        "not a distill command line; tests/tasks/bfcl/test_main.py runs it on the installed data",
    ("guides/bfcl.md", "bash scripts/bfcl_official_check.sh runs/my-run/eval/eval.json after   # a run's held-out answers after training"):
        "installs bfcl-eval with its dependencies into an environment of its own (minutes, GBs); "
        "tests/tasks/bfcl/test_agreement_script.py runs distill's side of it",
}


def blocks(page: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of a page."""
    return [(language, code) for language, code in FENCE.findall((DOCS / page).read_text())]


def benchmark(code: str) -> bool:
    """A block of benchmark commands (`python benchmarks/...` lines): minutes to hours with the real models, not run."""
    commands = [line for line in code.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    return bool(commands) and all(line.startswith("python benchmarks/") for line in commands)


def runnable(page: str) -> list[tuple[str, str]]:
    return [(language, code) for language, code in blocks(page)
            if language in ("bash", "python") and (page, code.splitlines()[0]) not in NOT_RUN and not benchmark(code)]


def test_every_block_declares_its_language_and_the_skipped_ones_exist():
    for page in PAGES:
        for language, code in blocks(page):
            assert language in LANGUAGES, f"{page}: a fenced block without a known language: {code[:60]!r}"
    listed = {(page, code.splitlines()[0]) for page in PAGES for _, code in blocks(page)}
    assert set(NOT_RUN) <= listed, set(NOT_RUN) - listed
    assert sum(len(runnable(page)) for page in PAGES) >= 2 * 7, "each method page has a shell and a Python example"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The files the examples name: models, tokenizers and datasets, tiny."""
    root = tmp_path_factory.mktemp("doc-examples")
    tokenizer = train_tiny_tokenizer()
    other = train_tiny_tokenizer(vocab_size=400)  # trained on the same text to another size: other tokens
    assert other.get_vocab() != tokenizer.get_vocab()
    for name, tok, layers, seed in (("teacher", tokenizer, 4, 1), ("student", tokenizer, 2, 2),
                                    ("llama-teacher", other, 2, 3), ("qwen-student", tokenizer, 2, 4)):
        tiny_lm(len(tok), layers=layers, seed=seed, eos_token_id=tok.eos_token_id).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    rows = [{**row, "split": "train" if i < 12 else "heldout"} for i, row in enumerate(chat_rows(16))]  # the tutorial's
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    qa = [{"question": f"What is {a} times 3?", "answer": str(3 * a)} for a in range(8)]  # the FAQ's own column names
    (root / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qa))
    facts = [{"prompt": f"What is the capital of Country {i}?", "privileged_context": f"The capital of Country {i} is Town {i}."}
             for i in range(8)]
    (root / "facts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in facts))
    sums = [{"prompt": f"What is {a} + {b}? Answer with the number only.", "answer": str(a + b)} for a in range(2, 6) for b in (3, 4)]
    (root / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sums))
    # The vision guide's: a tiny Qwen2-VL pair and a coloured-shapes dataset (shapes.jsonl, its images in images/).
    from tests.models.vision.models import save_qwen_vl
    from tests.models.vision.test_vision_runs import write_shapes

    save_qwen_vl(root / "qwen2-vl-teacher", layers=3, seed=1)
    save_qwen_vl(root / "qwen2-vl-student", layers=2, seed=2)
    write_shapes(root)
    return root


def _shrink(config: DistillConfig, root: Path) -> DistillConfig:
    """The example's configuration on tiny models, 2 steps and a short evaluation. The model swap and the
    budget must apply; a field the run would not read (the evaluation's, with evaluation off) is left alone."""
    from distill.methods import get_method

    method = get_method(config.method)
    required = {"max_steps": 2, "max_new_tokens": min(config.max_new_tokens, 8), "progress_bar": False}
    if method.teacher == "external" and config.teacher == DEFAULT_TEACHER and not (config.teacher_url or config.teacher_cache):
        required["teacher"] = str(root / ("llama-teacher" if method.cross_tokenizer else "teacher"))
    if (method.teacher != "external" and config.student is None) or config.student == DEFAULT_TEACHER:
        required["student"] = str(root / "student")
    config = _changed(config, required)
    optional = {"eval_max_prompts": 2, "eval_max_new_tokens": 8, "save_steps": 0,  # the tiny models' context is 512
                "max_prompt_length": 192, "max_teacher_prompt_length": 192, "max_reprompt_length": 192}
    for name, value in optional.items():
        with contextlib.suppress(ValueError):
            config = _changed(config, {name: value}).validate()
    return config


def _changed(config: DistillConfig, values: dict) -> DistillConfig:
    """A copy of `config` with `values`, changed in place on the copy so that it keeps which layer (a bundled recipe,
    the example's flags) set each other field (`dataclasses.replace` makes a config of the user's values only)."""
    config = copy.copy(config)
    for name, value in values.items():
        setattr(config, name, value)
    return config


@pytest.fixture
def tiny_runs(workdir, tmp_path, monkeypatch):
    """Each page runs in a directory of its own (its `runs/`), with links to the shared files."""
    from distill.training import trainer

    built = []
    original = trainer.Distiller.__init__

    def shrunk(self, config, **kwargs):
        config = _shrink(config, workdir)
        built.append(config)
        original(self, config, **kwargs)

    monkeypatch.setattr(trainer.Distiller, "__init__", shrunk)
    for entry in workdir.iterdir():
        (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.chdir(tmp_path)
    return built


@pytest.mark.parametrize("page", PAGES)
def test_the_page_examples_run(page, tiny_runs, workdir):
    from distill.cli import main

    examples = runnable(page)
    for language, code in examples:
        if language == "python":
            exec(compile(code, f"{page} example", "exec"), {"__name__": "__doc_example__"})
            continue
        for line in code.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip()
            if not command or command.startswith("#"):
                continue
            argv = shlex.split(command)
            assert argv[0] == "distill", f"{page}: a shell line the test cannot run: {line!r} (run it or list it in NOT_RUN)"
            assert main(argv[1:]) == 0, f"{page}: {command}"
    if any(language == "python" or "distill train" in code for language, code in examples):
        assert tiny_runs, f"{page}: its examples built no Distiller"
        assert all(config.max_steps == 2 for config in tiny_runs)
    if page == "tutorial.md":  # the evaluation it promises is written: before and after, then again by `distill eval`
        report = (Path("runs") / "mine" / "eval" / "eval.md").read_text()
        assert "before" in report and "after" in report
        assert (Path("runs") / "mine" / "eval-cli" / "eval.md").is_file()


SERVER_PAGES = ["vllm.md", "teachers.md", "tutorial.md", "guides/async.md", "scaling.md", "faq.md"]


def _train_lines(page: str) -> list[str]:
    """The `distill train` commands of every fenced block of a page, launched by a launcher or not (continuation lines
    joined, `...` and trailing comments dropped)."""
    lines = []
    for _, code in FENCE.findall((DOCS / page).read_text()):
        for line in code.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip().removesuffix("&").strip()
            for part in command.split(" && "):  # `distill train ...`, `torchrun ... -m distill train ...`
                if "distill train" in part:
                    lines.append(part[part.index("distill train"):].removesuffix("...").strip())
    return lines


@pytest.mark.parametrize("page", SERVER_PAGES)
def test_the_commands_that_need_a_server_or_gpus_validate(page):
    """The examples the suite cannot run (a vLLM or teacher server, several processes) still hold a configuration that
    validates: a field they set that the run would not read, or a combination the rules refuse, fails here."""
    from distill.cli import parse_field_flags
    from distill.recipes import recipe_path

    lines = _train_lines(page)
    assert lines, page
    for command in lines:
        argv = shlex.split(command)[2:]
        recipe = argv.pop(0) if argv and not argv[0].startswith("--") else None
        if "--resume" in argv:
            continue
        flags = parse_field_flags([a for a in argv if a not in ("--break-lock", "--break_lock")])
        config = DistillConfig.from_yaml(recipe_path(recipe), flags) if recipe else DistillConfig.from_dict(flags, page)
        try:
            config.validate()
        except ValueError as error:
            pytest.fail(f"{page}: {command}: {error}")
