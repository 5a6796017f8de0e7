"""BFCL's own AST checker, run in this process: the twin distill's checker is compared with.

`bfcl_eval.eval_checker.ast_eval.ast_checker` imports `bfcl_eval.constants.model_config` for one mapping (which model
writes dotted function names with underscores), and that module imports every API client BFCL supports (the
package's full dependencies, which the test environment does not install: `pip install --no-deps bfcl-eval`). A
stand-in module whose mapping keeps every name as written is put in its place while the checker loads (and taken
away after); the checker's code itself is BFCL's, unchanged.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

MODEL = "distill-twin"  # a model name for BFCL's checker; its names are kept as written (dots and all)


class _KeepsNames:
    underscore_to_dot = False


class _EveryModel(dict):
    def __missing__(self, name: str) -> _KeepsNames:
        return _KeepsNames()


CHECKER, CONFIG = "bfcl_eval.eval_checker.ast_eval.ast_checker", "bfcl_eval.constants.model_config"


def _checker_module():
    loaded = sys.modules.get(CHECKER)
    if loaded is not None:
        return loaded
    saved = sys.modules.get(CONFIG)
    stand_in = types.ModuleType(CONFIG)
    stand_in.MODEL_CONFIG_MAPPING = _EveryModel()  # type: ignore[attr-defined]
    sys.modules[CONFIG] = stand_in
    try:
        return importlib.import_module(CHECKER)
    finally:
        if saved is None:
            del sys.modules[CONFIG]
        else:
            sys.modules[CONFIG] = saved


def official_verdict(functions: list[dict[str, Any]], calls: list[dict[str, Any]], answer: list[dict[str, Any]],
                     category: str) -> tuple[bool, str]:
    """(valid, error type) by BFCL's own checker ("" for a valid answer)."""
    from bfcl_eval.constants.enums import Language

    module = _checker_module()
    result = module.ast_checker(functions, calls, answer, Language.PYTHON, category, MODEL)
    return bool(result["valid"]), "" if result["valid"] else result.get("error_type", "")
