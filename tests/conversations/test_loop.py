"""The tool-call loop with a scripted model: sampled ids kept bitwise, the environment's ids attended and untrained,
every tool failure a message counted by kind, the budget and max_turns honoured."""

from __future__ import annotations

import pytest

from distill.agents.loop import LoopSettings, loop_metrics, run_tool_loop
from distill.conversations.calls import ToolCalls
from distill.conversations.tool_calls import ToolCall, render_tool_calls
from distill.conversations.tools import load_tools
from distill.generation.sample import Sample
from distill.rendering import ConversationRenderer, EnvironmentTurns
from tests.conversations.conftest import family_tokenizer

TOOLBOX = "tests.conversations.toolbox"
TOOLS = load_tools([f"{TOOLBOX}:{name}" for name in ("add", "slow", "broken", "not_text", "async_echo")])


class Script:
    """A stand-in model: turn k of row r is script[r][k] (text), tokenized, EOS appended; records what it was shown."""

    def __init__(self, tokenizer, eos: int, script: list[list[str]]):
        self.tokenizer, self.eos, self.script, self.seen = tokenizer, eos, script, []

    def __call__(self, prompts, max_new_tokens, turn, rows):
        outputs = []
        for prompt in prompts:
            row = next(r for r, first in enumerate(self.firsts) if prompt[: len(first)] == first)
            assert row in rows
            self.seen.append((row, turn, list(prompt)))
            ids = self.tokenizer(self.script[row][turn], add_special_tokens=False)["input_ids"] + [self.eos]
            outputs.append(Sample(ids[:max_new_tokens], len(ids) > max_new_tokens, [-0.5] * min(len(ids), max_new_tokens)))
        return outputs


def loop(family: str, script: list[list[str]], budget: int = 400, max_turns: int = 4, timeout: float = 0.5):
    tokenizer, eos = family_tokenizer(family)
    renderer = ConversationRenderer(tokenizer, eos)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"question {r}"}], add_generation_prompt=True,
                                             tokenize=False) for r in range(len(script))]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    model = Script(tokenizer, eos[0], script)
    model.firsts = prompt_ids
    calls = ToolCalls(TOOLS, None, timeout, workers=2)
    try:
        trajectories = run_tool_loop(model, prompt_ids, calls.open([{}] * len(prompt_ids), list(range(len(prompt_ids)))),
                                     EnvironmentTurns(tokenizer, renderer, eos), lambda ids: tokenizer.decode(ids), eos,
                                     LoopSettings(max_turns, budget, True))
    finally:
        calls.close()
    return tokenizer, eos, prompt_ids, model, trajectories


def calls(*pairs) -> str:
    return render_tool_calls([ToolCall(name, arguments) for name, arguments in pairs])


@pytest.mark.parametrize("family", ["chatml", "llama3", "qwen2_5"])
def test_a_trajectory_is_the_sampled_ids_then_the_environments_then_the_next_turn(family):
    tokenizer, eos, prompts, model, (t,) = loop(family, [[calls(("add", {"a": 2, "b": 3})), "It is 5."]])
    first = tokenizer(calls(("add", {"a": 2, "b": 3})), add_special_tokens=False)["input_ids"] + eos
    last = tokenizer("It is 5.", add_special_tokens=False)["input_ids"] + eos
    assert t.ids[: len(first)] == first and t.ids[-len(last):] == last  # the sampled ids, bitwise
    assert t.trained == [True] * len(first) + [False] * (len(t.ids) - len(first) - len(last)) + [True] * len(last)
    environment = tokenizer.decode(t.ids[len(first): -len(last)])
    assert "5" in environment and "assistant" in environment  # the result, then the next turn's header
    assert len(t.log_probs) == len(t.ids) and t.turns == 2 and t.calls == 1 and not t.hit_max
    # The second turn was generated from the prompt and everything so far, as the ids it holds.
    assert model.seen[1][2] == prompts[0] + t.ids[: -len(last)]
    if family == "chatml":  # the newline the template puts after <|im_end|> comes first, untrained
        assert environment.startswith("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")


def test_every_failure_is_a_message_counted_by_kind():
    script = [[calls(("nope", {}), ("broken", {}), ("slow", {"seconds": 2.0}), ("not_text", {}), ("add", {"a": 1}),
                     ("async_echo", {"text": "hi"})) + "\n<tool_call>\n{oops\n</tool_call>", "Done."]]
    tokenizer, eos, _, _, (t,) = loop("chatml", script, budget=4000, timeout=0.3)
    environment = tokenizer.decode([i for i, f in zip(t.ids, t.trained) if not f])
    assert dict(t.failures) == {"unknown_tool": 1, "raised": 1, "timeout": 1, "not_text": 1, "bad_arguments": 1,
                                "malformed_call": 1}
    assert "there is no tool 'nope'" in environment and "RuntimeError: disk on fire" in environment
    assert "took longer than 0.3 s and was stopped" in environment and "returned dict, not text" in environment
    assert "HI" in environment
    metrics = loop_metrics([t])
    assert metrics["tools/calls"] == (7.0, 1.0) and metrics["tools/failed_timeout"] == (1.0, 7.0)
    assert t.ids[-1] == eos[0] and t.turns == 2


def test_the_budget_cuts_a_turn_or_rolls_back_the_results_and_max_turns_leaves_the_last_calls_unanswered():
    many = calls(("add", {"a": 1, "b": 1}))
    tokenizer, eos, _, _, (t,) = loop("chatml", [[many] * 5], max_turns=3)
    assert t.turns == 3 and t.calls == 3 and t.unanswered_calls == 1 and not t.hit_max
    assert t.trained[-1] is True  # ends at the last turn's end of turn: its calls are not run
    budget = len(tokenizer(many, add_special_tokens=False)["input_ids"]) + 1 + 3  # a turn, then 3 tokens of results
    _, _, _, _, (cut,) = loop("chatml", [[many, "never"]], budget=budget)
    assert cut.rolled_back_results == 1 and cut.unanswered_calls == 1 and cut.hit_max and cut.turns == 1
    assert all(cut.trained) and cut.ids[-1] == eos[0]  # it ends with the turn that made the call
    _, _, _, _, (short,) = loop("chatml", [["a long answer that will not fit"]], budget=4)
    assert len(short.ids) == 4 and short.hit_max and all(short.trained)


def test_rows_run_side_by_side_and_stop_on_their_own_turn():
    tokenizer, eos, _, model, trajectories = loop("chatml", [["Just this."], [calls(("add", {"a": 2, "b": 2})), "4."]])
    assert [t.turns for t in trajectories] == [1, 2]
    assert [(row, turn) for row, turn, _ in model.seen] == [(0, 0), (1, 0), (1, 1)]


def test_tools_load_by_import_path_with_their_schemas():
    tools = load_tools(["tests.conversations.toolbox:add", "tests.conversations.toolbox:slow"])
    assert set(tools) == {"add", "slow"} and tools["add"].spec == "tests.conversations.toolbox:add"
    assert tools["add"].schema["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert tools["slow"].schema["function"]["parameters"]["required"] == []  # no docstring: from the signature
    with pytest.raises(ValueError, match="tools: cannot import 'no_such_module'"):
        load_tools(["no_such_module:f"])
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        load_tools(["tests.conversations.toolbox:add"] * 2)


def test_drift_counts_conversations_whose_text_re_tokenizes_otherwise_and_can_stop_the_run():
    tokenizer, eos = family_tokenizer("chatml")
    renderer = ConversationRenderer(tokenizer, eos)
    prompt = tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": "q"}], add_generation_prompt=True,
                                                     tokenize=False), add_special_tokens=False)["input_ids"]
    canonical = tokenizer("the answer", add_special_tokens=False)["input_ids"] + eos
    spelled = [tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in "the answer"] + eos  # one token a byte
    assert spelled != canonical and tokenizer.decode(spelled) == tokenizer.decode(canonical)

    calls = ToolCalls(TOOLS, None, 1.0, workers=1)  # no call is made: no worker starts

    def run(ids, fail):
        return run_tool_loop(lambda prompts, n, turn, rows: [Sample(list(ids))], [prompt], calls.open([{}], [0]),
                             EnvironmentTurns(tokenizer, renderer, eos), lambda i: tokenizer.decode(i), eos,
                             LoopSettings(2, 100, False, fail))

    assert not run(canonical, False)[0].drifted and calls.pool.pids() == []
    (drifted,) = run(spelled, False)
    assert drifted.drifted and drifted.ids == spelled  # counted, and the sampled ids are still what is kept
    assert loop_metrics([drifted])["tools/retokenization_drift"] == (1.0, 1.0)
    with pytest.raises(ValueError, match="fail_on_token_drift: 1 of 1 conversations re-tokenize"):
        run(spelled, True)
