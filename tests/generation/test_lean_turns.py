"""The lean loop's conversation cache (`distill.generation.lean_turns`): each turn's logits after the ids it appends
equal a float64 forward over the whole conversation, and decoding with it gives the tokens re-encoding gives, as rows
end, drop out, come back and start over (a re-rendered history)."""

import copy

import pytest
import torch

from distill.generation import SamplingParams, generate_completions
from distill.generation.engine import ConversationCache
from distill.generation.lean_decode import lean_generate
from distill.generation.lean_turns import TurnCache
from tests.generation.test_lean_decode import PAD, left_padded, tiny_llama

CPU = torch.device("cpu")


def full_forward_logits(model, contexts: list[list[int]]) -> torch.Tensor:
    """The definition: each context's last-position logits from a float64 forward over all of it, alone. (B, V)."""
    double = copy.deepcopy(model).double()
    with torch.no_grad():
        return torch.stack([double(torch.tensor([context])).logits[0, -1] for context in contexts])


def greedy_turn(model, contexts, keys, cache, new_tokens=6, eos=None):
    ids, mask = left_padded(contexts)
    options = dict(max_new_tokens=new_tokens, do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
                   eos_ids=[] if eos is None else [eos], pad_id=PAD)
    if cache is None:
        return lean_generate(model, ids, mask, **options)[0]
    return lean_generate(model, ids, mask, conversations=cache, keys=keys, **options)[0]


@torch.no_grad()
def test_each_turns_logits_equal_a_float64_forward_over_the_whole_conversation():
    model = tiny_llama(seed=5)
    cache = TurnCache(model)
    contexts = {0: [5, 9, 11], 1: [7, 3, 8, 20, 31, 44], 2: [50], 3: [13, 14, 15, 16]}
    environment = {0: [60, 61], 1: [62], 2: [63, 64, 65, 66, 67], 3: [68, 69, 70]}
    plan = [[0, 1, 2, 3], [0, 1, 3], [1, 2, 3], [1, 3]]  # 2 sits out turn 1 (the teacher's turn) and comes back
    for turn, keys in enumerate(plan):
        if turn == 2:
            contexts[3] = [13, 90] + contexts[3][2:]  # a re-rendered history: no longer starts with what the cache holds
        ids, mask = left_padded([contexts[k] for k in keys])
        decoder, logits = cache.resume(model, ids, mask, keys, max_new_tokens=4)
        # float32 logits against float64's: up to 1.3e-5 apart measured (MKL_CBWR=AUTO,STRICT, conftest)
        torch.testing.assert_close(logits.double(), full_forward_logits(model, [contexts[k] for k in keys]),
                                   rtol=1e-5, atol=2e-5)
        # the turn: 3 greedy steps fed, a row ending (its later steps masked) after its first
        tokens = []
        fed = []
        for step in range(3):
            token = logits.argmax(-1)
            tokens.append(token)
            if step < 2:
                live = torch.tensor([not (row == 0 and step >= 1) for row in range(len(keys))])
                fed.append(live)
                logits = decoder.step(token)
        generated = torch.stack(tokens, dim=1)
        cache.turn_ended(decoder.length - 2, generated, fed)
        for row, key in enumerate(keys):
            kept = 1 if row == 0 else 3  # row 0 ended at its first token
            contexts[key] = contexts[key] + generated[row, :kept].tolist() + environment[key]
        assert cache.held[0] == contexts[keys[0]][: len(cache.held[0])]


@pytest.mark.parametrize("eos_step", [None, 2])
def test_greedy_conversations_with_the_cache_equal_re_encoding_each_turn(eos_step):
    model = tiny_llama(seed=6)
    free = greedy_turn(model, [[5, 9, 11]], [0], None, new_tokens=8)
    eos = None if eos_step is None else int(free[0, eos_step])
    cache = TurnCache(model)
    with_cache = {0: [5, 9, 11], 1: [7, 3, 8, 20, 31, 44, 6], 2: [50, 51]}
    without = copy.deepcopy(with_cache)
    keys = [0, 1, 2]
    for turn in range(4):
        cached = greedy_turn(model, [with_cache[k] for k in keys], keys, cache, eos=eos)
        plain = greedy_turn(model, [without[k] for k in keys], keys, None, eos=eos)
        assert torch.equal(cached, plain), f"turn {turn}"
        for row, key in enumerate(keys):
            turn_ids = cached[row].tolist()
            if eos is not None and eos in turn_ids:
                turn_ids = turn_ids[: turn_ids.index(eos) + 1]
            tool = [70 + turn, 71 + key]
            with_cache[key] = with_cache[key] + turn_ids + tool
            without[key] = without[key] + turn_ids + tool
        keys = keys[: 3 - turn // 2]  # rows drop out as their conversations end


def test_a_changed_model_or_changed_weights_start_the_cache_over():
    model = tiny_llama(seed=7)
    request_cache = ConversationCache()
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4, do_sample=False, engine="lean")
    generate_completions(model, [[5, 9, 11]], sampling, [], PAD, CPU, conversations=request_cache, conversation_keys=[0])
    first = request_cache.state
    assert isinstance(first, TurnCache) and first.serves(model) and first.held[0][:3] == [5, 9, 11]
    with torch.no_grad():
        next(model.parameters()).add_(0.01)  # an optimizer step
    assert not first.serves(model)
    generate_completions(model, [[5, 9, 11, 4]], sampling, [], PAD, CPU, conversations=request_cache, conversation_keys=[0])
    assert request_cache.state is not first
