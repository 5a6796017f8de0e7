"""Completion sources: EOS handling, padding, dtypes, the per-micro-batch draw, rollout log-probs."""

import pytest
import torch

from distill.batch import Completion, collate
from distill.generation import SamplingParams, first_eos_mask, generate_completions
from distill.generation.sample import Sample
from distill.methods.mixing import draw_sources
from tests.distributed import run_in_processes

EOS = 1


class ScriptedModel(torch.nn.Module):
    """Stands in for a causal LM whose `generate` appends fixed tokens (pad == eos afterwards)."""

    def __init__(self, continuations):
        super().__init__()
        self.continuations = continuations
        self.calls = []

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, **kwargs):
        self.calls.append({"input_ids": input_ids.clone(), "attention_mask": attention_mask.clone(), **kwargs})
        rows = []
        for continuation in self.continuations[: input_ids.shape[0]]:
            tokens = (continuation + [pad_token_id] * max_new_tokens)[:max_new_tokens]
            rows.append(tokens)
        return torch.cat([input_ids, torch.tensor(rows, dtype=torch.long)], dim=1)


def test_first_eos_is_kept_and_everything_after_is_masked_when_pad_is_eos():
    tokens = torch.tensor([[5, 6, EOS, EOS, EOS], [7, EOS, 8, 9, EOS], [4, 4, 4, 4, 4]])
    mask = first_eos_mask(tokens, [EOS])
    assert mask.tolist() == [[True, True, True, False, False], [True, True, False, False, False], [True] * 5]


def test_generation_keeps_the_terminating_eos_and_flags_cut_completions():
    model = ScriptedModel([[5, 6, EOS], [7, 8, 9, 10, 11, 12], [EOS]])
    sampling = SamplingParams(1.0, 1.0, 0, max_new_tokens=4)
    out = generate_completions(model, [[3, 4], [3], [2, 3, 4]], sampling, [EOS, 99], pad_id=EOS, device=torch.device("cpu"))
    assert out == [Sample([5, 6, EOS], False), Sample([7, 8, 9, 10], True), Sample([EOS], False)]
    call = model.calls[0]
    assert call["input_ids"][1].tolist() == [EOS, EOS, 3]  # left padding
    assert call["attention_mask"][1].tolist() == [0, 0, 1]
    assert call["do_sample"] is True and call["temperature"] == 1.0


def test_collate_is_long_even_for_empty_completions_and_masks_completion_tokens():
    completions = [Completion([3, 4, 5], [], "teacher"), Completion([3], [6, EOS], "teacher")]
    batch = collate(completions, "teacher", pad_id=EOS)
    assert batch.input_ids.dtype == torch.long and batch.attention_mask.dtype == torch.long
    assert batch.input_ids.tolist() == [[3, 4, 5], [3, 6, EOS]]
    assert batch.completion_mask.tolist() == [[False, False, False], [False, True, True]]
    assert batch.num_completion_tokens == 2
    empty = collate([Completion([3], [], "student")], "student", pad_id=EOS)
    assert empty.input_ids.dtype == torch.long and empty.num_completion_tokens == 0


def test_source_draws_follow_lmbda_and_seq_kd():
    assert set(draw_sources(1.0, True, 0, 3, 16)) == {"student"}
    assert set(draw_sources(0.0, True, 0, 3, 16)) == {"teacher"}
    assert set(draw_sources(0.0, False, 0, 3, 16)) == {"dataset"}
    draws = [s for step in range(200) for s in draw_sources(0.3, False, 1, step, 4)]
    assert 0.25 < draws.count("student") / len(draws) < 0.35
    assert draw_sources(0.5, False, 1, 7, 8) == draw_sources(0.5, False, 1, 7, 8)
    assert draw_sources(0.5, False, 1, 7, 8) != draw_sources(0.5, False, 1, 8, 8)


def _draws_on_rank(rank, world_size):
    torch.manual_seed(rank)  # a different global RNG on each rank must not matter
    return [draw_sources(0.5, True, 42, step, 4) for step in range(20)]


def test_draws_are_identical_on_every_process():
    first, second = run_in_processes(_draws_on_rank, world_size=2)
    assert first == second
    assert {s for step in first for s in step} == {"student", "teacher"}


def test_padded_embedding_rows_are_never_sampled(tokenizer):
    """An output embedding padded past the tokenizer (pad_rows) must not yield ids the tokenizer lacks."""
    import torch

    from distill.generation import SamplingParams, generate_completions
    from tests.conftest import tiny_lm

    vocab = len(tokenizer)
    model = tiny_lm(vocab, layers=1, seed=3, eos_token_id=tokenizer.eos_token_id, pad_rows=64)
    with torch.no_grad():  # make the padded rows overwhelmingly likely
        model.lm_head.weight[vocab:] = 50.0 * model.lm_head.weight[:64].sign()
    prompts = [[5, 6, 7]] * 4
    sampling = SamplingParams(1.0, 1.0, 0, 8)
    unguarded = generate_completions(model, prompts, sampling, [tokenizer.eos_token_id], 1, torch.device("cpu"))
    assert any(i >= vocab for sample in unguarded for i in sample.ids)  # the hazard is real
    guarded = generate_completions(model, prompts, sampling, [tokenizer.eos_token_id], 1, torch.device("cpu"), vocab_size=vocab)
    assert all(i < vocab for sample in guarded for i in sample.ids)


def _reference_log_probs(model, prompt, completion, temperature, top_k=0, top_p=1.0):
    """float64, from the definition: logits of a plain forward pass / temperature, top-k then top-p kept, renormalised."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(logits, dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest set whose mass reaches top_p (the token that crosses it included)
        drop_sorted = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (0.9, 0, 0.8)])
def test_rollout_log_probs_are_the_sampling_distribution(tokenizer, temperature, top_k, top_p):
    """Recorded log-probs = log of the distribution each token was drawn from (temperature, top-k, top-p)."""
    from tests.conftest import tiny_lm

    model = tiny_lm(len(tokenizer), layers=2, seed=3, eos_token_id=tokenizer.eos_token_id).eval()
    prompts = [tokenizer("Tell me about the sea.")["input_ids"], tokenizer("Hi")["input_ids"]]
    torch.manual_seed(0)
    outputs = generate_completions(model, prompts, SamplingParams(temperature, top_p, top_k, 12), [tokenizer.eos_token_id],
                                   tokenizer.pad_token_id, torch.device("cpu"), with_log_probs=True)
    for prompt, sample in zip(prompts, outputs):
        ids, log_probs = sample.ids, sample.log_probs
        assert log_probs is not None and len(log_probs) == len(ids) > 0
        expected = _reference_log_probs(model, prompt, ids, temperature, top_k, top_p)
        torch.testing.assert_close(torch.tensor(log_probs, dtype=torch.float64), expected, rtol=1e-4, atol=1e-4)
    # Without the flag the samples have no log-probs.
    assert all(out.log_probs is None for out in generate_completions(model, prompts, SamplingParams(1.0, 1.0, 0, 3), [tokenizer.eos_token_id],
                                                             tokenizer.pad_token_id, torch.device("cpu")))


def test_rollout_log_probs_are_collated_in_completion_token_order():
    completions = [Completion([5, 6], [7, 8, EOS], "student", rollout_log_probs=[-0.1, -0.2, -0.3]),
                   Completion([5], [], "student", rollout_log_probs=[]),
                   Completion([5, 6, 7], [9], "student", rollout_log_probs=[-0.4])]
    batch = collate(completions, "student", pad_id=EOS)
    assert batch.rollout_log_probs.dtype == torch.float32
    assert batch.rollout_log_probs.tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert batch.rollout_log_probs.shape[0] == batch.num_completion_tokens
    assert collate([Completion([5], [7], "dataset")], "dataset", pad_id=EOS).rollout_log_probs is None


def test_checkpoints_keep_samples_in_one_form_and_read_the_forms_written_before_it():
    from distill.conversations.layout import Layout, Segment
    from distill.generation.sample import sample_from_plain, sample_to_plain

    layout = Layout((Segment(2, True), Segment(1, False, ({"role": "tool", "content": "4"},))), " (starts at 3)", 1.0)
    sample = Sample([5, 6, 7], True, [-0.5, -0.25, 0.0], (True, True, False), [1, 2], layout, 3)
    assert sample_from_plain(sample_to_plain(sample)) == sample
    # The synchronous producer's rows before weights versions, trained masks, prompts and layouts were kept.
    assert sample_from_plain({"ids": [5, 6], "hit_max": False, "log_probs": None}) == Sample([5, 6])
    # The asynchronous producer's positional rows: (ids, hit_max[, log_probs[, trained, prompt, layout]]).
    assert sample_from_plain([[5, 6], True]) == Sample([5, 6], True)
    assert sample_from_plain([[5, 6], False, [-0.5, -0.5]]) == Sample([5, 6], False, [-0.5, -0.5])
    assert (sample_from_plain([[5, 6, 7], True, None, [True, True, False], [1, 2], layout.to_plain()])
            == Sample([5, 6, 7], True, None, (True, True, False), [1, 2], layout))
