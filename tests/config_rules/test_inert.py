"""A recipe's fields that the user's own choices turn off are ignored with a note; the user's own unread fields are refused.

Config level only (no model loads): `DistillConfig.validate()` on configs made of layers, as `distill train RECIPE
--flag value` makes them (`distill.config.origins`). Every bundled recipe with the evaluation turned off, and one case
per conditional "only read with" rule of the registered parts (a test checks that no rule is left without one).
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from distill.cli import main, show_progress_notes
from distill.config import DistillConfig
from distill.config.origins import COMMAND_LINE, Layer
from distill.config_rules.reads import Unread, implicit_reads, run_reads
from distill.locations.registry import locations
from distill.methods.base import get_method, method_names
from distill.recipes import bundled_recipes, recipe_path
from distill.registry import Reads

EVAL_FIELDS = ("eval_dataset", "eval_split", "eval_max_prompts", "eval_max_new_tokens", "eval_batch_size", "eval_examples")
NOTES = "distill.config_rules.checks"


def layered(base: dict, flags: dict, name: str = "recipe test") -> DistillConfig:
    return DistillConfig.from_layers([Layer(name, base, users=False), Layer(COMMAND_LINE, flags, flags=True)])


def validated_with_notes(config: DistillConfig, caplog) -> tuple[DistillConfig, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=NOTES):
        resolved = config.validate()
    return resolved, [r.getMessage() for r in caplog.records if r.name == NOTES]


def default_of(name: str):
    field = next(f for f in DistillConfig.config_fields() if f.name == name)
    return field.default_factory() if callable(field.default_factory) else field.default


@pytest.mark.parametrize("name", [name for name, _ in bundled_recipes()])
def test_every_bundled_recipe_runs_with_the_evaluation_off(name, caplog):
    path = recipe_path(name)
    recipe = DistillConfig.from_yaml(path)
    _, shipped = validated_with_notes(recipe, caplog)
    assert not shipped, f"recipe {name} as shipped gives notes: {shipped}"
    resolved, notes = validated_with_notes(DistillConfig.from_yaml(path, {"eval_before_after": False}), caplog)
    assert resolved.eval_before_after is False
    set_by_recipe = [f for f in EVAL_FIELDS if getattr(recipe, f) != default_of(f)]
    for field in EVAL_FIELDS:
        assert getattr(resolved, field) == default_of(field), field  # config.yaml records what the run reads
    if set_by_recipe:
        assert notes == [f"note: {', '.join(set_by_recipe)} (set by recipe {name}) {'is' if len(set_by_recipe) == 1 else 'are'} "
                         "not read because of --eval_before_after false; ignored"]
    else:
        assert notes == []


def test_the_notes_reach_the_user_on_stderr_as_distills_start_notes(capsys):
    show_progress_notes()
    DistillConfig.from_yaml(recipe_path("sdft"), {"eval_before_after": False}).validate()
    err = capsys.readouterr().err
    assert ("distill: note: eval_dataset, eval_max_new_tokens (set by recipe sdft) are not read because of "
            "--eval_before_after false; ignored") in err


# (what turns the part on, the base layer (a recipe), the user's flags, the field noted, how the cause is quoted)
SWITCHES = [
    ("warmup_steps: 0 (warmup_steps > 0 overrides it)", {"warmup_ratio": 0.1}, {"warmup_steps": 3}, "warmup_ratio",
     "--warmup_steps 3"),
    ("on-policy micro-batches (the student samples; lmbda > 0)", "gkd", {"lmbda": 0.0}, "sampling_temperature", "--lmbda 0"),
    ("on-policy micro-batches (the student samples; lmbda > 0)", {"lmbda_schedule": "constant", "max_staleness": 1},
     {"lmbda": 0.0}, "max_staleness", "--lmbda 0"),
    ("generation_engine: vllm", {"generation_engine": "vllm", "vllm_kv_cache_gib": 2.0}, {"generation_engine": "hf"},
     "vllm_kv_cache_gib", "--generation_engine hf"),
    ("generation_engine: vllm_server", {"generation_engine": "vllm_server", "vllm_server_url": "http://127.0.0.1:9"},
     {"generation_engine": "hf"}, "vllm_server_url", "--generation_engine hf"),
    ("tools or an environment (the tool-call loop)", {"tools": ["distill.tasks.lookup:lookup_code"], "max_turns": 2},
     {"tools": []}, "max_turns", '--tools ""'),
    ("tools or an environment (the tool-call loop) and micro-batches the student samples",
     {"method": "on_policy", "tools": ["distill.tasks.lookup:lookup_code"], "depth_curriculum_interval": 2}, {"tools": []},
     "depth_curriculum_interval", '--tools ""'),
    ("guided_turns_probability > 0 (Guided-OPD)", {"method": "on_policy", "tools": ["distill.tasks.lookup:lookup_code"],
                                                   "guided_turns_probability": 0.5, "guided_turns_decay_fraction": 0.5},
     {"guided_turns_probability": 0.0}, "guided_turns_decay_fraction", "--guided_turns_probability 0"),
    ("step_divergence_weighting: true (SOD)", {"method": "on_policy", "tools": ["distill.tasks.lookup:lookup_code"],
                                               "step_divergence_weighting": True, "step_divergence_delta": 0.3},
     {"step_divergence_weighting": False}, "step_divergence_delta", "--step_divergence_weighting false"),
    ("a teacher that renders its own prompts (a method with another tokenizer's teacher, gold; or a self-teacher, sdft "
     "and sdpo)", {"method": "gold", "teacher_chat_template_kwargs": {"enable_thinking": False}}, {"method": "gkd"},
     "teacher_chat_template_kwargs", "--method gkd"),
    ("max_staleness > 0 (asynchronous rollouts)", {"max_staleness": 1, "staleness_pacing": "drop"}, {"max_staleness": 0},
     "staleness_pacing", "--max_staleness 0"),
    ("use_peft: true", {"use_peft": True, "lora_r": 8}, {"use_peft": False}, "lora_r", "--use_peft false"),
    ("eval_before_after: true", "sdft", {"eval_before_after": False}, "eval_dataset", "--eval_before_after false"),
    ("a tracker (report_to other than none)", {"report_to": "tensorboard", "run_name": "mine"}, {"report_to": "none"},
     "run_name", "--report_to none"),
    ("a server or cache teacher", {"teacher_cache": "caches/x", "teacher_payload": "hidden", "seq_kd": False, "lmbda": 0.0,
                                   "lmbda_schedule": "constant"}, {"teacher_cache": None}, "teacher_payload", "--teacher_cache null"),
    ("a server or cache teacher with teacher_payload: topk", {"teacher_url": "http://127.0.0.1:9", "teacher_logprobs": 10,
     "seq_kd": False}, {"teacher_url": None}, "teacher_logprobs", "--teacher_url null"),
    ("teacher_cache", "offline", {"teacher_url": "http://127.0.0.1:9", "lmbda": 1.0}, "teacher_cache",
     "--teacher_url http://127.0.0.1:9"),
    ("teacher_cache", "server", {"teacher_cache": "caches/x", "lmbda": 0.0, "eval_before_after": False}, "teacher_url", "--teacher_cache caches/x"),
    ("teacher_payload: hidden with a server", {"teacher_url": "http://127.0.0.1:9", "teacher_payload": "hidden", "seq_kd": False,
     "teacher_head": "./head"}, {"teacher_payload": "topk"}, "teacher_head", "--teacher_payload topk"),
    ("teacher_url (a server teacher)", "server", {"teacher_url": None}, "teacher_url", None),  # teacher_url null is the default
    ("teacher_url (a server teacher)", {"teacher_url": "http://127.0.0.1:9", "teacher_timeout": 5.0, "seq_kd": False},
     {"teacher_url": None}, "teacher_timeout", "--teacher_url null"),
    ("a teacher model (no teacher_url / teacher_cache)", "agent", {"teacher_url": "http://127.0.0.1:9", "seq_kd": False},
     "teacher", "--teacher_url http://127.0.0.1:9"),
    ("a teacher model (no teacher_url / teacher_cache)", "agent", {"method": "sft"}, "teacher", "--method sft"),
    ("a non-constant lmbda_schedule", {"lmbda_schedule": "linear", "lmbda_schedule_steps": 10}, {"lmbda_schedule": "constant"},
     "lmbda_schedule_steps", "--lmbda_schedule constant"),
    ("seq_kd: true", "gkd_mixed", {"seq_kd": False}, "teacher_sampling_temperature", "--seq_kd false"),
    ("off-policy micro-batches (lmbda < 1)", {"lmbda_schedule": "constant", "off_policy_beta": 0.3}, {"lmbda": 1.0},
     "off_policy_beta", "--lmbda 1"),
    ("max_staleness > 0 (the student's samples drawn by older weights)", {"max_staleness": 1, "staleness_correction": "icepop"},
     {"max_staleness": 0}, "staleness_correction", "--max_staleness 0"),
    ("uld_use_hybrid_loss: true (plain ULD has no beta)", {"method": "gold", "uld_use_hybrid_loss": True,
     "uld_hybrid_matched_weight": 0.5, "uld_hybrid_unmatched_weight": 0.5}, {"uld_use_hybrid_loss": False},
     "uld_hybrid_matched_weight", "--uld_use_hybrid_loss false"),
    ("uld_use_hybrid_loss: true and off-policy micro-batches", {"method": "gold", "uld_use_hybrid_loss": True,
     "lmbda_schedule": "constant", "off_policy_beta": 0.3}, {"lmbda": 1.0}, "off_policy_beta", "--lmbda 1"),
    ("num_iterations > 1 or max_staleness > 0 (with fresh rollouts the ratio is 1)", {"method": "iw_opd", "num_iterations": 2,
     "epsilon_low": 0.1}, {"num_iterations": 1}, "epsilon_low", "--num_iterations 1"),
    ("teacher_warmup_steps > 0 (teacher-sampled warm-up)", "iw_opd", {"teacher_warmup_steps": 0}, "teacher_sampling_temperature",
     "--teacher_warmup_steps 0"),
    ("teacher_model_kind: ema", {"method": "sdft", "teacher_update_rate": 0.1}, {"teacher_model_kind": "base"},
     "teacher_update_rate", "--teacher_model_kind base"),
    ("distillation_mode: topk_logits", {"method": "sdft", "distillation_mode": "topk_logits", "distillation_topk": 50},
     {"distillation_mode": "full_logits"}, "distillation_topk", "--distillation_mode full_logits"),
    ("num_iterations > 1 or max_staleness > 0 on the student's samples (fresh rollouts have ratio 1)",
     {"method": "sdft", "num_iterations": 2, "distillation_is_clip": 3.0}, {"num_iterations": 1}, "distillation_is_clip",
     "--num_iterations 1"),
    ("generate_from_teacher: true", {"method": "sdft", "generate_from_teacher": True, "teacher_sampling_temperature": 0.5},
     {"generate_from_teacher": False}, "teacher_sampling_temperature", "--generate_from_teacher false"),
    ("generate_from_teacher with teacher_model_kind base (a frozen teacher samples ahead)",
     {"method": "sdft", "generate_from_teacher": True, "teacher_model_kind": "base", "seq_kd_generation_steps": 2},
     {"teacher_model_kind": "ema"}, "seq_kd_generation_steps", "--teacher_model_kind ema"),
    ("reward_funcs with 'regex'", {"method": "sdpo", "reward_funcs": ["regex"], "reward_regex": r"\d+"},
     {"reward_funcs": ["contains_answer"]}, "reward_regex", "--reward_funcs contains_answer"),
    ("distillation_weight < 1 (a policy loss)", "grpo", {"distillation_weight": 1.0}, "loss_type", "--distillation_weight 1"),
    ("distillation_weight < 1 with num_iterations > 1 or max_staleness > 0 (the PPO ratio clip)",
     {"method": "sdpo", "distillation_weight": 0.5, "num_iterations": 2, "epsilon_low": 0.1}, {"num_iterations": 1},
     "epsilon_low", "--num_iterations 1"),
    ("distillation_weight > 0 (a self-teacher)", {"method": "sdpo", "include_feedback": True}, {"distillation_weight": 0.0},
     "include_feedback", "--distillation_weight 0"),
    ("distillation_weight > 0 with include_feedback", {"method": "sdpo", "include_feedback": True,
     "feedback_only_without_solution": True}, {"include_feedback": False}, "feedback_only_without_solution",
     "--include_feedback false"),
    ("distillation_weight > 0 with teacher_model_kind: ema", {"method": "sdpo", "teacher_update_rate": 0.1},
     {"teacher_model_kind": "base"}, "teacher_update_rate", "--teacher_model_kind base"),
    ("distillation_weight > 0 with distillation_mode: topk_logits", {"method": "sdpo", "distillation_mode": "topk_logits",
     "distillation_topk": 50}, {"distillation_mode": "sampled_token"}, "distillation_topk", "--distillation_mode sampled_token"),
    ("distillation_weight > 0 with num_iterations > 1 or max_staleness > 0", {"method": "sdpo", "num_iterations": 2,
     "distillation_is_clip": 3.0}, {"num_iterations": 1}, "distillation_is_clip", "--num_iterations 1"),
    ("eval_before_after: true (the evaluation's teacher is the initial model shown the row's context)",
     {"method": "sft", "max_teacher_prompt_length": 300}, {"eval_before_after": False}, "max_teacher_prompt_length",
     "--eval_before_after false"),
    (None, "sdft", {"method": "sft", "teacher_model_kind": "ema"}, None, None),  # sft reads sdft's teacher fields: nothing to note
    (None, {"method": "gkd", "lmbda": 0.3}, {"method": "on_policy"}, "lmbda", "--method on_policy"),
    (None, {"method": "sdpo", "num_generations": 4}, {"method": "sdft"}, "num_generations", "--method sdft"),
]


def _base(base) -> Layer:
    if isinstance(base, str):
        return Layer(f"recipe {base}", DistillConfig.from_yaml(recipe_path(base)).origins.layers[0].values, users=False)
    return Layer("recipe test", base, users=False)


@pytest.mark.parametrize("needs, base, flags, field, cause", SWITCHES,
                         ids=[f"{case[4] or 'nothing'}->{case[3]}" for case in SWITCHES])
def test_a_switch_the_user_turns_off_ignores_the_recipes_fields_of_that_part(needs, base, flags, field, cause, caplog):
    layer = _base(base)
    config = DistillConfig.from_layers([layer, Layer(COMMAND_LINE, flags, flags=True)])
    resolved, notes = validated_with_notes(config, caplog)
    if cause is None:
        assert not [n for n in notes if field is not None and n.startswith(f"note: {field} ")], notes
        return
    assert any(n.startswith("note: ") and f" {field}" in n.split("(set by")[0].replace("note:", " ").replace(",", " ")
               and f"(set by {layer.name})" in n and n.endswith(f"because of {cause}; ignored") for n in notes), notes
    assert getattr(resolved, field) == get_method(resolved.method).defaults.get(field, default_of(field))
    # The same field given by the user with the same switch is refused, naming it (the rule the note stands for).
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        DistillConfig.from_layers([layer, Layer(COMMAND_LINE, {**flags, field: layer.values[field]}, flags=True)]).validate()


def conditional_needs() -> set[str]:
    """What turns on each conditional part of every registered method's run: the `needs` of every `Reads` with a
    condition (the run's, the engines', the features', the locations', the methods' own)."""
    every = frozenset({"student", "dataset", "teacher"})
    parts: list[Reads] = list(run_reads(every))
    for name in method_names():
        method = get_method(name)
        parts += [*method.reads, *implicit_reads(method, every)]
    parts += [part for location in locations() for part in location.reads]
    return {part.needs for part in parts if part.when is not Reads.when}


def test_every_conditional_rule_has_a_switch_case():
    covered = {case[0] for case in SWITCHES if case[0] is not None}
    assert conditional_needs() <= covered, f"rules without a case in SWITCHES: {conditional_needs() - covered}"
    assert covered <= conditional_needs(), f"cases for rules that are gone: {covered - conditional_needs()}"


def test_a_field_the_user_set_that_their_own_switch_turns_off_is_refused(tmp_path, caplog):
    with pytest.raises(ValueError, match="^eval_max_prompts is only read with eval_before_after: true"):
        DistillConfig.from_yaml(recipe_path("sdft"), {"eval_before_after": False, "eval_max_prompts": 5}).validate()
    # The user's own config file is theirs, as their flags are: nothing in it is ignored.
    mine = tmp_path / "mine.yaml"
    mine.write_text(recipe_path("sdft").read_text())
    with pytest.raises(ValueError, match="^eval_dataset is only read with eval_before_after: true"):
        DistillConfig.from_yaml(mine, {"eval_before_after": False}).validate()
    # Fields passed from Python are the user's.
    with pytest.raises(ValueError, match="^eval_dataset is only read with"):
        DistillConfig(method="sdft", eval_dataset="bundled:facts", eval_before_after=False).validate()
    # A value changed on the config after it was read is the user's too.
    config = DistillConfig.from_yaml(recipe_path("gkd"))
    config.sampling_temperature = 0.7
    config.lmbda = 0.0
    with pytest.raises(ValueError, match="^sampling_temperature is only read with"):
        config.validate()
    # ...and a switch flipped that way still lets the recipe's field go, quoted as the code set it.
    config = DistillConfig.from_yaml(recipe_path("sdft"))
    config.eval_before_after = False
    _, notes = validated_with_notes(config, caplog)
    assert notes and notes[0].endswith("because of eval_before_after: false; ignored")


def test_a_recipe_field_nothing_of_the_users_turns_off_is_refused():
    """A recipe that sets a field it also turns off itself is wrong as written: nothing the user did is to blame."""
    with pytest.raises(ValueError, match="^eval_max_prompts is only read with"):
        layered({"eval_before_after": False, "eval_max_prompts": 5}, {}).validate()
    with pytest.raises(ValueError, match="^eval_max_prompts is only read with"):
        layered({"eval_before_after": False, "eval_max_prompts": 5}, {"max_steps": 3}).validate()


def test_the_command_line_ignores_a_recipes_field_and_refuses_the_users(capsys, monkeypatch, tmp_path):
    seen = []

    class Validating:
        def __init__(self, config, **kwargs):
            seen.append(config.validate())

        def train(self):
            return {"run_dir": "nowhere"}

    import distill.training.trainer as trainer

    monkeypatch.setattr(trainer, "Distiller", Validating)
    run = str(tmp_path / "run")
    assert main(["train", "gkd", "--lmbda", "0", "--output_dir", run]) == 0
    assert seen[-1].sampling_temperature == 1.0 and seen[-1].lmbda == 0.0
    assert ("distill: note: sampling_temperature (set by recipe gkd) is not read because of --lmbda 0; ignored"
            in capsys.readouterr().err)
    assert main(["train", "gkd", "--lmbda", "0", "--sampling_temperature", "0.9", "--output_dir", run]) == 2
    assert "sampling_temperature is only read with on-policy micro-batches" in capsys.readouterr().err


def test_a_resumed_run_takes_its_recorded_config_as_the_base(tmp_path, caplog):
    from distill.rundir.directory import resume_config

    resolved = DistillConfig.from_yaml(recipe_path("sdft"), {"output_dir": str(tmp_path)}).validate()
    import yaml

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(resolved)))
    again, notes = validated_with_notes(resume_config(tmp_path), caplog)
    assert notes == [] and again == resolved
    off, notes = validated_with_notes(resume_config(tmp_path, {"eval_before_after": False}), caplog)
    assert notes == [f"note: eval_dataset, eval_max_new_tokens (set by {tmp_path / 'config.yaml'}) are not read because of "
                     "--eval_before_after false; ignored"]
    # What a run with the evaluation off records resumes without a note.
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(off)))
    assert validated_with_notes(resume_config(tmp_path), caplog) == (off, [])


def test_unread_refusals_keep_their_words():
    method = get_method("on_policy")
    assert Unread("lmbda", None, ("gkd", "gold")).refusal(method) == (
        "lmbda is not read by method on_policy (methods gkd, gold read it); this configuration would ignore it. Remove it.")
    assert Unread("lora_r", "use_peft: true").refusal(method).startswith("lora_r is only read with use_peft: true;")
