"""A model kind defined only here (`distill.models.kinds`): a causal LM that takes one extra per-row input,
`row_feature` (B, F), read from the dataset's `feature` column. It trains with a teacher of the same kind,
evaluates and resumes; the extra reaches the student's and the teacher's forward and generation."""

from __future__ import annotations

import datasets
import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from distill import DistillConfig
from distill.batch import Completion, collate
from distill.generation import SamplingParams, generate_completions
from distill.models.inputs import Extra, collate_extras
from distill.models.kinds import ModelKind, model_kind_of, register_model_kind, unregister_model_kind
from distill.rendering import TextRenderer
from distill.teachers.hidden import backbone_hidden
from distill.training.trainer import Distiller
from tests.conftest import chat_rows
from tests.helpers.training import FAST

FEATURES = 3


class FeatureLlama(LlamaForCausalLM):
    """Llama whose token embeddings are shifted by a projection of a per-row feature vector."""

    def __init__(self, config):
        super().__init__(config)
        self.feature_proj = nn.Linear(FEATURES, config.hidden_size, bias=False)
        self.seen = []  # the row features each forward received

    def embed(self, input_ids, row_feature):
        self.seen.append(row_feature.detach().clone())
        return self.model.embed_tokens(input_ids) + self.feature_proj(row_feature.to(self.feature_proj.weight.dtype))[:, None, :]

    def forward(self, input_ids=None, attention_mask=None, row_feature=None, inputs_embeds=None, **kwargs):
        if row_feature is None:
            raise ValueError("FeatureLlama needs row_feature")
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids, row_feature)
        return super().forward(attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs)


def feature_lm(vocab_size: int, layers: int, seed: int, eos_token_id: int) -> FeatureLlama:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
                         eos_token_id=eos_token_id, pad_token_id=eos_token_id, bos_token_id=0, initializer_range=0.2)
    return FeatureLlama(config)


class FeatureEncoder(TextRenderer):
    def extras(self, example):
        return {"row_feature": Extra(torch.tensor(example.row["feature"], dtype=torch.float32))}


class FeatureKind(ModelKind):
    name = "feature_llama"

    def applies(self, model):
        return isinstance(model, FeatureLlama)

    def encoder(self, tokenizer, max_prompt_length, max_new_tokens, eos_ids, model=None, template_kwargs=None):
        return FeatureEncoder(tokenizer, max_prompt_length, max_new_tokens, eos_ids, template_kwargs)

    def hidden(self, model, input_ids, attention_mask, extras):
        embeds = model.embed(input_ids, extras["row_feature"])
        return model.model(inputs_embeds=embeds, attention_mask=attention_mask, use_cache=False).last_hidden_state


@pytest.fixture
def feature_kind():
    kind = register_model_kind(FeatureKind())
    yield kind
    unregister_model_kind(kind.name)


def feature_rows(n: int) -> list[dict]:
    rows = chat_rows(n)
    for i, row in enumerate(rows):
        row["feature"] = [float(i), -1.0 + 0.5 * i, 2.0]
    return rows


def _config(tmp_path, **overrides) -> DistillConfig:
    values = {**FAST, "output_dir": str(tmp_path / "run"), "lmbda": 0.5, "seq_kd": True, "max_steps": 4, "save_steps": 2,
              "eval_before_after": True, "eval_max_prompts": 4, "eval_max_new_tokens": 4, **overrides}
    return DistillConfig(**values)


def _distiller(tokenizer, tmp_path, resume=False, **overrides):
    student = feature_lm(len(tokenizer), 2, 2, tokenizer.eos_token_id)
    teacher = feature_lm(len(tokenizer), 3, 1, tokenizer.eos_token_id)
    rows = feature_rows(16)
    return Distiller(_config(tmp_path, **overrides), student=student, teacher=teacher, tokenizer=tokenizer,
                     train_dataset=datasets.Dataset.from_list(rows), eval_dataset=datasets.Dataset.from_list(rows[:4]),
                     resume=resume), student, teacher


def test_extras_collate_by_layout_and_refuse_what_cannot_batch():
    rows = [{"f": Extra(torch.ones(2)), "p": Extra(torch.zeros(k, 4), "flat")} for k in (1, 0, 3)]
    batch = collate_extras(rows)
    assert batch["f"].shape == (3, 2) and batch["p"].shape == (4, 4)
    with pytest.raises(ValueError, match="'row' layout"):
        collate_extras([{"f": Extra(torch.ones(2))}, {"f": Extra(torch.ones(3))}])
    with pytest.raises(ValueError, match="different model inputs"):
        collate_extras([{"f": Extra(torch.ones(2))}, {}])
    with pytest.raises(ValueError, match="layout must be one of"):
        Extra(torch.ones(1), "token")


def test_the_kind_is_chosen_by_the_model_and_its_hidden_states_use_the_extra(tokenizer, feature_kind):
    model = feature_lm(len(tokenizer), 2, 0, tokenizer.eos_token_id).eval()
    assert model_kind_of(model) is feature_kind and model_kind_of(nn.Linear(1, 1)).name == "causal_lm"
    rows = [Completion([3, 4, 5], [6, 7], "dataset", extras={"row_feature": Extra(torch.tensor([1.0, 0.0, v]))}) for v in (0.0, 5.0)]
    batch = collate(rows, "dataset", 0)
    with torch.no_grad():
        hidden = backbone_hidden(model, batch.input_ids, batch.attention_mask, batch.extras)
    assert not torch.equal(hidden[0], hidden[1])  # same tokens, different features
    with pytest.raises(ValueError, match="takes token ids only"):
        backbone_hidden(nn.Module(), batch.input_ids, batch.attention_mask, batch.extras)


def test_generation_passes_the_extra_and_an_ids_only_engine_is_refused(tokenizer, feature_kind):
    model = feature_lm(len(tokenizer), 2, 0, tokenizer.eos_token_id)
    extras = [{"row_feature": Extra(torch.tensor([float(i), 0.0, 1.0]))} for i in range(3)]
    prompts = [[3, 4, 5], [3, 4], [5]]
    sampling = SamplingParams(1.0, 1.0, 0, 4)
    model.seen.clear()
    out = generate_completions(model, prompts, sampling, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"),
                               extras=extras, seeds=[1, 2, 3])
    assert len(out) == 3 and model.seen and torch.equal(model.seen[0][:, 0], torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="decodes token ids only"):
        generate_completions(model, prompts, SamplingParams(1.0, 1.0, 0, 4, engine="lean"), [tokenizer.eos_token_id],
                             tokenizer.pad_token_id, torch.device("cpu"), extras=extras, seeds=[1, 2, 3])


def test_a_model_kind_from_a_test_file_trains_evaluates_and_resumes(tokenizer, tmp_path, feature_kind):
    run, _, teacher = _distiller(tokenizer, tmp_path)
    student = run.student_model  # the student as it trains (the run's own copy of the one given)
    student.seen.clear(), teacher.seen.clear()
    result = run.train()
    assert result["steps"] == 4 and "after" in result["eval"]
    features = torch.tensor([row["feature"] for row in feature_rows(16)])
    for model in (student, teacher):  # training, seq_kd sampling, evaluation: every forward got the rows' features
        assert model.seen and all(any(torch.equal(row, f) for f in features) for seen in model.seen for row in seen)
    straight = {n: p.detach().clone() for n, p in student.named_parameters()}

    # Kill after step 2 (the checkpoint), resume: the same weights as the uninterrupted run.
    interrupted, _, _ = _distiller(tokenizer, tmp_path / "b", max_steps=4)
    interrupted.setup()
    window = interrupted._new_window()
    for step in range(2):
        interrupted._train_step_or_checkpoint(step, window, {})
    interrupted.save_checkpoint(2)
    interrupted.state.run.release()
    resumed, _, _ = _distiller(tokenizer, tmp_path / "b", resume=True)
    assert resumed.train()["steps"] == 4
    assert all(torch.equal(straight[n], p) for n, p in resumed.student_model.named_parameters())
