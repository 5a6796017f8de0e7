"""Generation engines are parts (`distill.generation`): HF generate and the lean loop behind one interface,
chosen by `generation_engine`; an engine defined in this file trains end to end with no edit elsewhere."""

from __future__ import annotations

import datasets
import pytest
import torch

from distill import DistillConfig
from distill.generation import (
    AUTO,
    SamplingParams,
    engine_names,
    generate_completions,
    get_engine,
    register_engine,
    unregister_engine,
)
from distill.generation.engine import DecodeRequest, Engine
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import FAST

TOY = "toy_argmax"
CPU = torch.device("cpu")


class ArgmaxLoop(Engine):
    """A toy engine: greedy decoding by a full forward pass per token (no KV cache), counting its calls."""

    name = TOY
    label = "a toy argmax loop"
    auto_order = None  # used only when named

    def __init__(self):
        self.calls = 0

    def refusal(self, model, device):
        return None

    def decode(self, model, request: DecodeRequest):
        self.calls += 1
        sampling, pad_id, suppress_tokens, eos_ids = request.sampling, request.pad_id, request.suppress_ids, request.stop_ids
        ids, mask = request.input_ids.clone(), request.attention_mask.clone()
        new, log_probs = [], []
        done = torch.zeros(ids.shape[0], dtype=torch.bool)
        for _ in range(sampling.max_new_tokens):
            position_ids = (mask.cumsum(1) - 1).clamp_min(0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, -1].float()
            if suppress_tokens:
                logits[:, suppress_tokens] = float("-inf")
            token = logits.argmax(-1)
            token = torch.where(done, torch.full_like(token, pad_id), token)
            new.append(token)
            log_probs.append(torch.log_softmax(logits, -1).gather(1, token.unsqueeze(1)).squeeze(1))
            done |= torch.isin(token, torch.tensor(eos_ids))
            ids = torch.cat([ids, token.unsqueeze(1)], 1)
            mask = torch.cat([mask, torch.ones_like(token).unsqueeze(1)], 1)
            if done.all():
                break
        return torch.stack(new, 1), (torch.stack(log_probs, 1) if request.with_log_probs else None)


class ArgmaxLoopWithItsOwnWeights(ArgmaxLoop):
    """The toy, keeping its own copy of the weights as a served engine (vLLM) would: it decodes that copy,
    never the model it is handed, so it samples from the student only as far as `sync_weights` keeps it."""

    name = TOY + "_copy"
    keeps_weights = True

    def __init__(self):
        super().__init__()
        self.copy, self.synced = None, []

    def sync_weights(self, model):
        import copy

        self.copy = copy.deepcopy(model).eval()
        self.synced.append({n: p.detach().clone() for n, p in model.named_parameters()})

    def decode(self, model, *args, **kwargs):
        assert self.copy is not None, "decode before the first sync_weights"
        return super().decode(self.copy, *args, **kwargs)


@pytest.fixture
def toy_engine():
    engine = register_engine(ArgmaxLoop())
    yield engine
    unregister_engine(TOY)


def test_registration_refuses_what_is_not_a_whole_engine():
    class DuckTyped:
        name, auto_order = "duck", None

        def refusal(self, model, device):
            return None

    class KeepsWeightsWithoutSync(ArgmaxLoop):
        name, keeps_weights = "no_sync", True

    with pytest.raises(TypeError, match="DuckTyped is not a distill.generation.engine.Engine"):
        register_engine(DuckTyped())
    with pytest.raises(TypeError, match="keeps weights but defines no sync_weights"):
        register_engine(KeepsWeightsWithoutSync())
    assert "duck" not in engine_names() and "no_sync" not in engine_names()
    assert ArgmaxLoop().availability() is None and not ArgmaxLoop().keeps_weights


def test_the_built_in_engines_are_registered_in_order_of_preference():
    assert engine_names()[:2] == ("lean", "hf")
    assert get_engine("lean").auto_order < get_engine("hf").auto_order
    with pytest.raises(ValueError, match=r"generation_engine must be 'auto' or one of .* got 'hff' \(did you mean 'hf'\?\)"):
        get_engine("hff")


def test_auto_takes_the_lean_loop_where_it_applies_and_the_same_greedy_tokens_as_generate(tokenizer):
    model = tiny_lm(len(tokenizer), seed=3, eos_token_id=tokenizer.eos_token_id)
    prompts = [[5, 6, 7, 8], [9, 10]]
    greedy = {name: generate_completions(model, prompts, SamplingParams(1.0, 1.0, 0, 8, do_sample=False, engine=name),
                                         [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU)
              for name in (AUTO, "lean", "hf")}
    assert greedy[AUTO] == greedy["lean"] == greedy["hf"]


def test_a_named_engine_that_refuses_the_model_is_an_error(tokenizer):
    model = tiny_lm(len(tokenizer), seed=3, eos_token_id=tokenizer.eos_token_id).double()  # the lean loop is float32 only
    with pytest.raises(ValueError, match="generation_engine lean: .*set generation_engine: auto to fall back"):
        generate_completions(model, [[5, 6]], SamplingParams(1.0, 1.0, 0, 4, engine="lean"), [1], 1, CPU)
    outputs = generate_completions(model, [[5, 6]], SamplingParams(1.0, 1.0, 0, 4, engine=AUTO), [1], 1, CPU)
    assert len(outputs) == 1  # auto falls back to generate


def test_an_engine_defined_in_a_test_file_trains_end_to_end(tokenizer, tmp_path, toy_engine):
    """The student's rollouts (on-policy micro-batches) and the evaluation's samples come from the toy, chosen
    by generation_engine alone; the sampled tokens are its greedy ones."""
    values = {**FAST, "lmbda": 1.0, "output_dir": str(tmp_path / "run"), "generation_engine": TOY, "max_steps": 2}
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    distiller = Distiller(DistillConfig(**values), student=student,
                          teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id),
                          tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)))
    distiller.setup()
    before = {n: p.detach().clone() for n, p in distiller.student_model.named_parameters()}
    micro_batches = distiller.rollout.take(0, {})
    assert toy_engine.calls == 1 and all(mb.source == "student" for mb in micro_batches)
    completion = micro_batches[0].completions[0]
    request = DecodeRequest(torch.tensor([completion.prompt_ids]), torch.ones(1, len(completion.prompt_ids), dtype=torch.long),
                            SamplingParams(1.0, 1.0, 0, 6), distiller.parts.eos_ids, distiller.parts.eos_ids, distiller.parts.pad_id, CPU)
    expected = toy_engine.decode(student, request)[0][0].tolist()
    assert completion.completion_ids == expected[: len(completion.completion_ids)]
    result = distiller.train()
    assert result["steps"] == 2 and toy_engine.calls >= 2
    assert any(not torch.equal(before[n], p.detach()) for n, p in distiller.student_model.named_parameters())


def test_an_engine_with_its_own_weights_is_synced_at_start_and_after_every_optimizer_step(tokenizer, tmp_path):
    engine = register_engine(ArgmaxLoopWithItsOwnWeights())
    try:
        values = {**FAST, "lmbda": 1.0, "output_dir": str(tmp_path / "run"), "generation_engine": engine.name, "max_steps": 3}
        distiller = Distiller(DistillConfig(**values), student=tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id),
                              teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id),
                              tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)))
        initial = {n: p.detach().clone() for n, p in distiller.student_model.named_parameters()}
        distiller.train()
    finally:
        unregister_engine(engine.name)
    assert len(engine.synced) == 1 + 3  # at start, then after each optimizer step
    assert all(torch.equal(initial[n], p) for n, p in engine.synced[0].items())
    final = dict(distiller.student_model.named_parameters())
    assert all(torch.equal(final[n].detach(), p) for n, p in engine.synced[-1].items())
    assert any(not torch.equal(a, b) for a, b in zip(engine.synced[1].values(), engine.synced[2].values()))
    assert engine.calls >= 3  # every step's rollout came from its own copy


def test_the_built_in_engines_need_no_weight_sync():
    from distill.generation.sync import weight_sync

    assert weight_sync(AUTO, None) is None and weight_sync("lean", None) is None and weight_sync("hf", None) is None


def test_an_unknown_engine_fails_before_any_model_loads(tmp_path):
    with pytest.raises(ValueError, match="generation_engine must be 'auto' or one of"):
        DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "generation_engine": "vllm-someday"}).validate()


def test_the_retired_lean_decode_field_says_what_to_write():
    with pytest.raises(ValueError, match="lean_decode is gone: write generation_engine: hf"):
        DistillConfig.from_dict({"lean_decode": False}, "recipe")


def test_the_vllm_engine_without_vllm_installed_fails_before_any_model_loads_naming_the_extra(tmp_path, monkeypatch):
    from distill.generation import vllm_engine
    from tests.helpers.training import forbid_model_loading

    monkeypatch.setattr(vllm_engine, "vllm_installed", lambda: False)
    forbid_model_loading(monkeypatch)
    with pytest.raises(ValueError, match=r"generation_engine vllm needs vLLM, which is not installed; install the optional "
                                         r"extra: pip install -e \"\.\[vllm\]\" on a GPU machine, or bash scripts/install_vllm_cpu\.sh"):
        Distiller(DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "generation_engine": "vllm"}),
                  train_dataset=datasets.Dataset.from_list(chat_rows(4)))


def test_vllm_settings_are_read_only_with_the_vllm_engine(tmp_path):
    with pytest.raises(ValueError, match="vllm_kv_cache_gib is only read with generation_engine: vllm"):
        DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "vllm_kv_cache_gib": 2.0}).validate()


@pytest.mark.parametrize("url", [None, "127.0.0.1:8000"])
def test_the_vllm_server_engine_needs_an_http_address_before_any_model_loads(tmp_path, monkeypatch, url):
    from tests.helpers.training import forbid_model_loading

    forbid_model_loading(monkeypatch)
    with pytest.raises(ValueError, match=r"generation_engine vllm_server needs vllm_server_url, the server's http\(s\) address"):
        Distiller(DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "generation_engine": "vllm_server",
                                   "vllm_server_url": url}), train_dataset=datasets.Dataset.from_list(chat_rows(4)))
    with pytest.raises(ValueError, match="vllm_server_url is only read with generation_engine: vllm_server"):
        DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "vllm_server_url": "http://127.0.0.1:8000"}).validate()


@pytest.mark.parametrize("engine", ["hf", "lean"])
def test_a_stop_set_apart_from_the_end_of_completion_cuts_the_turn_there(tokenizer, engine):
    """`stop_ids` end a turn (a tool call) without ending the completion: the row is cut after the first stop,
    kept, and counts neither as ended (EOS) nor as cut at max_new_tokens."""
    model = tiny_lm(len(tokenizer), layers=2, seed=5, eos_token_id=tokenizer.eos_token_id)
    greedy = SamplingParams(1.0, 1.0, 0, 8, do_sample=False, engine=engine)
    eos = [tokenizer.eos_token_id]
    ids = generate_completions(model, [[3, 4, 5]], greedy, eos, tokenizer.pad_token_id, CPU)[0].ids
    body = [t for t in ids if t not in eos]
    assert len(body) >= 3
    stop = body[1]
    [turn] = generate_completions(model, [[3, 4, 5]], greedy, eos, tokenizer.pad_token_id, CPU, stop_ids=[stop, *eos])
    assert turn.ids == ids[: ids.index(stop) + 1] and not turn.hit_max


@pytest.mark.parametrize("engine", ["lean", "hf"])
def test_seeded_rows_sample_each_row_from_its_own_seed_whatever_the_process_rng_and_the_batch(tokenizer, engine):
    # The asynchronous producer samples in a thread beside training: a row's sample must depend on its seed only.
    model = tiny_lm(len(tokenizer), seed=3)
    prompts = [tokenizer.encode("a b c"), tokenizer.encode("d e"), tokenizer.encode("f g h i")]
    sampling = SamplingParams(1.0, 1.0, 0, 12, engine=engine)

    def sample(rows, rng_seed):
        torch.manual_seed(rng_seed)
        return generate_completions(model, [prompts[r] for r in rows], sampling, [1], 0, CPU, vocab_size=len(tokenizer),
                                    with_log_probs=True, seeds=[100 + r for r in rows], seeded_rows=True)

    whole = sample([0, 1, 2], rng_seed=0)
    assert sample([0, 1, 2], rng_seed=1) == whole  # the process RNG plays no part
    alone = sample([2], rng_seed=5)[0]
    assert alone.ids == whole[2].ids  # nor the other rows of the batch
    assert alone.log_probs == pytest.approx(whole[2].log_probs, abs=1e-5)
    assert len({tuple(sample.ids) for sample in whole}) == 3
    torch.manual_seed(0)  # and the process RNG is left as it was: the draws after sampling are the draws without it
    before = torch.rand(2)
    torch.manual_seed(0)
    generate_completions(model, prompts, sampling, [1], 0, CPU, vocab_size=len(tokenizer), seeds=[1, 2, 3], seeded_rows=True)
    assert torch.equal(torch.rand(2), before)


def test_seeded_rows_draw_the_same_tokens_in_the_lean_loop_and_in_generate(tokenizer):
    model = tiny_lm(len(tokenizer), seed=4)
    prompts = [tokenizer.encode("a b c"), tokenizer.encode("d e f g")]
    outputs = {engine: generate_completions(model, prompts, SamplingParams(0.7, 0.9, 20, 10, engine=engine), [1], 0, CPU,
                                            vocab_size=len(tokenizer), with_log_probs=True, seeds=[7, 8], seeded_rows=True)
               for engine in ("lean", "hf")}
    for lean, hf in zip(outputs["lean"], outputs["hf"]):
        assert lean.ids == hf.ids and lean.hit_max == hf.hit_max
        assert lean.log_probs == pytest.approx(hf.log_probs, abs=1e-4)


def test_seeded_rows_without_seeds_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="seeded_rows needs one seed per prompt"):
        generate_completions(tiny_lm(len(tokenizer)), [[3, 4]], SamplingParams(1.0, 1.0, 0, 4), [1], 0, CPU, seeded_rows=True)
