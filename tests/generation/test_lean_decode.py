"""distill's lean decode loop against HF generate: greedy tokens, each step's sampling distribution, the sampler,
stopping rules, and the models it leaves to HF generate."""

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    StoppingCriteria,
    StoppingCriteriaList,
)

from distill.generation import SamplingParams, generate_completions
from distill.generation.lean_decode import (
    LlamaDecoder,
    _rms_norm,
    _Rotary,
    lean_generate,
    logits_processors,
    refusal,
    sample_from_logits,
)

CPU = torch.device("cpu")
PAD = 2


def tiny_llama(seed: int = 0, bias: bool = False, vocab: int = 97) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, attention_bias=bias,
                         mlp_bias=bias, initializer_range=0.3, pad_token_id=PAD, eos_token_id=1, bos_token_id=0)
    return LlamaForCausalLM(config).eval()


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


PROMPTS = [[5, 9, 11], [7, 3, 8, 20, 31, 44, 6, 12, 9], [50], [13, 14, 15, 16, 17, 18]]


def hf_greedy(model, ids, mask, new_tokens, eos_ids, **kwargs) -> torch.Tensor:
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD,
                         eos_token_id=eos_ids or None, **kwargs)
    return out[:, ids.shape[1]:]


def lean(model, ids, mask, new_tokens, eos_ids, **kwargs):
    options = dict(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, eos_ids=eos_ids, pad_id=PAD) | kwargs
    return lean_generate(model, ids, mask, max_new_tokens=new_tokens, **options)


@pytest.mark.parametrize("bias", [False, True])
def test_greedy_tokens_equal_hf_generate_with_left_padding_and_early_eos(bias):
    model = tiny_llama(seed=1, bias=bias)
    ids, mask = left_padded(PROMPTS)
    free = hf_greedy(model, ids, mask, 24, [])
    ours, _ = lean(model, ids, mask, 24, [])
    assert torch.equal(ours, free)
    # An EOS that row 0 emits at its 4th step ends rows at different steps; finished rows are padded.
    eos = int(free[0, 3])
    expected = hf_greedy(model, ids, mask, 24, [eos])
    ours, _ = lean(model, ids, mask, 24, [eos])
    assert torch.equal(ours, expected)
    assert (ours[0, 4:] == PAD).all() and ours.shape == expected.shape


def test_suppressed_tokens_are_never_chosen_as_in_generate():
    model = tiny_llama(seed=2)
    ids, mask = left_padded(PROMPTS)
    free, _ = lean(model, ids, mask, 16, [])
    banned = sorted(set(free.flatten().tolist()))[:3]
    ours, _ = lean(model, ids, mask, 16, [], suppress_tokens=banned)
    assert torch.equal(ours, hf_greedy(model, ids, mask, 16, [], suppress_tokens=banned))
    assert not torch.isin(ours, torch.tensor(banned)).any()


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 9, 1.0), (1.3, 0, 0.8), (0.9, 12, 0.9)])
def test_each_steps_processed_scores_equal_generates(temperature, top_k, top_p):
    """Teacher-forced on generate's own samples, the lean decoder's processed scores equal generate's output_scores
    at every step and row: the distribution each token is drawn from is generate's."""
    model = tiny_llama(seed=3)
    ids, mask = left_padded(PROMPTS)
    torch.manual_seed(0)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=True, temperature=temperature,
                         top_k=top_k, top_p=top_p, pad_token_id=PAD, eos_token_id=None, output_scores=True,
                         return_dict_in_generate=True, suppress_tokens=[4, 5])
    tokens = out.sequences[:, ids.shape[1]:]
    processors = logits_processors(True, temperature, top_k, top_p, [4, 5])
    decoder = LlamaDecoder(model, len(PROMPTS), ids.shape[1] + tokens.shape[1])
    with torch.no_grad():
        logits = decoder.prefill(ids, mask)
        for step, expected in enumerate(out.scores):
            scores = processors(out.sequences[:, : ids.shape[1] + step], logits)
            assert torch.equal(torch.isinf(scores), torch.isinf(expected)), f"step {step}: different tokens kept"
            finite = torch.isfinite(expected)
            # float32 rounding of two ways to the same logits: up to 1.1e-5 measured (MKL_CBWR=AUTO,STRICT, conftest)
            torch.testing.assert_close(scores[finite], expected[finite], rtol=1e-5, atol=2e-5)
            logits = decoder.step(tokens[:, step])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_sampler_refuses_rows_that_are_not_a_distribution_as_multinomial_does(bad):
    logits = torch.zeros(2, 5)
    logits[1, 3] = bad
    with pytest.raises(RuntimeError, match="inf.*nan"):
        sample_from_logits(logits)
    with pytest.raises(RuntimeError, match="inf.*nan"):
        sample_from_logits(torch.full((1, 5), float("-inf")))


def test_sampler_draws_softmax_probabilities_and_never_a_masked_token():
    logits = torch.tensor([[float("-inf"), 0.3, -1.0, 2.0, float("-inf"), 0.0, float("-inf")]])
    probs = torch.softmax(logits.double(), dim=-1)[0]
    torch.manual_seed(0)
    draws = 200_000
    tokens = sample_from_logits(logits.expand(draws, -1).contiguous())
    counts = torch.bincount(tokens, minlength=logits.shape[1]).double()
    assert counts[torch.isinf(logits[0])].sum() == 0
    sigma = (probs * (1 - probs) / draws).sqrt()
    assert ((counts / draws - probs).abs() <= 5 * sigma + 1e-12).all(), (counts / draws, probs)


def test_first_token_frequencies_match_generates_distribution():
    """End to end: many rows of one prompt, one sampled token each, against softmax of generate's first scores."""
    model = tiny_llama(seed=4, vocab=23)
    rows = 20_000
    ids, mask = left_padded([[5, 9, 11]] * rows)
    out = model.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=1, do_sample=True, top_k=0,
                         temperature=0.8, pad_token_id=PAD, output_scores=True, return_dict_in_generate=True)
    probs = torch.softmax(out.scores[0][0].double(), dim=-1)
    torch.manual_seed(1)
    tokens, _ = lean(model, ids, mask, 1, [], do_sample=True, temperature=0.8)
    freq = torch.bincount(tokens[:, 0], minlength=probs.shape[0]).double() / rows
    sigma = (probs * (1 - probs) / rows).sqrt()
    assert ((freq - probs).abs() <= 5 * sigma + 1e-12).all()


class StopRowAfter(StoppingCriteria):
    """Ends row r once it holds `base + r + 2` tokens."""

    def __init__(self, base: int):
        self.base = base

    def __call__(self, input_ids, scores, **kwargs):
        lengths = torch.full((input_ids.shape[0],), input_ids.shape[1])
        return lengths >= self.base + torch.arange(input_ids.shape[0]) + 2


def test_stopping_criteria_end_rows_as_in_generate():
    model = tiny_llama(seed=5)
    ids, mask = left_padded(PROMPTS)
    criteria = StoppingCriteriaList([StopRowAfter(ids.shape[1])])
    expected = hf_greedy(model, ids, mask, 20, [1], stopping_criteria=criteria)
    ours, _ = lean(model, ids, mask, 20, [1], stopping_criteria=criteria)
    assert torch.equal(ours, expected)
    assert ours.shape[1] == len(PROMPTS) + 1  # the last row stops at its 5th token, and generation with it


def test_generate_completions_uses_the_lean_loop_unless_told_not_to(monkeypatch):
    import distill.generation.lean as rollout

    model = tiny_llama(seed=6)
    calls = []
    real = rollout.lean_generate
    monkeypatch.setattr(rollout, "lean_generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    greedy = SamplingParams(1.0, 1.0, 0, 10, do_sample=False)
    ours = generate_completions(model, PROMPTS, greedy, [1], PAD, CPU)
    assert calls == [1]
    theirs = generate_completions(model, PROMPTS, SamplingParams(1.0, 1.0, 0, 10, do_sample=False, engine="hf"), [1], PAD, CPU)
    assert calls == [1] and ours == theirs


def test_models_the_lean_loop_cannot_decode_are_named():
    model = tiny_llama()
    assert refusal(model, CPU) is None
    assert "device cuda" in refusal(model, torch.device("cuda"))
    assert "bfloat16" in refusal(tiny_llama().to(torch.bfloat16), CPU)
    penalised = tiny_llama()
    penalised.generation_config.repetition_penalty = 1.3
    assert "repetition_penalty" in refusal(penalised, CPU)
    from transformers import GPT2Config, GPT2LMHeadModel

    assert "GPT2LMHeadModel" in refusal(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)), CPU)


def test_config_turns_the_lean_loop_off_for_training_and_evaluation(tokenizer, tmp_path):
    from tests.helpers.training import make_distiller

    distiller = make_distiller(tokenizer, tmp_path, generation_engine="hf")
    settings = distiller.rollout.settings
    assert settings.student_sampling.engine == settings.teacher_sampling.engine == "hf"


def test_norm_and_rotary_are_bit_identical_to_hf_modules():
    """The loop's one-op RMSNorm and its rotary form must give HF's values exactly, not within a tolerance:
    greedy tokens equal `generate`'s only while every layer's numbers do."""
    from transformers.models.llama.modeling_llama import (
        LlamaRMSNorm,
        apply_rotary_pos_emb,
    )

    generator = torch.Generator().manual_seed(3)
    for hidden_size, scale in [(32, 1.0), (576, 30.0), (577, 1e-3)]:
        norm = LlamaRMSNorm(hidden_size, eps=1e-5)
        norm.weight.data = torch.randn(hidden_size, generator=generator)
        x = torch.randn(4, 7, hidden_size, generator=generator) * scale
        with torch.no_grad():
            assert torch.equal(_rms_norm(norm, x), norm(x))
            assert torch.equal(_rms_norm(norm, x[:, -1]), norm(x[:, -1]))  # a strided view, as the loop passes
    model = tiny_llama(seed=4)
    q = torch.randn(2, 4, 5, 8, generator=generator)
    k = torch.randn(2, 2, 5, 8, generator=generator)
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(q, positions)
        want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
        rotary = _Rotary(cos.unsqueeze(1), sin.unsqueeze(1))
        assert torch.equal(rotary(q), want_q) and torch.equal(rotary(k), want_k)


def test_a_subclassed_final_norm_goes_to_generate():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class ScaledNorm(LlamaRMSNorm):
        def forward(self, hidden_states):
            return 2 * super().forward(hidden_states)

    model = tiny_llama()
    model.model.norm = ScaledNorm(32)
    assert "final norm" in refusal(model, CPU)


def test_lora_layers_and_subclasses_go_to_generate():
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert "PeftModel" in refusal(wrapped, CPU)
    assert "nn.Linear" in refusal(wrapped.base_model.model, CPU)  # the injected layers add to the product

    class Custom(LlamaForCausalLM):
        pass

    assert "Custom" in refusal(Custom(tiny_llama().config), CPU)


def test_hooks_offloaded_weights_and_generation_settings_go_to_generate():
    hooked = tiny_llama()
    hooked.model.layers[1].self_attn.q_proj.register_forward_hook(lambda module, args, out: out * 2)
    assert "model.layers.1.self_attn.q_proj" in refusal(hooked, CPU)
    replaced = tiny_llama()
    replaced.lm_head.forward = lambda x: x
    assert "lm_head" in refusal(replaced, CPU)
    offloaded = tiny_llama()
    offloaded.model.norm.weight = torch.nn.Parameter(torch.empty(32, device="meta"))
    assert "on meta" in refusal(offloaded, CPU)
    checkpointed = tiny_llama()
    checkpointed.gradient_checkpointing_enable()  # its hook only marks the embeddings' output as requiring grad
    assert checkpointed.model.embed_tokens._forward_hooks
    assert refusal(checkpointed, CPU) is None
    configured = tiny_llama()
    configured.generation_config.dola_layers = "high"
    assert "dola_layers" in refusal(configured, CPU)
    no_op = tiny_llama()
    no_op.generation_config.update(num_beams=1, repetition_penalty=1.0, min_length=0, top_k=50, temperature=0.7)
    assert refusal(no_op, CPU) is None  # no-op values, and sampling settings distill always passes explicitly
