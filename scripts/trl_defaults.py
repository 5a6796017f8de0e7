"""Write docs/trl_defaults.json: the defaults of the TRL config fields that the "Migrating from TRL" page compares.

The documentation site is built without TRL (the `docs` extra does not install the reference library), so the page
reads TRL's defaults from this committed file, written from an installed `trl` (the `trl` and `test` extras pin
trl==1.16.0):

    python scripts/trl_defaults.py            # writes docs/trl_defaults.json
    python scripts/trl_defaults.py --check    # exit status 1 when the file differs from the installed TRL's defaults

The fields are those of `TRL_CONFIGS` in docs/reference_pages.py (each config's rows and the shared
`TrainingArguments` fields the page lists). A default that is not a JSON value is written as its `repr`.
`tests/test_docs.py` checks that the file is what this script writes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "trl_defaults.json"


def _json_value(value):
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def trl_defaults() -> dict:
    """{"trl": version, "configs": {ConfigName: {"module": ..., "defaults": {field: default}}}} from the installed TRL."""
    sys.path.insert(0, str(ROOT / "docs"))
    from reference_pages import COMMON_FIELDS, TRL_CONFIGS

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # its experimental configs are what is migrated from
    import trl

    configs = {}
    for name, (module, _, rows) in TRL_CONFIGS.items():
        fields = {f.name: f for f in dataclasses.fields(getattr(importlib.import_module(module), name))}
        defaults = {}
        for field_name in [*(row[0] for row in rows), *(c for c, _ in COMMON_FIELDS)]:
            field = fields[field_name]
            if field.default is not dataclasses.MISSING:
                defaults[field_name] = _json_value(field.default)
            elif field.default_factory is not dataclasses.MISSING:
                defaults[field_name] = _json_value(field.default_factory())
        configs[name] = {"module": module, "defaults": defaults}
    return {"trl": trl.__version__, "configs": configs}


def rendered() -> str:
    return json.dumps(trl_defaults(), indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        current = OUT.read_text() if OUT.is_file() else ""
        sys.exit(0 if current == rendered() else f"{OUT} is stale: run python scripts/trl_defaults.py")
    OUT.write_text(rendered())
    print(f"wrote {OUT}")
