"""The parts' tables: a built-in part is declared by name, settings and import path, its code imported when it is
first used, so that making a config imports no part's code and no torch; a part that leaves an abstract member of
its interface out is refused at registration, naming it; `distill.config` imports leaves only."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from distill.config import DistillConfig, RunFields
from distill.locations.base import TeacherLocation
from distill.locations.registry import register_location
from distill.methods.base import Method, register
from distill.registry import Registry
from tests.test_import_graph import import_graph

SOURCE = Path(__file__).resolve().parent.parent / "src"
FEATURE_FIELDS = ("tools", "environment", "max_turns", "fail_on_token_drift", "tool_timeout", "max_staleness",
                  "staleness_pacing", "staleness_correction", "staleness_ratio", "staleness_ratio_cap",
                  "train_vision_tower", "strict_checks")


def test_making_a_config_imports_no_torch_and_no_part_code():
    code = ("import distill.config as c, sys; c.DistillConfig(); assert 'torch' not in sys.modules; "
            "assert 'distill.methods.gkd' not in sys.modules; assert 'distill.locations.model' not in sys.modules; "
            "assert 'lmbda' in c.DistillConfig.field_names()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(SOURCE)})
    assert done.returncode == 0, done.stderr


def test_the_config_package_imports_only_leaves():
    # distill.recipes: which files are bundled recipes (a base, not the user's own), standard library and yaml only
    leaves = {"distill.registry", "distill.errors", "distill.data_files", "distill.recipes"}
    graph = import_graph()
    for module in (name for name in graph if name == "distill.config" or name.startswith("distill.config.")):
        upward = {target for target in graph[module] if target not in leaves and not target.startswith("distill.config.")}
        assert not upward, f"{module} imports {sorted(upward)}"


def test_the_features_settings_are_their_own_and_keep_their_place():
    core = {f.name for f in dataclasses.fields(RunFields)}
    assert not core & set(FEATURE_FIELDS)
    names = DistillConfig.field_names()
    at = names.index("seq_kd_generation_steps")
    assert names[at + 1:at + 10] == ["tools", "environment", "max_turns", "strict_checks", "fail_on_token_drift",
                                     "tool_timeout", "tool_workers", "tool_memory_gb", "generation_engine"]
    assert names[names.index("generation_engine") + 1] == "max_staleness"
    assert names[names.index("gradient_checkpointing") + 1] == "train_vision_tower"


class HalfMethod(Method):
    name = "half_method"
    summary = "samples, but has no loss"

    def sources(self, config):
        raise AssertionError("never called")


class HalfLocation(TeacherLocation):
    name = "half_location"

    def claims(self, config, method):
        return False


def test_a_method_missing_an_abstract_member_is_refused_naming_it():
    with pytest.raises(TypeError, match="HalfMethod does not implement objective"):
        register(HalfMethod)
    from distill.methods import method_names

    assert "half_method" not in method_names()


def test_a_location_missing_abstract_members_is_refused_naming_them():
    with pytest.raises(TypeError, match="HalfLocation does not implement build, card_title, eval_values, signal_kind"):
        register_location(HalfLocation)


def test_a_declared_part_is_imported_when_first_used_and_checked_against_its_declaration():
    table: Registry[Method] = Registry("toy", "toy", interface="distill.methods.base:Method")
    table.declare("gkd", "distill.methods.gkd:GKD", ())
    assert table.names() == ("gkd",) and table.declared("gkd")
    with pytest.raises(TypeError, match="declares the settings .*'MixingFields'.*its declaration"):
        table.get("gkd")
    from distill.methods.multi_turn_fields import MultiTurnFields

    table.declare("on_policy", "distill.methods.on_policy:OnPolicy", MultiTurnFields)
    assert table.get("on_policy").name == "on_policy" and not table.declared("on_policy")
    table.declare("misnamed", "distill.methods.sft:SFT")
    with pytest.raises(TypeError, match="declared as the toy 'misnamed' but is named 'sft'"):
        table.get("misnamed")


def test_every_built_in_part_imports_as_declared():
    from distill.features import FEATURES
    from distill.generation.registry import ENGINES
    from distill.locations.registry import LOCATIONS
    from distill.methods.base import METHODS
    from distill.models.kinds import MODEL_KINDS

    for table in (ENGINES, LOCATIONS, METHODS, FEATURES, MODEL_KINDS):
        assert table.parts() and not any(table.declared(name) for name in table.names())
    assert [f.name for f in FEATURES.parts()] == ["conversations", "doctor", "async_rollouts", "vision"]
    assert MODEL_KINDS.names() == ("causal_lm", "vision_language")
