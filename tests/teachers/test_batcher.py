"""serve-teacher's batcher: concurrent requests share forward passes, within a padded-token budget."""

from __future__ import annotations

import asyncio

from distill.commands.serve_teacher import Batcher


class CountingEngine:
    def __init__(self):
        self.batches: list[list[int]] = []

    def score(self, prompts, k, temperature):
        self.batches.append([len(p) for p in prompts])
        return [{"index": i, "prompt_token_ids": p, "k": k, "t": temperature} for i, p in enumerate(prompts)]


def _run(jobs, max_batch_tokens):
    engine = CountingEngine()

    async def main():
        batcher = Batcher(engine, max_batch_tokens)
        submitted = [asyncio.create_task(batcher.submit(prompts, k, t)) for prompts, k, t in jobs]
        await asyncio.sleep(0)  # every request is queued before the worker starts
        batcher.start()
        answers = await asyncio.gather(*submitted)
        batcher.worker.cancel()
        return answers

    return engine, asyncio.run(main())


def test_concurrent_requests_share_one_forward_pass_and_get_their_own_answers():
    jobs = [([[1] * n], 5, 1.0) for n in (3, 4, 5, 6)] + [([[2] * 2, [2] * 3], 5, 1.0)]
    engine, answers = _run(jobs, max_batch_tokens=1000)
    assert engine.batches == [[3, 4, 5, 6, 2, 3]]
    for (prompts, _, _), answer in zip(jobs, answers):
        assert [a["prompt_token_ids"] for a in answer] == prompts and [a["index"] for a in answer] == list(range(len(prompts)))


def test_the_budget_counts_padding_and_requests_at_other_settings_run_apart():
    # rows x longest: 1 x 10 fits in 24, adding a 2-token row pads to 2 x 10 = 20, a third row would be 30.
    jobs = [([[1] * 10], 5, 1.0), ([[1] * 2], 5, 1.0), ([[1] * 2], 5, 1.0), ([[1] * 2], 7, 2.0)]
    engine, answers = _run(jobs, max_batch_tokens=24)
    assert engine.batches[0] == [10, 2]
    assert sorted(map(tuple, engine.batches[1:])) == [(2,), (2,)]  # the k=7, T=2 request is not merged with k=5
    assert answers[3][0]["k"] == 7 and answers[3][0]["t"] == 2.0


def test_a_request_over_the_budget_is_split_into_passes_within_it():
    """One request's padded size is rows x its longest prompt: a long prompt among short ones must not blow
    the forward pass up to (all rows) x (longest), so the batcher scores it in runs that fit (order kept)."""
    prompts = [[1] * 10, [2] * 2, [3] * 2, [4] * 30, [5] * 3]
    engine, answers = _run([(prompts, 5, 1.0)], max_batch_tokens=24)
    assert engine.batches == [[10, 2], [2], [30], [3]]  # the 30-token prompt is over the budget alone: its own pass
    assert [a["prompt_token_ids"] for a in answers[0]] == prompts and [a["index"] for a in answers[0]] == list(range(5))
