"""BFCL's AST rules for a model's function calls (its Python categories), written from the rules of its checker.

A call is BFCL's decoded form, `{function name: {argument: value}}`; a row's accepted answer is one such mapping per
expected call, each argument mapped to the list of values it accepts. The rules, in the order BFCL applies them
(the first that fails is the verdict; error types are BFCL's names, so the two checkers' verdicts compare):

- count: one call for `simple` and `multiple` rows, as many as the answer has for `parallel` ones;
- the function: the expected one's name (`multiple`: the right one chosen among the row's functions);
- every `required` parameter given; every given argument both declared and in the answer (else unexpected);
- its type, BFCL's type names mapped to Python's (`float` accepts an int, converted; `any` is a string; `tuple` a
  list; `bool` is never an `integer`); a value of another type still passes when it has the type of the answer's
  first non-empty accepted value (BFCL reads that as a variable name); lists are checked one level deep;
- its value: strings compared after `standardize` (spaces and `,./-_*^` removed, lower case, `'` as `"`), lists
  element by element the same way, dicts key by key (a key may be left out when its accepted values hold ""), lists
  of dicts in order, anything else by equality with one accepted value (so 5 == 5.0);
- an answer's argument the call leaves out is accepted only when its accepted values hold "" (optional, omitted).

`parallel` rows match each expected call, in the answer's order, to the first call not yet matched that passes
(BFCL's greedy rule, not a best matching). Java and JavaScript rows convert values from text first; they are not
supported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

Call = dict[str, dict[str, Any]]  # {function name: {argument: value}}
PYTHON_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
                                 "tuple": list, "dict": dict, "any": str}
NESTED_TYPES = ("array", "tuple")
_STANDARDIZED_AWAY = re.compile(r"[ ,./\-_*^]")


@dataclass(frozen=True)
class Verdict:
    """Whether the calls pass; otherwise BFCL's error type and what failed."""

    valid: bool
    error_type: str = ""
    error: str = ""


PASS = Verdict(True)


def standardize(text: str) -> str:
    """BFCL's string normalisation: "April 1, 2024" and "april 1 2024" compare equal."""
    return _STANDARDIZED_AWAY.sub("", text).lower().replace("'", '"')


def _standardized(value: Any) -> Any:
    return standardize(value) if type(value) is str else value


def check_calls(functions: list[dict[str, Any]], calls: list[Call], answer: list[Call], category: str) -> Verdict:
    """The verdict on a row's `calls` given its function documents, its accepted `answer` and its BFCL category
    (dispatched as BFCL does: "parallel" in the name, then "multiple", else simple)."""
    if category.startswith(("simple_java", "simple_javascript")):
        raise ValueError(f"BFCL category {category!r}: Java and JavaScript rows are not supported (only Python's rules)")
    if "parallel" in category:
        return _parallel(functions, calls, answer)
    if "multiple" in category:
        if len(calls) != len(answer):
            return Verdict(False, "multiple_function_checker:wrong_count", f"{len(calls)} calls, expected {len(answer)}")
        return check_call(_document(functions, next(iter(answer[0]))), calls[0], answer[0])
    if len(calls) != 1:
        return Verdict(False, "simple_function_checker:wrong_count", f"{len(calls)} calls, expected 1")
    return check_call(functions[0], calls[0], answer[0])


def _document(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for function in functions:
        if function["name"] == name:
            return function
    raise ValueError(f"the accepted answer calls {name!r}, which the row's functions do not document")


def _parallel(functions: list[dict[str, Any]], calls: list[Call], answer: list[Call]) -> Verdict:
    if len(calls) != len(answer):
        return Verdict(False, "parallel_function_checker_no_order:wrong_count", f"{len(calls)} calls, expected {len(answer)}")
    matched: set[int] = set()
    for index, expected in enumerate(answer):
        document = _document(functions, next(iter(expected)))
        found = next((i for i, call in enumerate(calls) if i not in matched and check_call(document, call, expected).valid),
                     None)
        if found is None:
            return Verdict(False, "parallel_function_checker_no_order:cannot_find_match",
                           f"no call matches expected call {index} ({next(iter(expected))})")
        matched.add(found)
    return PASS


def check_call(document: dict[str, Any], call: Call, expected: Call) -> Verdict:
    """One call against one expected call (`{name: {argument: accepted values}}`) of the function `document`
    describes."""
    accepted_by_argument = next(iter(expected.values()))
    name = document["name"]
    if name not in call:
        return Verdict(False, "simple_function_checker:wrong_func_name", f"function {name!r} not called (got {list(call)})")
    arguments = call[name]
    properties = document["parameters"]["properties"]
    for parameter in document["parameters"].get("required", []):
        if parameter not in arguments:
            return Verdict(False, "simple_function_checker:missing_required", f"missing required parameter {parameter!r}")
    for parameter, value in arguments.items():
        if parameter not in properties or parameter not in accepted_by_argument:
            return Verdict(False, "simple_function_checker:unexpected_param", f"unexpected parameter {parameter!r}")
        verdict = _check_argument(parameter, value, properties[parameter], accepted_by_argument[parameter])
        if not verdict.valid:
            return verdict
    for parameter, accepted in accepted_by_argument.items():
        if parameter not in arguments and "" not in accepted:
            return Verdict(False, "simple_function_checker:missing_optional",
                           f"parameter {parameter!r} left out, but the answer does not mark it optional")
    return PASS


def _check_argument(parameter: str, value: Any, declared: dict[str, Any], accepted: list[Any]) -> Verdict:
    kind = declared.get("type")
    if kind not in PYTHON_TYPES:
        raise ValueError(f"parameter {parameter!r} has type {kind!r}, which BFCL's Python rules do not know")
    expected_type = PYTHON_TYPES[kind]
    items = declared.get("items")
    nested = PYTHON_TYPES.get(str(items.get("type"))) if kind in NESTED_TYPES and isinstance(items, dict) else None
    if kind == "float" and type(value) is int:
        value = float(value)
    verdict, is_variable = _check_type(parameter, value, accepted, expected_type, nested)
    if not verdict.valid:
        return verdict
    if not is_variable:
        if expected_type is dict:
            return _check_dict(parameter, value, accepted)
        if expected_type is list and nested is dict:
            return _check_list_of_dicts(parameter, value, accepted)
        if expected_type is str:
            return _check_value(parameter, standardize(value), [standardize(a) for a in accepted if type(a) is str],
                                "value_error:string", accepted)
        if expected_type is list:
            candidates = [[_standardized(x) for x in a] for a in accepted if isinstance(a, (list, str))]
            return _check_value(parameter, [_standardized(x) for x in value], candidates, "value_error:list/tuple", accepted)
    return _check_value(parameter, value, accepted, "value_error:others", accepted)


def _check_value(parameter: str, value: Any, candidates: list[Any], error_type: str, accepted: list[Any]) -> Verdict:
    if value in candidates:
        return PASS
    return Verdict(False, error_type, f"parameter {parameter!r}: {value!r} is none of {accepted!r}")


def _answer_type(accepted: list[Any]) -> type | None:
    """The type of the first accepted value that is not "" (optional): what a variable's value has."""
    return next((type(a) for a in accepted if a != ""), None)


def _check_type(parameter: str, value: Any, accepted: list[Any], expected: type, nested: type | None) -> tuple[Verdict, bool]:
    """(the type's verdict, whether the answer holds a variable: a value of another type than declared)."""
    answer_type = _answer_type(accepted)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return PASS, is_variable
        for candidate in accepted:  # one candidate whose elements' types every element of the value fits
            if type(candidate) is not list or all(_check_type(parameter, element, candidate, nested, None)[0].valid
                                                 for element in cast(list, value)):
                return PASS, is_variable
        kind = "type_error:nested" if type(value) is answer_type else "type_error:simple"
        return Verdict(False, kind, f"parameter {parameter!r}: an element of {value!r} is not {nested.__name__}"), is_variable
    if answer_type is not None and type(value) is answer_type:
        return PASS, True
    return Verdict(False, "type_error:simple", f"parameter {parameter!r}: {value!r} is not {expected.__name__}"), is_variable


def _check_dict(parameter: str, value: dict[str, Any], accepted: list[Any]) -> Verdict:
    verdict = Verdict(False, "dict_checker:unclear", f"parameter {parameter!r}: no accepted dict")
    for candidate in accepted:
        if candidate == "":
            continue
        verdict = _dict_fits(parameter, value, candidate)
        if verdict.valid:
            return PASS
    return verdict


def _dict_fits(parameter: str, value: Any, candidate: dict[str, list[Any]]) -> Verdict:
    if not isinstance(value, dict):  # an element of a list of dicts that is none (BFCL's checker raises here)
        return Verdict(False, "value_error:dict_value", f"parameter {parameter!r}: {value!r} is not a dict")
    for key, item in value.items():
        if key not in candidate:
            return Verdict(False, "value_error:dict_key", f"parameter {parameter!r}: unexpected key {key!r}")
        if _standardized(item) not in [_standardized(a) for a in candidate[key]]:
            return Verdict(False, "value_error:dict_value", f"parameter {parameter!r}: key {key!r} = {item!r} is none of "
                                                            f"{candidate[key]!r}")
    for key, accepted in candidate.items():
        if key not in value and "" not in accepted:
            return Verdict(False, "value_error:dict_key", f"parameter {parameter!r}: missing key {key!r}")
    return PASS


def _check_list_of_dicts(parameter: str, value: list[Any], accepted: list[Any]) -> Verdict:
    verdict = Verdict(False, "list_dict_checker:unclear", f"parameter {parameter!r}: no accepted list of dicts")
    for candidate in accepted:
        if len(value) != len(candidate):
            verdict = Verdict(False, "value_error:list_dict_count", f"parameter {parameter!r}: {len(value)} dicts, "
                                                                     f"expected {len(candidate)}")
            continue
        for element, wanted in zip(value, candidate):
            verdict = _check_dict(parameter, element, [wanted])
            if not verdict.valid:
                break
        else:
            return PASS
    return verdict
