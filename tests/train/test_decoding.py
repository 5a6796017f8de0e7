"""The lean sampling loop (`distill.decoding`) against HF `generate`: identical greedy tokens, identical seeded
samples, and the first step's empirical distribution against the exact (filtered) softmax."""

from __future__ import annotations

import pytest
import torch

from distill.decoding import process_scores, sample
from tests.conftest import tiny_lm

VOCAB, EOS, PAD = 96, 1, 0


def _prompts(seed: int = 0, lengths=(5, 9, 3, 7)) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts of unequal lengths."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(2, VOCAB, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids, mask


def _model(pad_rows: int = 0):
    return tiny_lm(VOCAB, layers=2, seed=3, eos_token_id=EOS, pad_rows=pad_rows).eval()


def _generate(model, ids, mask, new_tokens, **sampling):
    do_sample = sampling.pop("do_sample", True)
    kwargs = dict(max_new_tokens=new_tokens, do_sample=do_sample, eos_token_id=[EOS], pad_token_id=PAD, synced_gpus=False)
    if do_sample:
        kwargs.update(temperature=sampling.get("temperature", 1.0), top_k=sampling.get("top_k", 0), top_p=sampling.get("top_p", 1.0))
    return model.generate(input_ids=ids, attention_mask=mask, **kwargs)[:, ids.shape[1]:]


def _lean(model, ids, mask, new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, **extra):
    return sample(model, ids, mask, new_tokens, temperature, top_k, top_p, do_sample, [EOS], PAD, **extra)


def test_greedy_tokens_equal_generate():
    model, (ids, mask) = _model(), _prompts()
    want = _generate(model, ids, mask, 24, do_sample=False)
    got, _ = _lean(model, ids, mask, 24, do_sample=False)
    assert torch.equal(got, want)


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.7), dict(top_k=5), dict(top_p=0.8), dict(temperature=1.3, top_k=20, top_p=0.9)],
                         ids=["plain", "temperature", "top_k", "top_p", "all"])
def test_seeded_samples_equal_generate(sampling):
    model, (ids, mask) = _model(), _prompts(1)
    torch.manual_seed(7)
    want = _generate(model, ids, mask, 20, **dict(sampling))
    torch.manual_seed(7)
    got, _ = _lean(model, ids, mask, 20, **sampling)
    assert torch.equal(got, want)


def test_rows_after_eos_are_padding_and_the_loop_stops_when_all_rows_end():
    model, (ids, mask) = _model(), _prompts(2)
    torch.manual_seed(0)
    free, _ = _lean(model, ids, mask, 64)
    stop = int(torch.bincount(free.flatten()).argmax())  # the most frequent token, made the EOS: rows end early
    torch.manual_seed(0)
    got, _ = sample(model, ids, mask, 64, 1.0, 0, 1.0, True, [stop], PAD)
    torch.manual_seed(0)
    want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=64, do_sample=True, eos_token_id=[stop],
                          pad_token_id=PAD, synced_gpus=False, top_k=0)[:, ids.shape[1]:]
    assert torch.equal(got, want)
    ended = (got == stop).cumsum(1) > 0
    after = torch.cat([torch.zeros_like(ended[:, :1]), ended[:, :-1]], dim=1)
    assert bool(after.any()) and bool((got[after] == PAD).all())
    assert got.shape[1] < 64 and bool(ended[:, -1].all())


def test_first_step_distribution_matches_the_exact_softmax():
    """10k draws of the first token of one prompt (temperature 0.8, top-k 12): empirical frequencies vs
    the filtered softmax of a float64 forward, within 5 standard errors per token; filtered tokens never."""
    model, (ids, mask) = _model(), _prompts(3, lengths=(6,))
    with torch.no_grad():
        logits = model.double()(input_ids=ids, attention_mask=mask).logits[0, -1]
    model.float()
    scaled = logits / 0.8
    kept = scaled >= torch.topk(scaled, 12).values[-1]
    exact = torch.where(kept, scaled, torch.tensor(-float("inf"), dtype=torch.float64)).softmax(-1)
    draws = 10_000
    torch.manual_seed(0)
    batch_ids, batch_mask = ids.expand(draws, -1).contiguous(), mask.expand(draws, -1).contiguous()
    first, log_probs = _lean(model, batch_ids, batch_mask, 1, temperature=0.8, top_k=12, with_log_probs=True)
    counts = torch.bincount(first[:, 0], minlength=VOCAB).double()
    assert counts[~kept].sum() == 0
    error = (exact * (1 - exact) / draws).sqrt()
    assert bool(((counts / draws - exact).abs() <= 5 * error + 1e-12).all())
    torch.testing.assert_close(log_probs[:, 0].double(), exact.log()[first[:, 0]], rtol=0, atol=1e-5)


def test_padded_vocabulary_rows_are_never_sampled():
    model, (ids, mask) = _model(pad_rows=32), _prompts(4)
    with torch.no_grad():
        model.get_output_embeddings().weight[VOCAB:] *= 50  # the padded rows would dominate if not suppressed
    torch.manual_seed(0)
    got, _ = _lean(model, ids, mask, 16, suppress_from=VOCAB)
    assert int(got.max()) < VOCAB


def test_process_scores_greedy_ignores_sampling_filters():
    logits = torch.randn(3, 10)
    torch.testing.assert_close(process_scores(logits, 0.5, 2, 0.5, False, None), logits)
