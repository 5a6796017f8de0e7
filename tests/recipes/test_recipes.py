"""The bundled recipes: `distill.recipes`, `distill train NAME`, `distill recipes`, and that the wheel ships them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from distill.cli import main
from distill.config import DistillConfig
from distill.recipes import RECIPES_DIR, bundled_recipes, recipe_path

REPO = Path(__file__).resolve().parents[2]


def test_bundled_recipes_are_listed_with_descriptions():
    recipes = dict(bundled_recipes())
    assert set(recipes) == {p.stem for p in RECIPES_DIR.glob("*.yaml")}
    assert {"gold", "server", "offline", "gkd_mixed", "on_policy"} <= set(recipes)
    for name, description in recipes.items():
        assert description and not description.startswith("#"), name
    assert not (REPO / "recipes").exists(), "the recipes live in src/distill/recipes/ (shipped in the wheel)"


@pytest.mark.parametrize("name", [name for name, _ in bundled_recipes()])
def test_bundled_recipe_parses_and_validates(name):
    config = DistillConfig.from_yaml(recipe_path(name))
    assert config.method not in ("server", "offline"), "the teacher's location is teacher_url / teacher_cache"
    config.validate()


def test_recipe_path_by_name_file_name_and_path(tmp_path, monkeypatch):
    assert recipe_path("gold") == RECIPES_DIR / "gold.yaml"
    assert recipe_path("gold.yaml") == RECIPES_DIR / "gold.yaml"
    assert recipe_path("gold").is_file()
    mine = tmp_path / "mine.yaml"
    mine.write_text("method: gkd\n")
    assert recipe_path(mine) == mine and recipe_path(str(mine)) == mine
    # An existing file wins over the bundled recipe of the same name.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gold.yaml").write_text("method: gkd\n")
    assert recipe_path("gold.yaml") == Path("gold.yaml")
    assert recipe_path("gold") == RECIPES_DIR / "gold.yaml"


def test_recipe_path_unknown_names_list_the_bundled_ones_and_the_closest():
    with pytest.raises(ValueError) as error:
        recipe_path("gkd_mixd")
    message = str(error.value)
    assert "did you mean 'gkd_mixed'?" in message
    assert all(name in message for name, _ in bundled_recipes())
    with pytest.raises(ValueError, match="did you mean 'gold'"):
        recipe_path("recipes/gold.yaml")  # the old location: a path that does not exist, not a name
    with pytest.raises(ValueError, match="neither a file nor a bundled recipe") as error:
        recipe_path("zzzz")
    assert "did you mean" not in str(error.value)


def test_distill_train_takes_a_recipe_name(monkeypatch, capsys, tmp_path):
    seen = []

    class FakeDistiller:
        def __init__(self, config, **kwargs):
            seen.append(config)

        def train(self):
            return {"run_dir": "nowhere"}

    # A stand-in trainer module: this checks the recipe argument only, whatever state the training loop is in.
    monkeypatch.setitem(sys.modules, "distill.training.trainer", types.SimpleNamespace(Distiller=FakeDistiller, resume_config=None))
    assert main(["train", "gold", "--max-steps", "2", "--output-dir", str(tmp_path / "run")]) == 0
    assert seen[0].method == "gold" and seen[0].student == "byte-llama:4x256" and seen[0].max_steps == 2
    assert main(["train", "gld"]) == 2
    assert "did you mean 'gold'?" in capsys.readouterr().err
    assert not seen[1:]


def test_distill_recipes_command(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    for name, description in bundled_recipes():
        assert f"{name}  " in out and description in out
    assert main([]) == 0
    assert "distill recipes" in capsys.readouterr().out


def running_site_packages() -> list[str]:
    """The site-packages directories this interpreter imports from (venv, system, user), in its order."""
    import site

    candidates = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    candidates += site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return list(dict.fromkeys(str(Path(p).resolve()) for p in candidates if Path(p).is_dir()))


def test_the_wheel_ships_the_recipes(tmp_path):
    """Build the wheel offline, install it into a fresh venv, and use the recipes from outside the repository."""
    source = tmp_path / "source"  # a copy, so building writes no build/ or egg-info into the working tree
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (source / name).write_bytes((REPO / name).read_bytes())
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def run(*args, cwd=tmp_path):
        done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(source))
    (wheel,) = wheels.glob("distill-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name, _ in bundled_recipes():
        assert f"distill/recipes/{name}.yaml" in names
    assert {"distill/recipes/__init__.py", "distill/recipes/data/prompts.jsonl", "distill/recipes/data/easy_vqa/rows.jsonl",
            "distill/recipes/data/easy_vqa/LICENSE", "distill/recipes/data/easy_vqa/images/train-0.png"} <= names

    # Torch and the rest come from the site-packages of the interpreter running the tests, wherever it is (the
    # system's, a venv's, a user site), put after the venv's own by a .pth file: `venv --system-site-packages`
    # would give the *base* interpreter's instead when this one is itself a venv. Directories named in a .pth
    # file are not scanned for .pth files of their own, so the repository's editable install stays invisible
    # and the venv's copy of the wheel is the only distill. That interpreter's pip installs into the venv.
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    venv_site = Path(run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (venv_site / "running_interpreter.pth").write_text("\n".join(running_site_packages()) + "\n")
    run(str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--no-warn-script-location", str(wheel))

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    probe = ("import json, distill, distill.recipes as r; from distill.config import DistillConfig; "
             "p = r.recipe_path('gold'); DistillConfig.from_yaml(p).validate(); "
             "print(json.dumps({'package': distill.__file__, 'gold': str(p.resolve()), 'names': [n for n, _ in r.bundled_recipes()], "
             "'data': (r.RECIPES_DIR / 'data' / 'prompts.jsonl').is_file()}))")
    found = json.loads(run(str(python), "-c", probe, cwd=outside))
    site = (venv / "lib").resolve()
    gold = Path(found["gold"])
    assert gold.is_file() and site in gold.parents and REPO not in gold.parents, found
    assert Path(found["package"]).resolve().is_relative_to(site)
    assert found["names"] == [name for name, _ in bundled_recipes()] and found["data"]

    listed = run(str(bindir / "distill"), "recipes", cwd=outside)
    for name, description in bundled_recipes():
        assert f"{name}  " in listed and description in listed


# Config fields that name something to read: a model, a data set, a cache (a teacher server: teacher_url).
READ_FIELDS = ("teacher", "student", "dataset", "eval_dataset", "teacher_cache", "teacher_head")


def _ships(value: str) -> bool:
    """Whether a field value names something distill ships or builds: a bundled data set, the default model, a model
    built from scratch."""
    from distill.config.values import DEFAULT_TEACHER
    from distill.data_files import BUNDLED_SETS
    from distill.models.byte_student import is_byte_student
    from distill.models.byte_vision import is_byte_vision

    if value in BUNDLED_SETS:
        return BUNDLED_SETS[value].is_file()
    return value == DEFAULT_TEACHER or is_byte_student(value) or is_byte_vision(value)


def _written_before(path: Path) -> set[str]:
    """What the recipe's `# first:` command writes, and what the commands before that one write (a recipe run whose own
    recipe has a `# first:` line)."""
    from distill.recipes import prerequisite

    written: set[str] = set()
    first = prerequisite(path)
    while first is not None:
        if first.product is not None:
            written.add(first.product)
        words = first.command.split()
        first = prerequisite(recipe_path(words[2])) if words[:2] == ["distill", "train"] else None
    return written


@pytest.mark.parametrize("name", [name for name, _ in bundled_recipes()])
def test_a_bundled_recipe_reads_what_ships_or_what_its_first_command_writes(name):
    """Every path a recipe reads is bundled, or written by the command its `# first:` line names (another bundled
    recipe's run, a teacher cache); a teacher server is started by the command it names."""
    from distill.recipes import prerequisite

    path = recipe_path(name)
    config = DistillConfig.from_yaml(path)
    config.validate()
    first = prerequisite(path)
    defaults = DistillConfig()
    for field in READ_FIELDS:
        value = getattr(config, field)
        if value is None or value == getattr(defaults, field) or _ships(value):
            continue
        assert value in _written_before(path), (
            f"recipe {name}: {field} {value} is neither bundled nor written by a `# first:` command (or the one before it)")
    if first is None:
        assert config.teacher_url is None, f"recipe {name} needs a teacher server: its `# first:` line names the command"
        return
    words = first.command.split()
    data_script = words[:3] == ["python", "-m", "distill.tasks.bfcl"]  # writes BFCL's rows from the installed package
    assert data_script or (words[0] == "distill" and words[1] in ("train", "cache-teacher", "serve-teacher")), first.command
    if words[:2] == ["distill", "train"]:
        other = recipe_path(words[2])
        before = prerequisite(other)
        assert before is None or not before.command.startswith("distill train"), (
            "a recipe's first run needs at most a data script first, not another run")
        assert first.product == f"{DistillConfig.from_yaml(other).output_dir}/model"
    elif data_script:
        assert config.dataset == first.product == f"{words[words.index('--out') + 1]}/bfcl.jsonl"
    elif words[1] == "cache-teacher":
        assert config.teacher_cache == first.product == words[words.index("--out") + 1]
    else:
        assert first.product is None and config.teacher_url == f"http://127.0.0.1:{words[words.index('--port') + 1]}"


def test_the_bundled_image_set_ships_its_images_and_licence():
    from distill.data_files import BUNDLED_SETS

    rows_file = BUNDLED_SETS["bundled:easy-vqa"]
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert {row["split"] for row in rows} == {"train", "heldout"}
    shown = {image for row in rows for image in row["images"]}
    assert all((rows_file.parent / image).is_file() for image in shown)
    assert {f"images/{p.name}" for p in (rows_file.parent / "images").iterdir()} == shown  # no picture without a question
    held_out = {image for row in rows if row["split"] == "heldout" for image in row["images"]}
    assert held_out and not held_out & {image for row in rows if row["split"] == "train" for image in row["images"]}
    assert "MIT License" in (rows_file.parent / "LICENSE").read_text()
    size = sum(p.stat().st_size for p in rows_file.parent.rglob("*") if p.is_file())
    assert size < 500_000, f"the bundled slice is {size} bytes; it ships in the wheel (the vision guide says under half a megabyte)"


@pytest.mark.parametrize("name, flags, command", [
    ("agent", [], "distill train agent_teacher"),
    ("vision", [], "distill train vision_teacher"),
    ("offline", [], "distill cache-teacher --teacher smollm2-135m-instruct"),
])
def test_distill_train_names_the_command_a_recipe_needs_first(name, flags, command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no runs/ or caches/ here
    assert main(["train", name, *flags]) == 2
    err = capsys.readouterr().err
    assert f"`{command}" in err and "run that first" in err, err


def test_a_recipe_pointed_elsewhere_needs_nothing_first(monkeypatch, tmp_path):
    seen = []

    class FakeDistiller:
        def __init__(self, config, **kwargs):
            seen.append(config)

        def train(self):
            return {"run_dir": "nowhere"}

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "distill.training.trainer", types.SimpleNamespace(Distiller=FakeDistiller))
    assert main(["train", "agent", "--teacher", "smollm2-135m-instruct"]) == 0
    assert seen[0].teacher == "smollm2-135m-instruct"


def test_distill_recipes_shows_what_to_run_first(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "first: distill train agent_teacher" in out and "first: distill train vision_teacher" in out
    assert "first: distill serve-teacher" in out and "first: distill cache-teacher" in out
