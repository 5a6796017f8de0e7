"""serve-teacher's batcher: concurrent requests share forward passes, within a padded-token budget."""

from __future__ import annotations

import asyncio

from distill.serving.scoring import Batcher


class CountingEngine:
    def __init__(self):
        self.batches: list[list[int]] = []

    def run(self, key, prompts, starts, images=None):
        self.batches.append([len(p) for p in prompts])
        if key[0] == "hidden":
            return [{"prompt_token_ids": p, "start": s, "dtype": key[1]} for p, s in zip(prompts, starts)]
        return [{"prompt_token_ids": p, "k": key[1], "t": key[2]} for p in prompts]


def _run(jobs, max_batch_tokens):
    engine = CountingEngine()

    async def main():
        batcher = Batcher(engine, max_batch_tokens)
        submitted = [asyncio.create_task(batcher.submit(prompts, *job)) for prompts, *job in jobs]
        await asyncio.sleep(0)  # every request is queued before the worker starts
        batcher.start()
        answers = await asyncio.gather(*submitted)
        batcher.worker.cancel()
        return answers

    return engine, asyncio.run(main())


def test_concurrent_requests_share_one_forward_pass_and_get_their_own_answers():
    jobs = [([[1] * n], ("topk", 5, 1.0)) for n in (3, 4, 5, 6)] + [([[2] * 2, [2] * 3], ("topk", 5, 1.0))]
    engine, answers = _run(jobs, max_batch_tokens=1000)
    assert engine.batches == [[3, 4, 5, 6, 2, 3]]
    for (prompts, _), answer in zip(jobs, answers):
        assert [a["prompt_token_ids"] for a in answer] == prompts


def test_the_budget_counts_padding_and_requests_at_other_settings_run_apart():
    # rows x longest: 1 x 10 fits in 24, adding a 2-token row pads to 2 x 10 = 20, a third row would be 30.
    jobs = [([[1] * 10], ("topk", 5, 1.0)), ([[1] * 2], ("topk", 5, 1.0)), ([[1] * 2], ("topk", 5, 1.0)),
            ([[1] * 2], ("topk", 7, 2.0))]
    engine, answers = _run(jobs, max_batch_tokens=24)
    assert engine.batches[0] == [10, 2]
    assert sorted(map(tuple, engine.batches[1:])) == [(2,), (2,)]  # the k=7, T=2 request is not merged with k=5
    assert answers[3][0]["k"] == 7 and answers[3][0]["t"] == 2.0


def test_a_request_over_the_budget_is_split_into_passes_within_it():
    """One request's padded size is rows x its longest prompt: a long prompt among short ones must not blow
    the forward pass up to (all rows) x (longest), so the batcher scores it in runs that fit (order kept)."""
    prompts = [[1] * 10, [2] * 2, [3] * 2, [4] * 30, [5] * 3]
    engine, answers = _run([(prompts, ("topk", 5, 1.0))], max_batch_tokens=24)
    assert engine.batches == [[10, 2], [2], [30], [3]]  # the 30-token prompt is over the budget alone: its own pass
    assert [a["prompt_token_ids"] for a in answers[0]] == prompts


def test_hidden_state_requests_batch_apart_from_log_prob_requests_and_keep_their_starts():
    jobs = [([[1] * 3, [1] * 4], ("hidden", "float32"), [1, 2]), ([[1] * 5], ("topk", 5, 1.0)),
            ([[1] * 6], ("hidden", "float32"), [6]), ([[1] * 2], ("hidden", "bfloat16"), [1])]
    engine, answers = _run(jobs, max_batch_tokens=1000)
    assert sorted(engine.batches) == sorted([[3, 4, 6], [5], [2]])
    assert [a["start"] for a in answers[0]] == [1, 2] and answers[2][0]["start"] == 6
    assert answers[3][0]["dtype"] == "bfloat16" and answers[1][0]["k"] == 5
