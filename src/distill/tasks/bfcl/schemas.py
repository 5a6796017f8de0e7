"""BFCL's function documents as JSON-schema tools (what chat templates and distill's Hermes format show).

BFCL writes a function's parameters as `{"type": "dict", "properties": {...}, "required": [...]}` with its own type
names; a tool schema is JSON Schema. The conversion follows BFCL's own (`GORILLA_TO_OPENAPI` in its model handlers):
`dict` -> `object`, `float` -> `number` (with `"format": "float"`), `tuple` -> `array`, `any` -> `string`, a
missing or unknown type -> `string`, at every depth (`properties`, `items`). BFCL's `optional` flag is dropped (JSON
Schema says it with `required`); every other key (`description`, `enum`, `default`, ...) is kept. The original
documents stay in the row (`bfcl` column): the checker reads BFCL's type names, not these.
"""

from __future__ import annotations

import copy
from typing import Any

JSON_TYPES = {"integer": "integer", "number": "number", "float": "number", "string": "string", "boolean": "boolean",
              "bool": "boolean", "array": "array", "list": "array", "dict": "object", "object": "object",
              "tuple": "array", "any": "string"}


def _converted(schema: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in schema.items() if key not in ("optional", "properties", "items")}
    kind = schema.get("type")
    out["type"] = JSON_TYPES.get(kind, "string") if isinstance(kind, str) else "string"
    if kind == "float":
        out["format"] = "float"
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {name: _converted(value) for name, value in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        out["items"] = _converted(schema["items"])
    return out


def tool_schema(function: dict[str, Any]) -> dict[str, Any]:
    """One BFCL function document as a tool: {"type": "function", "function": {name, description, parameters}};
    ValueError when it has no name or its parameters are not an object."""
    name, parameters = function.get("name"), function.get("parameters")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a BFCL function document needs a 'name', got {function!r}")
    if not isinstance(parameters, dict) or parameters.get("type") not in ("dict", "object"):
        raise ValueError(f"BFCL function {name!r}: 'parameters' must be {{'type': 'dict', 'properties': ...}}, got "
                         f"{parameters!r}")
    converted = _converted(copy.deepcopy(parameters))
    converted.setdefault("properties", {})
    converted["required"] = list(parameters.get("required", []))
    return {"type": "function", "function": {"name": name, "description": function.get("description", ""),
                                             "parameters": converted}}
