"""BFCL's type names become JSON Schema's at every depth, as BFCL's own conversion does; the real documents convert
to tools that use JSON Schema's types only."""

from __future__ import annotations

import pytest

from distill.tasks.bfcl.rows import AST_CATEGORIES, entries, installed_data_dir
from distill.tasks.bfcl.schemas import tool_schema

JSON_SCHEMA_TYPES = {"string", "integer", "number", "boolean", "array", "object"}


def test_every_bfcl_type_name_is_converted_at_every_depth():
    document = {"name": "f", "description": "does f", "parameters": {"type": "dict", "required": ["a"], "properties": {
        "a": {"type": "float", "description": "a float", "default": 1.0, "optional": True},
        "b": {"type": "tuple", "items": {"type": "float"}},
        "c": {"type": "dict", "properties": {"d": {"type": "any"}, "e": {"type": "array", "items": {"type": "dict",
                                                                                                    "properties": {"g": {"type": "integer"}}}}}},
        "h": {"description": "no type"}, "i": {"type": "HashMap"}, "j": {"type": "string", "enum": ["x", "y"]}}}}
    tool = tool_schema(document)
    assert tool["type"] == "function" and tool["function"]["name"] == "f" and tool["function"]["description"] == "does f"
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["a"]
    properties = parameters["properties"]
    assert properties["a"] == {"type": "number", "format": "float", "description": "a float", "default": 1.0}
    assert properties["b"] == {"type": "array", "items": {"type": "number", "format": "float"}}
    assert properties["c"]["type"] == "object" and properties["c"]["properties"]["d"] == {"type": "string"}
    assert properties["c"]["properties"]["e"]["items"] == {"type": "object", "properties": {"g": {"type": "integer"}}}
    assert properties["h"]["type"] == "string" and properties["i"]["type"] == "string"  # missing or unknown: text
    assert properties["j"] == {"type": "string", "enum": ["x", "y"]}
    assert document["parameters"]["properties"]["a"]["type"] == "float"  # the document itself is left as it was


@pytest.mark.parametrize("bad, match", [({"parameters": {"type": "dict"}}, "needs a 'name'"),
                                        ({"name": "f", "parameters": {"type": "string"}}, "'parameters' must be")])
def test_a_malformed_document_is_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        tool_schema(bad)


def _walk(schema: dict) -> list[dict]:
    """The schema and every schema under it (properties, items)."""
    found = [schema]
    for value in schema.get("properties", {}).values():
        found += _walk(value)
    if "items" in schema:
        found += _walk(schema["items"])
    return found


def test_every_real_document_converts_to_json_schema_types():
    data = installed_data_dir()
    documents = [f for category in AST_CATEGORIES for entry in entries(data, category) for f in entry["function"]]
    seen = set()
    for document in documents:
        schemas = _walk(tool_schema(document)["function"]["parameters"])
        seen |= {schema["type"] for schema in schemas}
        assert not any("optional" in schema for schema in schemas)
    assert len(documents) > 2000 and seen == JSON_SCHEMA_TYPES
