"""Loading datasets: a name, a local path or an object, as one `datasets.Dataset` split, checked.

Local data is .json/.jsonl/.parquet files, a directory of them, or a directory written by `save_to_disk`:
one split, 'train', unless its rows have a 'split' column; 'bundled' is the prompt set shipped with
distill, 'bundled:facts' its knowledge-injection set (invented facts with checkable answers, for
self-distillation: `scripts/make_facts.py` writes it), 'bundled:arithmetic' its RL task (sums with their
answers, for sdpo / GRPO: `scripts/make_arithmetic.py`), 'bundled:lookup' its tool-use task (an invented registry
that only the tool `distill.tasks.lookup:lookup_code` answers: `scripts/make_lookup.py`), 'bundled:chain' its two-call
tool task (an entry's partner, then the partner's code: `distill.tasks.chain`, `scripts/make_chain.py`), 'bundled:easy-vqa' its visual
question answering task (a slice of easy-VQA, MIT licence, its images beside the rows: `scripts/make_easy_vqa.py`).
Every problem (an unknown split, an empty, malformed, non-UTF-8 or unsupported file, a missing
prompt column) is one ValueError naming the field, the file (and line) and the fix, raised before any
model loads. Rows are validated and turned into examples by `distill.data`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

BUNDLED_DATASET = "bundled"
BUNDLED_PROMPTS = Path(__file__).parent / "recipes" / "data" / "prompts.jsonl"
BUNDLED_SETS = {BUNDLED_DATASET: BUNDLED_PROMPTS,
                "bundled:facts": Path(__file__).parent / "recipes" / "data" / "facts.jsonl",
                "bundled:arithmetic": Path(__file__).parent / "recipes" / "data" / "arithmetic.jsonl",
                "bundled:lookup": Path(__file__).parent / "recipes" / "data" / "lookup.jsonl",
                "bundled:chain": Path(__file__).parent / "recipes" / "data" / "chain.jsonl",
                "bundled:easy-vqa": Path(__file__).parent / "recipes" / "data" / "easy_vqa" / "rows.jsonl"}
DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
_UNREAD_SUFFIXES = (".csv", ".tsv", ".arrow", ".gz", ".zst", ".xlsx")  # data files distill does not read
_SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # what save_to_disk writes
_FORMATS = ".json (an array of row objects, or JSON Lines), .jsonl or .parquet files, or a directory written by save_to_disk"
_SPLIT_WORDS = {"train": "train", "training": "train", "test": "test", "testing": "test", "eval": "eval",
                "evaluation": "eval", "heldout": "eval", "valid": "validation", "validation": "validation",
                "val": "validation", "dev": "validation"}
_JSON_KINDS = {"[": "an array", '"': "a string", "n": "null", "t": "a boolean", "f": "a boolean"}  # by first character
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean", type(None): "null"}


def load_dataset_spec(spec: Any, split: str, field: str):
    """A `datasets.Dataset` from a name/path or an object; raises TypeError/ValueError with the fix.

    A local file, a directory of files or a directory written by `save_to_disk` is one split, 'train',
    unless its rows have a 'split' column, whose values are then the splits (the bundled set has one).
    An unknown split is an error listing the known ones: never all rows in its place.
    """
    import datasets

    if isinstance(spec, datasets.DatasetDict):
        return _dict_split(spec, split, field, "the DatasetDict")
    if isinstance(spec, datasets.IterableDataset):
        raise TypeError(
            f"{field}: an IterableDataset is not supported; materialise it with Dataset.from_list(list(ds)). "
            "Rows are chosen by step index, so that every process and a resumed run see the same rows, "
            "which a stream cannot give"
        )
    if isinstance(spec, datasets.Dataset):
        return spec
    if not isinstance(spec, (str, Path)):
        kind = type(spec).__name__
        fix = {"DataFrame": "datasets.Dataset.from_pandas(df)", "dict": "datasets.Dataset.from_dict(columns)"}.get(
            kind, "datasets.Dataset.from_list(rows)")
        raise TypeError(f"{field} must be a datasets.Dataset (or a name/path), got a {kind}; wrap it with {fix}")
    spec = str(spec)
    if spec in BUNDLED_SETS:
        dataset = datasets.load_dataset("json", data_files=str(BUNDLED_SETS[spec]), split="train")
        return _select_split(dataset, split, field, "the bundled dataset" + ("" if spec == BUNDLED_DATASET else f" {spec!r}"))
    if spec.startswith(BUNDLED_DATASET + ":"):
        raise ValueError(f"{field}: {spec!r} is not a bundled dataset; the bundled ones are {sorted(BUNDLED_SETS)}")
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_dir() and any((path / marker).exists() for marker in _SAVED_MARKERS):
            return _load_saved(path, split, field)
        return _load_files(path, split, field)
    if spec.startswith((".", "/", "~")) or Path(spec).suffix.lower() in (*DATA_SUFFIXES, *_UNREAD_SUFFIXES, ".txt"):
        raise ValueError(f"{field}: {spec} does not exist (relative paths start at {Path.cwd()}); check the path")
    try:
        return datasets.load_dataset(spec, split=split)
    except Exception as error:  # network, unknown repo, unknown split: one line naming the field, not a traceback
        raise ValueError(f"{field}: {spec!r} is no local file or directory, and loading it from the Hugging Face Hub "
                         f"failed ({_first_line(error)}); check the path or the hub id") from error


def data_root(spec: Any) -> Path | None:
    """Where a dataset's relative image paths start: the folder of a dataset file, a dataset folder itself, or
    the working directory for a dataset object (None for the bundled sets and hub ids)."""
    if not isinstance(spec, (str, Path)):
        return Path.cwd()
    if str(spec) in BUNDLED_SETS:
        return BUNDLED_SETS[str(spec)].parent
    path = Path(spec).expanduser()
    if not path.exists():
        return None
    return (path if path.is_dir() else path.parent).resolve()


def _split_setting(field: str) -> str:
    return "eval_split" if field == "eval_dataset" else "dataset_split (or --split)"


def _dict_split(dataset_dict, split: str, field: str, where: str):
    if split not in dataset_dict:
        raise ValueError(f"{field}: {where} has no split '{split}' (it has {list(dataset_dict)}); set "
                         f"{_split_setting(field)} to one of them")
    return dataset_dict[split]


def _select_split(dataset, split: str, field: str, where: str):
    """The rows of `split`: by the 'split' column when there is one, else all rows, which are split 'train'."""
    if "split" not in dataset.column_names:
        if split != "train":
            raise ValueError(f"{field}: {where} has no 'split' column, so its only split is 'train' (all rows), not "
                             f"'{split}'; set {_split_setting(field)} to train, or add a 'split' column to the rows")
        return dataset
    available = sorted(dataset.unique("split"), key=str)
    if split not in available:
        raise ValueError(f"{field}: {where} has no split '{split}'; its 'split' column holds {available}; set "
                         f"{_split_setting(field)} to one of them")
    return dataset.filter(lambda row: row["split"] == split)


def _load_saved(path: Path, split: str, field: str):
    import datasets

    try:
        saved = datasets.load_from_disk(str(path))
    except Exception as error:  # corrupt or partial: JSONDecodeError, ArrowInvalid, FileNotFoundError, ...
        raise ValueError(f"{field}: {path} looks like a directory written by save_to_disk but cannot be read "
                         f"({_first_line(error)}); save the dataset there again") from error
    if isinstance(saved, datasets.DatasetDict):
        return _dict_split(saved, split, field, str(path))
    return _select_split(saved, split, field, str(path))


def _load_files(path: Path, split: str, field: str):
    """One file, or every data file of a directory, as one dataset (then split by its 'split' column).

    Files are checked first, cheaply (a pass over lines: UTF-8 and one object per line, ~2 ms per MB, no
    JSON parsing), because `datasets` turns hostile files into StopIteration, a silent 'text' column or a
    segfault (a JSON Lines line `null`); a parse error it raises is then located to its line.
    """
    import datasets

    files = _data_files(path, field)
    line_files = [f for f in files if f.suffix.lower() != ".parquet" and _check_json_file(f, field) == "lines"]
    builder = "parquet" if files[0].suffix.lower() == ".parquet" else "json"
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its "Failed to load JSON" log: the error below says it
    try:
        dataset = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
    except Exception as error:
        for file in line_files if builder == "json" else []:
            _locate_bad_json_line(file, field)
        for file in files if builder == "parquet" else []:
            _check_parquet_readable(file, field)
        names = ", ".join(f.name for f in files)
        raise ValueError(f"{field}: {path} cannot be read ({names}): {_first_line(error)}") from error
    finally:
        datasets.logging.set_verbosity(verbosity)
    if len(dataset) == 0:
        raise ValueError(f"{field}: {path} holds no rows; it needs at least one row with 'prompt' or 'messages'")
    check_columns(dataset.column_names, field, str(path))
    if "split" not in dataset.column_names:
        groups: dict[str | None, list[str]] = {}
        for file in files:
            match = re.match(r"[a-z]*", file.stem.lower())
            assert match is not None  # [a-z]* matches every string
            word = match.group()
            groups.setdefault(_SPLIT_WORDS.get(word), []).append(file.name)
        groups.pop(None, None)
        if len(groups) > 1:
            named = sorted(name for names in groups.values() for name in names)
            raise ValueError(f"{field}: {path} holds files of several splits ({', '.join(named)}) and every file of a "
                             "directory is read into one dataset; point it at one split's file, or add a 'split' column")
    return _select_split(dataset, split, field, str(path))


def _data_files(path: Path, field: str) -> list[Path]:
    """The data files to read: the file itself, or the directory's visible .json/.jsonl/.parquet files."""
    if path.is_file():
        if path.suffix.lower() not in DATA_SUFFIXES:
            raise ValueError(_unsupported(field, path))
        files = [path]
    else:
        entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
        files = [p for p in entries if p.is_file() and p.suffix.lower() in DATA_SUFFIXES]
        unread = [p for p in entries if p.is_file() and p.suffix.lower() in _UNREAD_SUFFIXES]
        if unread:
            raise ValueError(_unsupported(field, unread[0]) + f" (or move it out of {path})")
        if not files:
            folders = [p.name for p in entries if p.is_dir()]
            where = f"; it has folders {folders[:5]}: point {field} at one of them" if folders else f"; give {_FORMATS}"
            raise ValueError(f"{field}: no .json, .jsonl or .parquet files in {path}{where}")
        if len({f.suffix.lower() == ".parquet" for f in files}) > 1:
            raise ValueError(f"{field}: {path} mixes parquet and JSON files; keep one format in a dataset directory")
    for file in files:
        if file.stat().st_size == 0:
            raise ValueError(f"{field}: {file} is empty (0 bytes); it needs at least one row")
        if file.suffix.lower() == ".parquet":
            with file.open("rb") as handle:
                head = handle.read(4)
                handle.seek(max(file.stat().st_size - 4, 0))
                if head != b"PAR1" or handle.read(4) != b"PAR1" or file.stat().st_size < 12:
                    raise ValueError(f"{field}: {file} is not a parquet file (no PAR1 header and footer: truncated "
                                     "or another format); write it again, e.g. with Dataset.to_parquet")
    return files


def _unsupported(field: str, file: Path) -> str:
    suffix = file.suffix.lower()
    kind = f"a {suffix} file" if suffix else "a file without an extension"
    how = (f"convert it, e.g. datasets.load_dataset('csv', data_files='{file}', split='train').to_json('data.jsonl')"
           if suffix == ".csv" else "convert it to one of these")
    return f"{field}: {file} is {kind}, which distill does not read; it reads {_FORMATS}; {how}"


def _check_json_file(file: Path, field: str) -> str:
    """'lines' (JSON Lines: every non-blank line must start an object) or 'document' (one JSON value, parsed).

    Raises ValueError naming the file and line for non-UTF-8 bytes, rows that are not objects, no rows,
    and a malformed document. A `.json` file is JSON Lines when its first line is a whole object.
    """
    first = None
    for lineno, text in _json_lines(file, field):
        if first is None:
            first = text
            if file.suffix.lower() == ".json" and not _is_object_line(text):
                return _check_json_document(file, field)
        if text == "{}":
            raise ValueError(f"{field}: {file} line {lineno} is an empty object; each row needs 'prompt' or 'messages'")
        if not text.startswith("{"):
            kind = _JSON_KINDS.get(text[0], "a number" if text[0] in "-0123456789" else "not JSON")
            raise ValueError(f"{field}: {file} line {lineno} is {kind}, not a JSON object; each line must be one row, "
                             'like {"prompt": "..."} (a JSON array of rows belongs in a .json file)')
    if first is None:
        raise ValueError(f"{field}: {file} holds only blank lines; it needs at least one row")
    return "lines"


def _is_object_line(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _json_lines(file: Path, field: str):
    """(line number, stripped text) of each non-blank line; ValueError at the first non-UTF-8 byte."""
    offset = 0
    with file.open("rb") as handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError as error:
                raise ValueError(f"{field}: {file} line {lineno} (byte {offset + error.start}) is not UTF-8; save the "
                                 "file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
            offset += len(raw)
            text = text.lstrip("\ufeff") if lineno == 1 else text
            if text:
                yield lineno, text


def _check_json_document(file: Path, field: str) -> str:
    """A .json file holding one JSON value: an array of row objects, or one object (one row)."""
    data = file.read_bytes()
    try:
        text = data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{field}: {file} line {line} (byte {error.start}) is not UTF-8; save the file as UTF-8") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{field}: {file} line {error.lineno} is not valid JSON ({error.msg}, column {error.colno}); "
                         "fix that line") from None
    rows = value if isinstance(value, list) else [value]
    if not isinstance(value, (list, dict)):
        raise ValueError(f"{field}: {file} holds {_JSON_TYPES[type(value)]}, not rows; give a JSON array of row "
                         'objects, like [{"prompt": "..."}]')
    if not rows or rows == [{}]:
        raise ValueError(f"{field}: {file} holds no rows; it needs at least one row object")
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise ValueError(f"{field}: {file} row {bad} is {_JSON_TYPES[type(rows[bad])]}, not a JSON object; each row must "
                         'be an object, like {"prompt": "..."}')
    return "document"


def _locate_bad_json_line(file: Path, field: str) -> None:
    """Raise naming the first line of a JSON Lines file that does not parse (run only after a failed load)."""
    for lineno, text in _json_lines(file, field):
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{field}: {file} line {lineno} is not valid JSON ({error.msg}, column {error.colno}); "
                             "fix or remove that line") from None


def _check_parquet_readable(file: Path, field: str) -> None:
    import pyarrow.parquet as pq

    try:
        pq.read_table(file)
    except Exception as error:
        raise ValueError(f"{field}: {file} is not a readable parquet file ({_first_line(error)}); write it again, "
                         "e.g. with Dataset.to_parquet") from error


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def check_columns(columns, field: str, where: str | None = None) -> None:
    columns = set(columns)
    if "prompt" not in columns and "messages" not in columns:
        source = f" {where}" if where else ""
        raise ValueError(f"{field}:{source} needs a 'prompt' column (text or chat messages) or a 'messages' column; "
                         f"it has {sorted(columns)}")


