"""Hostile datasets: every bad file, directory or split is a one-line error naming the field, the file (and
line or split) and the fix, raised before any model is loaded; never a traceback from `datasets`, a crash,
or training on the wrong rows."""

import json

import datasets
import pytest

from distill.data import examples_from_dataset
from distill.data_files import load_dataset_spec
from tests.helpers.training import forbid_model_loading

ROWS = [{"prompt": f"question {i}?"} for i in range(4)]
SPLIT_ROWS = [{"prompt": f"q{i}", "split": "train" if i < 3 else "heldout"} for i in range(5)]


def jsonl(rows) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def write_parquet(tmp_path, name: str, rows=ROWS):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def saved_with_bad_info(tmp_path):
    path = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    (path / "dataset_info.json").write_text("{oops")
    return path


def truncated_parquet(tmp_path):
    path = write_parquet(tmp_path, "cut.parquet")
    path.write_bytes(path.read_bytes()[:-20])  # an interrupted download: the footer is gone
    return path


def load_examples(spec, split="train", field="dataset"):
    return examples_from_dataset(load_dataset_spec(spec, split, field), field)


# name: (make the dataset -> (spec, what the message must name), split, field, exception, message substrings)
CASES = {
    "unknown split of a splitless jsonl": (
        lambda t: write(t, "d.jsonl", jsonl(ROWS)), "test", "dataset", ValueError,
        ["dataset: ", "d.jsonl has no 'split' column, so its only split is 'train'", "not 'test'", "dataset_split"]),
    "unknown eval split of a splitless jsonl": (
        lambda t: write(t, "e.jsonl", jsonl(ROWS)), "heldout", "eval_dataset", ValueError,
        ["eval_dataset: ", "e.jsonl has no 'split' column", "set eval_split to train"]),
    "misspelled split of the bundled set": (
        lambda t: "bundled", "trian", "dataset", ValueError,
        ["dataset: the bundled dataset has no split 'trian'", "['heldout', 'train']"]),
    "misspelled split of a jsonl with a split column": (
        lambda t: write(t, "s.jsonl", jsonl(SPLIT_ROWS)), "tset", "dataset", ValueError,
        ["s.jsonl has no split 'tset'", "['heldout', 'train']"]),
    "missing split of a DatasetDict": (
        lambda t: datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}), "test", "eval_dataset", ValueError,
        ["eval_dataset: the DatasetDict has no split 'test'", "['train']", "eval_split"]),
    "missing split of a saved DatasetDict directory": (
        lambda t: datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(t / "dd")) or t / "dd",
        "validation", "dataset", ValueError, ["dd has no split 'validation'", "['train']"]),
    "empty jsonl file": (
        lambda t: write(t, "empty.jsonl", b""), "train", "dataset", ValueError, ["empty.jsonl is empty (0 bytes)"]),
    "jsonl of blank lines": (
        lambda t: write(t, "blank.jsonl", "\n  \n\n"), "train", "dataset", ValueError, ["blank.jsonl holds only blank lines"]),
    "csv file": (
        lambda t: write(t, "d.csv", "prompt\nhello\n"), "train", "dataset", ValueError,
        ["d.csv is a .csv file, which distill does not read", ".jsonl", "save_to_disk", "load_dataset('csv'"]),
    "directory holding a csv": (
        lambda t: write(t, "dir/d.csv", "prompt\nhello\n").parent, "train", "dataset", ValueError,
        ["d.csv is a .csv file", ".parquet", "load_dataset('csv'"]),
    "single file with an unsupported extension": (
        lambda t: write(t, "prompts.txt", "hello\n"), "train", "dataset", ValueError,
        ["prompts.txt is a .txt file, which distill does not read", "convert it"]),
    "malformed jsonl line": (
        lambda t: write(t, "bad.jsonl", jsonl(ROWS[:2]) + '{"prompt": "x"\n' + jsonl(ROWS[2:])), "train", "dataset",
        ValueError, ["bad.jsonl line 3 is not valid JSON", "fix or remove that line"]),
    "non-UTF-8 jsonl": (
        lambda t: write(t, "latin.jsonl", b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n'), "train", "dataset", ValueError,
        ["latin.jsonl line 2 (byte 31) is not UTF-8", "save the file as UTF-8"]),
    "non-UTF-8 json array": (
        lambda t: write(t, "latin.json", b'[\n{"prompt": "a"},\n{"prompt": "caf\xe9"}\n]'), "train", "dataset", ValueError,
        ["latin.json line 3 (byte 34) is not UTF-8"]),
    "json array of strings": (
        lambda t: write(t, "strings.json", '["a", "b"]'), "train", "dataset", ValueError,
        ["strings.json row 0 is a string, not a JSON object"]),
    "json number": (
        lambda t: write(t, "number.json", "42"), "train", "dataset", ValueError, ["number.json holds a number, not rows"]),
    "malformed json array": (
        lambda t: write(t, "broken.json", '[{"prompt": "a"},\n {"prompt": "b"\n]'), "train", "dataset", ValueError,
        ["broken.json line 3 is not valid JSON"]),
    "jsonl line that is null": (
        lambda t: write(t, "nulls.jsonl", '{"prompt": "a"}\nnull\n'), "train", "dataset", ValueError,
        ["nulls.jsonl line 2 is null, not a JSON object"]),
    "jsonl line that is an array": (
        lambda t: write(t, "arrays.jsonl", '{"prompt": "a"}\n[{"prompt": "b"}]\n'), "train", "dataset", ValueError,
        ["arrays.jsonl line 2 is an array, not a JSON object"]),
    "rows without prompt or messages": (
        lambda t: write(t, "text.jsonl", '{"text": "a"}\n'), "train", "dataset", ValueError,
        ["text.jsonl needs a 'prompt' column", "['text']"]),
    "one row without prompt or messages": (
        lambda t: write(t, "holes.jsonl", '{"prompt": "a"}\n{"text": "b"}\n'), "train", "dataset", ValueError,
        ["dataset row 1: has no 'prompt' and no 'messages'"]),
    "corrupt parquet": (
        lambda t: write(t, "corrupt.parquet", b"PAR1" + b"\x00garbage" * 8 + b"PAR1"), "train", "dataset", ValueError,
        ["corrupt.parquet is not a readable parquet file", "write it again"]),
    "truncated parquet": (
        truncated_parquet, "train", "dataset", ValueError, ["cut.parquet is not a parquet file (no PAR1"]),
    "directory without data files": (
        lambda t: write(t, "docs/README.md", "hi").parent, "train", "dataset", ValueError,
        ["no .json, .jsonl or .parquet files in", "docs"]),
    "directory of split folders": (
        lambda t: write(t, "hub/train/a.jsonl", jsonl(ROWS)).parent.parent, "train", "dataset", ValueError,
        ["no .json, .jsonl or .parquet files in", "it has folders ['train']"]),
    "directory with files of several splits": (
        lambda t: write(t, "sp/test.jsonl", jsonl(ROWS)) and write(t, "sp/train.jsonl", jsonl(ROWS)).parent,
        "train", "dataset", ValueError, ["holds files of several splits (test.jsonl, train.jsonl)"]),
    "directory mixing parquet and jsonl": (
        lambda t: write_parquet(t, "mix/a.parquet") and write(t, "mix/b.jsonl", jsonl(ROWS)).parent, "train", "dataset",
        ValueError, ["mix mixes parquet and JSON files"]),
    "missing path": (
        lambda t: t / "nope.jsonl", "train", "dataset", ValueError, ["nope.jsonl does not exist"]),
    "corrupt saved Dataset directory": (
        saved_with_bad_info, "train", "dataset", ValueError,
        ["saved looks like a directory written by save_to_disk but cannot be read", "JSONDecodeError"]),
    "an object that is no dataset": (
        lambda t: object(), "train", "dataset", TypeError, ["dataset must be a datasets.Dataset", "from_list"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_dataset_is_one_line_error_naming_the_cause(tmp_path, name):
    make, split, field, error_type, parts = CASES[name]
    spec = make(tmp_path)
    with pytest.raises(error_type) as raised:
        load_examples(spec if not hasattr(spec, "is_dir") else str(spec), split, field)
    message = str(raised.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    if hasattr(spec, "is_dir") and name not in ("missing path", "one row without prompt or messages"):
        assert str(tmp_path) in message  # the file (or directory) at fault, by its full path


@pytest.mark.parametrize("content, name, split, prompts", [
    (jsonl(ROWS), "d.jsonl", "train", [r["prompt"] for r in ROWS]),  # no split column: every row is 'train'
    (jsonl(SPLIT_ROWS), "s.jsonl", "heldout", ["q3", "q4"]),  # a split column picks its rows, nothing else
    (jsonl(SPLIT_ROWS), "s.jsonl", "train", ["q0", "q1", "q2"]),
    (json.dumps(ROWS, indent=2), "pretty.json", "train", [r["prompt"] for r in ROWS]),  # a pretty-printed array
    ("\ufeff" + jsonl(ROWS[:2]).replace("\n", "\r\n"), "bom.json", "train", ["question 0?", "question 1?"]),
])
def test_good_files_give_exactly_their_rows(tmp_path, content, name, split, prompts):
    path = write(tmp_path, name, content)
    assert [e.prompt for e in load_examples(str(path), split)] == prompts


def test_parquet_directory_and_bundled_default_split(tmp_path):
    write_parquet(tmp_path, "pq/part-0.parquet", ROWS[:2])
    write_parquet(tmp_path, "pq/part-1.parquet", ROWS[2:])
    assert [e.prompt for e in load_examples(str(tmp_path / "pq"))] == [r["prompt"] for r in ROWS]
    assert len(load_examples("bundled", "train")) == 310 and len(load_examples("bundled", "heldout")) == 40


def test_hub_failure_is_one_line_naming_the_field(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/prompts' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"^eval_dataset: 'someone/prompts' is no local file or directory, and loading "
                                         r"it from the Hugging Face Hub failed \(ConnectionError: Couldn't reach"):
        load_dataset_spec("someone/prompts", "train", "eval_dataset")


@pytest.mark.parametrize("flags, parts", [
    (["--dataset_split", "test"], ["distill train: error: dataset: ", "d.jsonl has no 'split' column"]),
    (["--eval_dataset", "EMPTY"], ["distill train: error: eval_dataset: ", "empty.jsonl is empty (0 bytes)"]),
])
def test_cli_reports_dataset_errors_before_loading_any_model(tmp_path, monkeypatch, capsys, flags, parts):
    from distill.cli import main

    forbid_model_loading(monkeypatch, "a model was loaded before the dataset was checked", resolving=True)
    data = write(tmp_path, "d.jsonl", jsonl(ROWS))
    empty = write(tmp_path, "empty.jsonl", b"")
    flags = [str(empty) if flag == "EMPTY" else flag for flag in flags]
    assert main(["train", "--dataset", str(data), "--output_dir", str(tmp_path / "run"), *flags]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # not datasets' progress bars
    assert len(errors) == 1 and not (tmp_path / "run").exists()
    for part in parts:
        assert part in errors[0], f"{part!r} not in {errors[0]!r}"
