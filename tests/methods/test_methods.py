"""Methods are registered parts: a toy method defined here trains end to end with no edit anywhere else;
no code outside methods/ branches on a method's name; every config field is read by some part; no import cycle."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import datasets
import pytest
import torch

from distill.config import DistillConfig
from distill.config.io import setting
from distill.config_rules.reads import declared_fields
from distill.losses import DistillLoss
from distill.methods import (
    Method,
    Paper,
    Reads,
    get_method,
    method_names,
    register,
    unregister,
)
from distill.methods.mixing import ALWAYS_ON_POLICY
from distill.rundir.directory import resume_config
from distill.signals import DENSE
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import FAST

SRC = Path(__file__).resolve().parents[2] / "src" / "distill"
TOY = "toy_sampled_nll"


class SampledTokenNLL:
    """A toy objective: the student's negative log-likelihood of the tokens it sampled, weighted by the
    teacher's probability of the same token (so the dense signal is used), plus one metric."""

    signals = frozenset({DENSE})

    def __call__(self, tokens, signal, context) -> DistillLoss:
        student = torch.log_softmax(tokens.head.full_logits(tokens.hidden).float(), dim=-1)
        teacher = torch.log_softmax(signal.head.full_logits(signal.hidden).float(), dim=-1)
        picked = tokens.targets.unsqueeze(1)
        weight = teacher.gather(1, picked).squeeze(1).exp().detach()
        loss = -(weight * student.gather(1, picked).squeeze(1)).sum()
        n = torch.tensor(tokens.targets.numel())
        rollout = tokens.rollout_log_probs
        return DistillLoss(loss, n, None, None, {"toy/rollout_log_prob": (rollout.sum().detach(), n.float())})


class EmaOfEmbedding:
    """A toy step hook: an EMA of the student's embedding matrix (the state a self-teacher would keep)."""

    name = "ema_embedding"

    def __init__(self, student, rate: float):
        self.student, self.rate = student, rate
        self.ema = student.get_input_embeddings().weight.detach().clone()
        self.steps = 0

    def after_optimizer_step(self, step: int) -> None:
        self.ema.mul_(1 - self.rate).add_(self.student.get_input_embeddings().weight.detach(), alpha=self.rate)
        self.steps += 1

    def state_dict(self) -> dict:
        return {"ema": self.ema.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.ema.copy_(state["ema"])
        self.steps = state["steps"]


class ToyMethod(Method):
    """Defined here alone: its own objective, a declared metric, rollout log-probs, an EMA step hook."""

    name = TOY
    summary = "a toy for tests"
    paper = Paper("A Toy Objective", "Nobody, 2026", "0000.00000", "toy2026", "Nobody", "year={2026}")
    reads = (Reads("method toy", ("temperature",)),)
    metrics = ("toy/rollout_log_prob",)

    def __init__(self):
        self.made_hooks: list[EmaOfEmbedding] = []

    def sources(self, config):
        return ALWAYS_ON_POLICY

    def objective(self, config):
        return SampledTokenNLL()

    def records_log_probs(self, config) -> bool:
        return True

    def hooks(self, config, student, teacher) -> list:
        self.made_hooks.append(EmaOfEmbedding(student, rate=0.5))
        return [self.made_hooks[-1]]

    def describe_loss(self, record: dict) -> str:
        return "teacher-weighted NLL of sampled tokens"


@pytest.fixture
def toy_method():
    method = register(ToyMethod())
    yield method, method.made_hooks
    unregister(TOY)


def _toy(tokenizer, tmp_path, name, **overrides):
    """A toy run: the fast test settings less the mixing fields, which the toy method does not read."""
    values = {k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}
    values.update(method=TOY, max_steps=4, save_steps=2, output_dir=str(tmp_path / name / "run"))
    values.update(overrides)
    return Distiller(DistillConfig(**values), student=tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id),
                     teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id), tokenizer=tokenizer,
                     train_dataset=datasets.Dataset.from_list(chat_rows(16)))


def test_a_method_defined_in_a_test_file_trains_end_to_end(tokenizer, tmp_path, toy_method):
    _, hooks = toy_method
    distiller = _toy(tokenizer, tmp_path, "toy")
    before = {n: p.detach().clone() for n, p in distiller.student_model.named_parameters()}
    result = distiller.train()
    for name, weight in distiller.student_model.named_parameters():
        assert not torch.equal(before[name], weight.detach()), name
    # Its declared metric is logged: the mean log-prob of sampled tokens is a log-prob (< 0).
    records = [json.loads(line) for line in (tmp_path / "toy" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["toy/rollout_log_prob"] < 0 for r in records) and len(records) == 4
    assert result["train"]["loss/student"] > 0
    assert hooks[-1].steps == 4
    card = (tmp_path / "toy" / "run" / "model" / "README.md").read_text()
    assert "A Toy Objective" in card and "arXiv:0000.00000" in card and "teacher-weighted NLL" in card
    assert "pypi.org" not in card


def test_a_resumed_run_equals_an_uninterrupted_one_hook_state_included(tokenizer, tmp_path, toy_method):
    _, hooks = toy_method
    straight = _toy(tokenizer, tmp_path, "straight")
    straight.train()
    straight_ema = hooks[-1].ema.clone()

    _toy(tokenizer, tmp_path, "resumed", max_steps=2).train()  # ends at the step-2 checkpoint (constant learning rate)
    assert (tmp_path / "resumed" / "run" / "checkpoints" / "step-000002" / "hooks.pt").is_file()
    assert hooks[-1].steps == 2
    config = resume_config(tmp_path / "resumed" / "run", {"max_steps": 4})
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    teacher = tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id)
    resumed = Distiller(config, student=student, teacher=teacher, tokenizer=tokenizer,
                        train_dataset=datasets.Dataset.from_list(chat_rows(16)), resume=True)
    resumed.train()
    assert hooks[-1].steps == 4
    assert torch.equal(hooks[-1].ema, straight_ema)
    for (name, a), (_, b) in zip(straight.student_model.named_parameters(), resumed.student_model.named_parameters()):
        assert torch.equal(a, b), name


def test_a_method_that_does_not_declare_a_field_rejects_it(toy_method):
    with pytest.raises(ValueError, match="beta is not read by method toy_sampled_nll .methods gkd, gold, on_policy, sdft, sdpo read it"):
        DistillConfig(method=TOY, beta=0.3).validate()
    DistillConfig(method=TOY, temperature=2.0).validate()


def test_every_config_field_is_read_by_some_part_of_some_method():
    fields = {f.name for f in DistillConfig.config_fields()}
    declared = set()
    for name in method_names():
        method = get_method(name)
        for sources in ({"student"}, {"dataset"}, {"teacher"}):
            declared |= declared_fields(method, frozenset(sources))
    assert fields - declared == set()
    assert declared - fields == set(), "a part declares a field that does not exist"


def _python_files():
    return sorted(p for p in SRC.rglob("*.py"))


def test_no_code_outside_methods_branches_on_the_method_name():
    found = []
    for path in _python_files():
        if "methods" in path.relative_to(SRC).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [ast.unparse(part) for part in [node.left, *node.comparators]]
                mentions_method = any(n.endswith(".method") or n.endswith("['method']") or n.endswith('["method"]')
                                      or n == "method" for n in names)
                literal = any(isinstance(part, ast.Constant) and isinstance(part.value, str)
                              for part in [node.left, *node.comparators])
                if mentions_method and literal:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_retired_and_unknown_method_names():
    with pytest.raises(ValueError, match="method 'server' is gone"):
        get_method("server")
    with pytest.raises(ValueError, match="did you mean 'gkd'"):
        get_method("gdk")
    with pytest.raises(ValueError, match="already registered"):
        register(get_method("gkd"))


# -------------------------------------------------------------------- sampling for sampled-token estimators --
ESTIMATORS = [
    ("iw_opd", {}),
    ("sdpo", {}),  # its default loss: sampled-token reverse KL
    ("sdpo", {"distillation_weight": 0.0}),  # GRPO: the policy loss alone
    ("sdpo", {"distillation_weight": 1.0, "distillation_mode": "full_logits", "beta": 0.0, "num_iterations": 2}),
    ("sdft", {"distillation_mode": "sampled_token", "beta": 1.0}),
    ("sdft", {"num_iterations": 2}),  # the importance ratio of reused rollouts
]
BIASED_SAMPLING = [
    ({"sampling_temperature": 0.7}, r"sampling_temperature \(0.7\) and temperature \(1.0\) must be equal"),
    ({"top_p": 0.9}, r"top_p \(0.9\) and top_k \(0\)"),
    ({"top_k": 5}, r"top_p \(1.0\) and top_k \(5\)"),
]


@pytest.mark.parametrize("method, fields", ESTIMATORS)
@pytest.mark.parametrize("sampling, message", BIASED_SAMPLING)
def test_every_sampled_token_estimator_refuses_sampling_it_does_not_differentiate(method, fields, sampling, message):
    """REINFORCE and importance ratios are unbiased only on samples from softmax(z / temperature), untruncated:
    one rule (`distill.methods.sampling_rules`) for every method that has such an estimator."""
    with pytest.raises(ValueError, match=message):
        DistillConfig(method=method, **fields, **sampling).validate()
    DistillConfig(method=method, **fields).validate()


@pytest.mark.parametrize("sampling, _", BIASED_SAMPLING)
def test_a_full_distribution_loss_on_fresh_samples_may_sample_as_it_likes(sampling, _):
    """A divergence over the whole vocabulary on fresh samples estimates nothing from the sampling: allowed."""
    DistillConfig(method="sdft", **sampling).validate()
    DistillConfig(method="sdpo", distillation_weight=1.0, distillation_mode="full_logits", beta=0.0, **sampling).validate()


# ---------------------------------------------------------------------------------------- help texts --
def test_per_method_facts_in_field_help_are_generated_from_the_registry(toy_method):
    """Which methods read a field, their defaults, which can learn from a server or a cache: written by the
    registry, so a method added (here a test's toy) or changed shows up without editing any help text."""
    from distill.cli import fields_help
    from distill.config_rules.help import field_help

    url = field_help("teacher_url")
    assert "Methods that can learn from it: gkd, iw_opd, on_policy" in url  # iw_opd's was missing by hand
    assert TOY not in url  # its objective takes dense signals only
    assert TOY in field_help("temperature").split("Read by ")[1]  # it declares reading temperature
    assert "Methods that can learn from it: gkd." in field_help("teacher_cache")
    assert f"'{TOY}': a toy for tests." in field_help("method")
    assert "Method defaults: gkd 0.5, gold 0.5, on_policy 0.5, sdft 0.0, sdpo 1.0." in field_help("beta")
    assert field_help("num_iterations").endswith("Read by iw_opd, sdft and sdpo.")
    # a condition several methods share is written once, with the methods it holds for
    assert field_help("lmbda").endswith("Read by gkd and gold with on/off-policy mixing.")
    assert field_help("beta").count("gold") == 2  # "by gold with uld_use_hybrid_loss ..." and its default
    assert "Read by" not in field_help("learning_rate")  # every run reads it
    assert field_help("epsilon_low") in fields_help().replace("\n      ", " ")


def test_help_groups_every_field_once_by_the_part_that_reads_it():
    from distill.cli import fields_help
    from distill.config_rules.help import field_groups

    groups = dict(field_groups())
    listed = [name for names in groups.values() for name in names]
    assert sorted(listed) == sorted(DistillConfig.field_names())  # each field once
    assert "learning_rate" in groups["every run"] and "teacher_url" in groups[next(t for t in groups if t.startswith("where"))]
    assert "num_generations" in groups["method sdpo"] and "iw_opd_gamma" in groups["method iw_opd"]
    assert "beta" in groups["several methods (each field's help names which)"]
    assert "read by no registered part" not in groups
    text = fields_help()
    assert text.index("method sdpo:") < text.index("--num_generations") < text.index("several methods")


def test_no_help_text_names_a_method_that_does_not_read_its_field():
    """Hand-written per-method facts go stale (teacher_url's said gkd and on_policy, leaving iw_opd out): a
    field's own help may name only methods that read it."""
    import re

    from distill.config_rules.help import method_readers

    for f in DistillConfig.config_fields():
        if f.name == "method":
            continue
        named = [m for m in method_names() if re.search(rf"\b{m}\b", f.metadata.get("help", ""))]
        readers = [m for m, _ in method_readers(f.name)]
        assert set(named) <= set(readers), (f.name, named, readers)


# ------------------------------------------------------------------------------- a part with settings --
@dataclasses.dataclass
class ScaledFields:
    toy_loss_scale: float = setting(1.0, "The toy's loss multiplier (a setting of a part registered from a test file).")


class ScaledObjective(SampledTokenNLL):
    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, tokens, signal, context) -> DistillLoss:
        out = super().__call__(tokens, signal, context)
        return out._replace(loss_sum=out.loss_sum * self.scale)


class ScaledToy(ToyMethod):
    """The toy method with a setting of its own: declared here, composed into DistillConfig at registration."""

    name = "toy_scaled"
    fields = ScaledFields

    def objective(self, config):
        return ScaledObjective(config.toy_loss_scale)


@pytest.fixture
def scaled_toy():
    method = register(ScaledToy())
    yield method
    unregister(method.name)


def test_a_part_with_its_own_settings_is_configured_from_yaml_and_flags_and_trains(tokenizer, tmp_path, scaled_toy):
    from distill.cli import fields_help, parse_field_flags

    assert "toy_loss_scale" in DistillConfig.field_names() and DistillConfig().toy_loss_scale == 1.0
    assert parse_field_flags(["--toy-loss-scale", "3"]) == {"toy_loss_scale": 3.0}  # flat, coerced to its type
    assert "--toy_loss_scale (default: 1.0)" in fields_help() and "method toy_scaled" in fields_help()
    recipe = tmp_path / "toy.yaml"
    recipe.write_text("method: toy_scaled\ntoy_loss_scale: 2.0\ntemperature: 1.0\n")
    assert DistillConfig.from_yaml(recipe).toy_loss_scale == 2.0
    losses = {}
    for scale in (1.0, 2.0):
        run = _toy(tokenizer, tmp_path, f"scale{scale}", method="toy_scaled", toy_loss_scale=scale, max_steps=1, save_steps=0)
        losses[scale] = run.train()["train"]["loss"]
        assert resume_config(str(tmp_path / f"scale{scale}" / "run")).toy_loss_scale == scale  # config.yaml keeps it
    assert losses[2.0] == pytest.approx(2 * losses[1.0], rel=1e-5)  # the setting reached the objective
    with pytest.raises(ValueError, match="toy_loss_scale is not read by method on_policy"):
        DistillConfig(method="on_policy", toy_loss_scale=2.0).validate()  # no silent field for other methods


def test_a_parts_settings_leave_with_it_and_a_clash_is_refused(scaled_toy):
    @dataclasses.dataclass
    class Clashing:
        beta: float = setting(0.1, "Clashes with the built-in beta.")

    class ClashingToy(ToyMethod):
        name, fields = "toy_clash", Clashing

    with pytest.raises(ValueError, match="Clashing.beta: a config field of that name exists already"):
        register(ClashingToy())
    assert "toy_clash" not in method_names()
    unregister(scaled_toy.name)
    assert "toy_loss_scale" not in DistillConfig.field_names() and not hasattr(DistillConfig, "toy_loss_scale")
    with pytest.raises(TypeError, match="toy_loss_scale"):
        DistillConfig(toy_loss_scale=2.0)
    register(scaled_toy)  # the fixture unregisters it again


def test_distill_train_takes_a_parts_setting_as_a_flag_over_its_yaml_recipe(model_dirs, tmp_path, scaled_toy):
    from distill.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(8)))
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(f"method: toy_scaled\ntoy_loss_scale: 2.0\nteacher: {model_dirs['teacher']}\nstudent: {model_dirs['student']}\n"
                      f"dataset: {data}\nmax_steps: 1\nmax_new_tokens: 4\nmax_prompt_length: 48\nper_device_train_batch_size: 2\n"
                      "gradient_accumulation_steps: 1\neval_before_after: false\nprogress_bar: false\nsave_steps: 0\n")
    assert main(["train", str(recipe), "--toy-loss-scale", "3", "--output_dir", str(tmp_path / "run")]) == 0
    assert resume_config(str(tmp_path / "run")).toy_loss_scale == 3.0  # the flag over the recipe, recorded
