"""DistillConfig: YAML recipes, command-line flags, validation messages."""

import pytest

from distill.cli import fields_help, main, parse_field_flags
from distill.config import DistillConfig
from distill.methods import get_method
from distill.methods.mixing import beta_for
from distill.models import parse_student_init


def test_yaml_recipe_and_flags_override_in_order(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("beta: 0.2\nmax_steps: 7\nseq_kd: true\nuse_peft: true\nlora_target_modules: [q_proj]\n")
    flags = parse_field_flags(["--beta", "0.9", "--per-device-train-batch-size", "3", "--seq_kd", "--learning_rate=3e-5"])
    config = DistillConfig.from_yaml(recipe, flags).validate()
    assert config.beta == 0.9 and config.max_steps == 7 and config.seq_kd is True
    assert config.per_device_train_batch_size == 3 and config.learning_rate == 3e-5
    assert config.lora_target_modules == ["q_proj"]


def test_unknown_field_suggests_the_closest_name(tmp_path):
    with pytest.raises(ValueError, match="did you mean 'learning_rate'"):
        parse_field_flags(["--learning_rat", "1e-4"])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lambda: 0.5\n")
    with pytest.raises(ValueError, match="unknown config field 'lambda'.*did you mean 'lmbda'"):
        DistillConfig.from_yaml(recipe)


def test_yaml_that_does_not_parse_is_a_clear_error(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("beta: [0.5\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        DistillConfig.from_yaml(recipe)
    recipe.write_text("- beta\n- 0.5\n")
    with pytest.raises(ValueError, match="mapping"):
        DistillConfig.from_yaml(recipe)


def test_values_of_the_wrong_type_name_the_field():
    with pytest.raises(ValueError, match="max_steps"):
        parse_field_flags(["--max_steps", "ten"])
    with pytest.raises(ValueError, match="seq_kd"):
        DistillConfig.from_dict({"seq_kd": "maybe"})


@pytest.mark.parametrize(
    "values, name",
    [
        ({"method": "magic"}, "method"),
        ({"beta": 1.5}, "beta"),
        ({"beta": -0.1}, "beta"),
        ({"lmbda": 2}, "lmbda"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
        ({"temperature": 0}, "temperature"),
        ({"lmbda_schedule": "cosine"}, "lmbda_schedule"),
        ({"student_init": "drop_every:1"}, "student_init"),
        ({"report_to": "wandb,nope"}, "report_to"),
        ({"method": "on_policy", "lmbda": 0.2}, "lmbda is not read by method on_policy \\(methods gkd, gold read it\\)"),
    ],
)
def test_validation_names_the_field(values, name):
    with pytest.raises(ValueError, match=name):
        DistillConfig.from_dict(values).validate()


def test_lmbda_schedules():
    def plan(**values):
        config = DistillConfig(**values)
        return get_method(config.method).sources(config)

    linear = plan(lmbda=1.0, lmbda_schedule="linear", lmbda_start=0.0, lmbda_schedule_steps=10)
    assert [linear.lmbda(s) for s in (0, 5, 10, 20)] == [0.0, 0.5, 1.0, 1.0]
    step = plan(lmbda=0.5, lmbda_schedule="step", lmbda_start=0.0, lmbda_schedule_steps=3)
    assert [step.lmbda(s) for s in (0, 2, 3)] == [0.0, 0.0, 0.5]
    assert plan(method="on_policy").lmbda(0) == 1.0 and plan(method="on_policy").possible() == {"student"}
    default = DistillConfig()
    assert plan().lmbda(0) == 0.0 and plan().lmbda(default.lmbda_schedule_steps) == default.lmbda
    assert plan(lmbda=0.0, lmbda_schedule="constant", seq_kd=False).possible() == {"dataset"}
    assert beta_for(DistillConfig(beta=0.5, off_policy_beta=0.0))("teacher") == 0.0
    assert beta_for(DistillConfig(beta=0.5, off_policy_beta=0.0))("student") == 0.5
    assert beta_for(DistillConfig(beta=0.5, off_policy_beta=None))("dataset") == 0.5


def test_student_init_forms():
    assert parse_student_init("drop_every:3") == ("drop_every", 3)
    assert parse_student_init("layers:0,2,5") == ("layers", [0, 2, 5])
    with pytest.raises(ValueError, match="student_init"):
        parse_student_init("half")


def test_train_help_lists_every_field_with_its_help(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for name in DistillConfig.field_names():
        assert f"--{name}" in out
    assert "Loss temperature" in fields_help()


def test_cli_reports_config_errors_without_a_traceback(capsys):
    assert main(["train", "--bta", "0.5"]) == 2
    assert "did you mean 'beta'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "values, name",
    [
        ({"lora_r": 8}, "lora_r"),
        ({"seq_kd": False, "lmbda": 1.0, "teacher_top_p": 0.9}, "teacher_top_p"),
        ({"lmbda_schedule": "constant", "lmbda_start": 0.2}, "lmbda_start"),
        ({"lmbda": 1.0, "lmbda_schedule": "constant", "off_policy_beta": 0.3}, "off_policy_beta"),
        ({"lmbda": 0.0, "seq_kd": True, "sampling_temperature": 0.7}, "sampling_temperature"),
        ({"eval_before_after": False, "eval_max_prompts": 5}, "eval_max_prompts"),
    ],
)
def test_fields_this_configuration_would_ignore_are_rejected(values, name):
    with pytest.raises(ValueError, match=f"{name} is only read with"):
        DistillConfig(**values).validate()


def test_fields_that_are_read_are_accepted():
    DistillConfig(use_peft=True, lora_r=8).validate()
    DistillConfig(seq_kd=True, teacher_top_p=0.9, lmbda=0.5, off_policy_beta=0.0).validate()
    DistillConfig(lmbda_schedule="linear", lmbda_start=0.2, lmbda_schedule_steps=10).validate()
    DistillConfig(method="on_policy", beta=1.0).validate()


@pytest.mark.parametrize("values, match", [
    ({"eval_before_after": False, "eval_split": "test"}, "eval_split is only read with eval_before_after: true"),
    ({"eval_before_after": False, "eval_dataset": "x.jsonl"}, "eval_dataset is only read with eval_before_after: true"),
    ({"run_name": "mine"}, "run_name is only read with a tracker"),
    ({"warmup_steps": 5, "warmup_ratio": 0.1}, "warmup_ratio is only read with warmup_steps: 0"),
    ({"teacher_url": "http://h:1", "teacher_cache": "/c", "seq_kd": False}, "one teacher location"),
])
def test_fields_nothing_reads_are_rejected(values, match):
    with pytest.raises(ValueError, match=match):
        DistillConfig(**values).validate()


def test_the_config_module_is_a_leaf():
    """`import distill.config` pulls in neither torch nor any method's or location's code, only the field
    declarations beside the methods: a method module may import it to type its config, and tools that only
    read or write configs stay light."""
    import subprocess
    import sys

    probe = ("import sys, distill.config; "
             "code = sorted(m for m in sys.modules if m == 'torch' or m.startswith('distill.locations') or "
             "(m.startswith('distill.methods.') and not m.endswith('fields') and m not in "
             "('distill.methods.base', 'distill.methods.sdpo', 'distill.methods.sdpo.reprompts', "
             "'distill.methods.self_teacher_prompts'))); "
             "assert not code, code")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_validation_resolves_the_methods_defaults_into_a_copy():
    """validate() returns the resolved config and leaves the one it was given as written."""
    config = DistillConfig(method="sdpo", dataset="bundled:arithmetic", reward_funcs=["contains_answer"])
    resolved = config.validate()
    assert config.beta is None and config.distillation_mode is None
    assert resolved.beta == 1.0 and resolved.distillation_mode == "sampled_token"
    assert resolved is not config and resolved.validate() == resolved


def test_template_arguments_from_yaml_and_flags_for_student_and_teacher(tmp_path):
    """`chat_template_kwargs` (the student's, read by every run) and `teacher_chat_template_kwargs` (a teacher that
    renders its own prompts): a mapping in YAML, JSON on the command line; bad values name the field."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: sdft\nchat_template_kwargs:\n  enable_thinking: false\n  date_string: 01 Jan 2025\n")
    flags = parse_field_flags(["--teacher-chat-template-kwargs", '{"enable_thinking": true}'])
    config = DistillConfig.from_yaml(recipe, flags).validate()
    assert config.chat_template_kwargs == {"enable_thinking": False, "date_string": "01 Jan 2025"}
    assert config.teacher_template_kwargs() == {"enable_thinking": True}
    assert DistillConfig.from_dict({"chat_template_kwargs": {"x": 1}}).teacher_template_kwargs() == {"x": 1}  # None: the student's
    assert parse_field_flags(["--chat_template_kwargs={}"]) == {"chat_template_kwargs": {}}
    with pytest.raises(ValueError, match=r"command line: field 'chat_template_kwargs' expects a mapping as JSON"):
        parse_field_flags(["--chat_template_kwargs", "enable_thinking=false"])
    with pytest.raises(ValueError, match="field 'chat_template_kwargs' expects a mapping of names to values"):
        DistillConfig.from_dict({"chat_template_kwargs": [1, 2]})
    with pytest.raises(ValueError, match=r"chat_template_kwargs: 'tools' is set by the run's tools"):
        DistillConfig(chat_template_kwargs={"tools": []}).validate()
    with pytest.raises(ValueError, match=r"teacher_chat_template_kwargs: 'add_generation_prompt' is set by distill"):
        DistillConfig(method="sdft", teacher_chat_template_kwargs={"add_generation_prompt": True}).validate()
    # A teacher with the student's tokenizer scores the student's rendering: its own arguments would be ignored.
    with pytest.raises(ValueError, match=r"teacher_chat_template_kwargs is only read with a teacher that renders its "
                                         r"own prompts"):
        DistillConfig(method="gkd", teacher_chat_template_kwargs={"enable_thinking": True}).validate()
    DistillConfig(method="gold", teacher_chat_template_kwargs={"enable_thinking": True}).validate()
