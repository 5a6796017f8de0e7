"""Which layer set each config field (`distill.config.origins`): a bundled recipe is a base, the user's own file and
flags are theirs, a value changed afterwards is the user's."""

from __future__ import annotations

from distill.config import DistillConfig
from distill.config.origins import COMMAND_LINE, Layer, written
from distill.recipes import recipe_path


def test_a_bundled_recipe_is_a_base_and_the_flags_over_it_are_the_users():
    config = DistillConfig.from_yaml(recipe_path("sdft"), {"eval_before_after": False, "max_steps": 3})
    recipe, flags = config.origins.layers
    assert (recipe.name, recipe.users, flags.name, flags.users, flags.flags) == ("recipe sdft", False, COMMAND_LINE, True, True)
    assert config.origins.set_by_base("eval_dataset", config.eval_dataset) is recipe
    assert config.origins.layer_of("eval_before_after", False) is flags
    assert config.origins.set_by_base("eval_before_after", False) is None
    assert config.origins.layer_of("seed", config.seed) is None  # no layer set it: the default
    assert config.origins.base_value("max_steps", 72) == 72 and config.origins.base_value("method", "gkd") == "sdft"


def test_a_users_own_file_is_theirs_and_a_value_changed_afterwards_too(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("method: sdft\neval_dataset: bundled:facts\n")
    config = DistillConfig.from_yaml(mine)
    assert config.origins.layers[0].name == str(mine) and config.origins.layers[0].users
    assert config.origins.set_by_base("eval_dataset", "bundled:facts") is None
    recipe = DistillConfig.from_yaml(recipe_path("sdft"))
    recipe.eval_dataset = "bundled"
    assert recipe.origins.layer_of("eval_dataset", "bundled") is None  # the recipe's value is gone: the user's now


def test_a_config_of_field_values_has_no_layers():
    assert DistillConfig(method="sdft").origins.layers == ()
    assert DistillConfig.from_dict({"method": "sdft"}).origins.layers == ()


def test_layers_are_typed_and_name_themselves_in_errors():
    config = DistillConfig.from_layers([Layer("recipe x", {"max_steps": "5"}, users=False), Layer(COMMAND_LINE, {"seq_kd": "false"}, flags=True)])
    assert config.max_steps == 5 and config.seq_kd is False
    assert config.origins.layers[0].values["max_steps"] == 5
    try:
        DistillConfig.from_layers([Layer("recipe x", {"max_stepz": 5}, users=False)])
    except ValueError as error:
        assert str(error).startswith("recipe x: unknown config field 'max_stepz'")
    else:
        raise AssertionError("an unknown field is an error")


def test_values_are_quoted_as_the_user_wrote_them():
    assert [written(v) for v in (False, None, 0.0, 3e-4, [], ["a", "b"], 7)] == ["false", "null", "0", "0.0003", '""', "a,b", "7"]
    assert Layer(COMMAND_LINE, {"lmbda": 0.0}, flags=True).quote("lmbda") == "--lmbda 0"
    assert Layer("my.yaml", {"use_peft": False}).quote("use_peft") == "use_peft: false in my.yaml"
