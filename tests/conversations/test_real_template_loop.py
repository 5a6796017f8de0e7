"""The tool-call loop and the runs around it with the real Qwen2.5 and Qwen3 templates (read at test time from the
installed trl): token-in, token-out where the template preserves prefixes (parallel calls included); where it
re-renders its history (Qwen3), each turn's context is the conversation re-rendered, a new piece where it no longer
extends the ids so far, and the tokens trained are exactly the tokens sampled, each in the context it was sampled
in; the pieces of a rollout train, checkpoint and take rewards as one rollout."""

from __future__ import annotations

import json
import math

import datasets
import pytest
import torch

from distill.agents.loop import LoopSettings, ToolLoop, loop_metrics
from distill.config import DistillConfig
from distill.conversations.calls import ToolCalls
from distill.conversations.tool_calls import ToolCall, render_tool_calls
from distill.conversations.tools import load_tools
from distill.data import Example
from distill.generation.sample import Sample, sample_from_plain, sample_to_plain
from distill.methods.sdpo.stage import ADVANTAGE
from distill.rendering import TextRenderer
from distill.teachers.self_teacher import TEACHER_PROMPT
from distill.training.trainer import Distiller
from tests.conftest import tiny_lm
from tests.conversations.conftest import family_tokenizer
from tests.helpers.training import FAST

TOOLS = load_tools(["tests.conversations.toolbox:add"])
EMPTY_THINK = "<think>\n\n</think>\n\n"


def calls(*pairs) -> str:
    return render_tool_calls([ToolCall("add", {"a": a, "b": b}) for a, b in pairs])


class Script:
    """A stand-in model: turn k of every row is script[k] (text), tokenized, its end of turn appended; records the
    ids it was shown, by turn."""

    def __init__(self, tokenizer, eos: int, script: list[str]):
        self.tokenizer, self.eos, self.script, self.seen = tokenizer, eos, script, []
        self.turns = [tokenizer(text, add_special_tokens=False)["input_ids"] + [eos] for text in script]

    def __call__(self, prompts, max_new_tokens, turn, rows):
        self.seen.append([list(p) for p in prompts])
        return [Sample(self.turns[turn][:max_new_tokens], False, [-0.5] * len(self.turns[turn][:max_new_tokens]))
                for _ in prompts]


def run_loop(family: str, script: list[str], template_kwargs=None, rows: int = 2):
    tokenizer, eos = family_tokenizer(family)
    renderer = TextRenderer(tokenizer, 4096, 800, eos, template_kwargs).offering([t.schema for t in TOOLS.values()])
    examples = [Example(r, [{"role": "user", "content": f"Add 2 and {3 + r}."}], None) for r in range(rows)]
    prompts = [renderer.prompt(e).ids for e in examples]
    model = Script(tokenizer, eos[0], script)
    loop = ToolLoop(ToolCalls(TOOLS, None, 1.0, workers=1), renderer.environment_turns(),
                    lambda ids: tokenizer.decode(ids), LoopSettings(4, 800, True), renderer)
    try:
        trajectories, followed = loop.run(model, prompts, examples, eos)
    finally:
        loop.close()
    return tokenizer, renderer, examples, model, trajectories, followed


def messages_after(example, script: list[str], results: list[list[str]]) -> list[dict]:
    """The conversation as a server re-renders it: each scripted turn read back (text before its calls, the calls),
    then its results."""
    messages = list(example.prompt)
    for text, answered in zip(script, results):
        head = text.split("<tool_call>")[0].rstrip()
        call_list = [{"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
                     for a, b in json_calls(text)]
        messages.append({"role": "assistant", "content": head, **({"tool_calls": call_list} if call_list else {})})
        messages += [{"role": "tool", "name": "add", "content": result} for result in answered]
    return messages


def json_calls(text: str) -> list[tuple[int, int]]:
    blocks = [block.split("</tool_call>")[0] for block in text.split("<tool_call>")[1:]]
    return [(json.loads(b)["arguments"]["a"], json.loads(b)["arguments"]["b"]) for b in blocks]


def sampled_and_trained(model, trajectory) -> tuple[list[int], list[int]]:
    sampled = [token for turn in model.turns[: trajectory.turns] for token in turn]
    trained = [token for piece in trajectory.pieces for token, flag in zip(piece.ids, piece.trained) if flag]
    return sampled, trained


def test_qwen2_5_runs_parallel_calls_token_in_token_out():
    script = [calls((2, 3), (4, 5)), "They are 5 and 9."]
    tokenizer, renderer, examples, model, (t, _), _ = run_loop("qwen2_5", script)
    assert renderer.environment_turns().preserves_prefixes and len(t.pieces) == 1
    sampled, trained = sampled_and_trained(model, t)
    assert trained == sampled and t.turns == 2 and t.calls == 2  # the sampled ids, bitwise
    first, last = model.turns
    assert t.ids[: len(first)] == first and t.ids[-len(last):] == last
    between = tokenizer.decode(t.ids[len(first): -len(last)])
    assert between == ("\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n9\n</tool_response>"
                       "<|im_end|>\n<|im_start|>assistant\n")  # one user turn for both results, as the template has it
    assert model.seen[1][0] == t.pieces[0].prompt + t.ids[: -len(last)]
    # What the model was shown is what the template renders for the conversation read back as messages.
    shown = renderer.prompt(examples[0], history=tuple(messages_after(examples[0], script[:1], [["5", "9"]])[1:])).ids
    assert model.seen[1][0] == shown


def test_llama3_2_calls_written_as_its_json_object_are_read_run_and_answered_token_in_token_out():
    """Llama 3.2's template writes a call as the whole turn, one JSON object: the loop reads it in that format (a
    Hermes reader would take it for the answer and end the conversation), runs the tool, and the result follows in
    the template's `ipython` turn."""
    script = ['{"name": "add", "parameters": {"a": 2, "b": 3}}', "It is 5."]
    dated = {"date_string": "01 Jan 2025"}
    tokenizer, renderer, examples, model, (t, _), _ = run_loop("llama3_2", script, dated)
    assert renderer.environment_turns().preserves_prefixes and len(t.pieces) == 1
    assert t.turns == 2 and t.calls == 1 and not t.failures and not t.hit_max
    sampled, trained = sampled_and_trained(model, t)
    assert trained == sampled  # the sampled ids, bitwise
    first, last = model.turns
    between = tokenizer.decode(t.ids[len(first): -len(last)])
    assert between == "<|start_header_id|>ipython<|end_header_id|>\n\n\"5\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    history = ({"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
        {"role": "tool", "name": "add", "content": "5"})
    assert model.seen[1][0] == renderer.prompt(examples[0], history=history).ids  # as the template renders it


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_rerenders_each_turns_context_and_trains_exactly_the_sampled_tokens(thinking):
    """Thinking on, a turn with reasoning: the template keeps it after the last query, the re-rendered context extends
    the ids so far (one piece, a shared prefix). Thinking off (or an empty <think> block): the next context drops the
    turn's empty block, so the next turn starts a piece whose prompt is that context. Either way every turn is
    sampled after what the template renders for the conversation so far, and trained there."""
    kwargs = None if thinking else {"enable_thinking": False}
    script = ([f"<think>\nI add.\n</think>\n\n{calls((2, 3), (4, 5))}", "<think>\nDone.\n</think>\n\nThey are 5 and 9."]
              if thinking else [calls((2, 3), (4, 5)), "They are 5 and 9."])
    tokenizer, renderer, examples, model, trajectories, followed = run_loop("qwen3", script, kwargs)
    assert not renderer.environment_turns().preserves_prefixes  # Qwen3's: the loop re-renders each context
    for row, (t, example) in enumerate(zip(trajectories, examples)):
        assert len(t.pieces) == (1 if thinking else 2) and t.turns == 2 and not t.hit_max
        sampled, trained = sampled_and_trained(model, t)
        assert trained == sampled  # tokens trained = tokens sampled
        context = renderer.prompt(example, history=tuple(messages_after(example, script[:1], [["5", "9"]])[1:])).ids
        assert model.seen[1][row] == context  # turn 2 was sampled after the conversation as the template renders it
        text = tokenizer.decode(context)
        assert text.endswith("<|im_start|>assistant\n" + ("" if thinking else EMPTY_THINK))
        history = text.split("<|im_start|>assistant\n", 1)[1].rsplit("<|im_start|>assistant\n", 1)[0]
        assert ("I add." in history) is thinking and EMPTY_THINK not in history  # the first turn, as re-rendered
        if thinking:  # one piece: its ids are the context's, then the second turn
            assert t.pieces[0].prompt + t.ids == context + model.turns[1]
        else:  # each turn trained in its own context
            assert t.pieces[0].prompt == followed[row] and tokenizer.decode(followed[row]).endswith(EMPTY_THINK)
            assert t.pieces[0].ids == model.turns[0] and t.pieces[1].prompt == context and t.pieces[1].ids == model.turns[1]
            history = t.pieces[1].segments.layout(history=t.pieces[1].history).history
            assert [m["role"] for m in history] == ["assistant", "tool", "tool"]
    sample = trajectories[0].sample(followed[0])
    assert len(sample.pieces()) == len(trajectories[0].pieces)
    assert sample_from_plain(json.loads(json.dumps(sample_to_plain(sample)))) == sample  # a checkpoint keeps the pieces
    metrics = loop_metrics(trajectories)
    assert metrics["tools/environment_token_fraction"][1] == sum(len(p.ids) for t in trajectories for p in t.pieces)


def test_qwen3_thinking_on_with_an_empty_think_block_splits_where_the_template_drops_it():
    script = [EMPTY_THINK + calls((2, 3)), EMPTY_THINK + "It is 5."]
    tokenizer, _, _, model, (t, _), _ = run_loop("qwen3", script)
    assert len(t.pieces) == 2 and EMPTY_THINK not in tokenizer.decode(t.pieces[1].prompt)
    sampled, trained = sampled_and_trained(model, t)
    assert trained == sampled


# ------------------------------------------------------------------------------------------- whole runs --
def long_lm(tokenizer, seed: int):
    """A tiny model whose context holds Qwen3's prompts (its tools' system message) and a conversation: 1024
    positions (rotary embeddings, so only the declared length changes)."""
    model = tiny_lm(len(tokenizer), layers=2, seed=seed, eos_token_id=tokenizer.eos_token_id)
    model.config.max_position_embeddings = 1024
    return model


def qwen3_turns(tokenizer):
    """Scripted generation for a run: a prompt holding no tool result yet gets a call to `plus` (or, by the row seed's
    parity, gives up), one with a result gets the answer; log-probs -0.5 per token."""
    eos = tokenizer.eos_token_id
    call = tokenizer('<tool_call>\n{"name": "plus", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
                     add_special_tokens=False)["input_ids"] + [eos]
    give_up = tokenizer("I cannot say.", add_special_tokens=False)["input_ids"] + [eos]
    answer = tokenizer("It is 5.", add_special_tokens=False)["input_ids"] + [eos]

    def generate(model, prompts, sampling, *args, with_log_probs=False, seeds=None, **kwargs):
        out = []
        for prompt, seed in zip(prompts, seeds or [0] * len(prompts)):
            ids = answer if "<tool_response>" in tokenizer.decode(prompt) else (call if seed % 2 == 0 else give_up)
            out.append(Sample(list(ids), False, [-0.5] * len(ids) if with_log_probs else None))
        return out

    return generate, call, give_up, answer


def test_on_policy_trains_each_piece_of_a_qwen3_rollout_in_its_own_context(tmp_path, monkeypatch):
    """A run with `chat_template_kwargs: {enable_thinking: false}` and Qwen3's template: every prompt the run renders
    opens with the empty <think> block; each rollout is two micro-batch rows (its pieces), the second prompted with
    the re-rendered conversation; only the sampled ids are trained; a reused rollout comes back from its checkpoint
    with its pieces."""
    import distill.training.student_sampler

    tokenizer, _ = family_tokenizer("qwen3")
    generate, call, _, answer = qwen3_turns(tokenizer)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions",
                        lambda *a, seeds=None, **k: generate(*a, seeds=[0] * len(a[1]), **k))
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}]} for i in range(8)]
    config = DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "method": "iw_opd", "num_iterations": 2,
                              "temperature": 1.0, "max_new_tokens": 200, "max_prompt_length": 600, "seq_kd": True,
                              "lmbda_schedule": "step", "tools": ["tests.conversations.toolbox:plus"],
                              "chat_template_kwargs": {"enable_thinking": False}})
    student, teacher = long_lm(tokenizer, 2), long_lm(tokenizer, 1)
    run = Distiller(config, student=student, teacher=teacher, tokenizer=tokenizer,
                    train_dataset=datasets.Dataset.from_list(rows))
    run.setup()
    assert all(tokenizer.decode(e.prompt_ids).endswith(EMPTY_THINK) for e in run.parts.encoded)
    first = run.rollout.take(0, {})
    for batch in first:
        assert [c.piece for c in batch.completions] == [0, 1] * (len(batch.completions) // 2)
        for head, later in zip(batch.completions[::2], batch.completions[1::2]):
            assert head.completion_ids == call and later.completion_ids == answer  # the sampled ids, bitwise
            assert all(head.mask) and all(later.mask) and head.example is later.example
            context = tokenizer.decode(later.prompt_ids)
            assert context.startswith(tokenizer.decode(head.prompt_ids).removesuffix(EMPTY_THINK))
            assert "<tool_response>\n5\n</tool_response>" in context and context.endswith(EMPTY_THINK)
            assert EMPTY_THINK not in context[: -len(EMPTY_THINK)]  # the first turn, re-rendered without its block
            assert later.layout.history[0]["tool_calls"][0]["function"]["name"] == "plus"
        assert batch.num_completion_tokens == sum(len(c.completion_ids) for c in batch.completions)
    state = run.rollout.state_dict()
    run.rollout.load_state_dict(json.loads(json.dumps(state)))  # plain values, as a checkpoint holds them
    again = run.rollout.take(1, {})
    for before, after in zip(first, again):
        assert [(c.prompt_ids, c.completion_ids, c.mask, c.piece) for c in before.completions] == [
            (c.prompt_ids, c.completion_ids, c.mask, c.piece) for c in after.completions]
        assert torch.equal(before.input_ids, after.input_ids)
    result = run.train()
    assert result["steps"] == 2 and math.isfinite(result["train"]["loss"])


def test_a_rollout_in_pieces_is_one_rollout_for_rewards_and_its_reprompts_show_the_history(tmp_path, monkeypatch):
    """sdpo over Qwen3 rollouts in pieces: one reward per rollout (its last piece's answer), the rollout's advantage
    on each of its pieces, and a later piece's reprompt shows the conversation before it."""
    import distill.training.student_sampler

    tokenizer, _ = family_tokenizer("qwen3")
    generate, _, _, _ = qwen3_turns(tokenizer)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {3 + i}?"}], "answer": str(5 + i)} for i in range(8)]
    values = {**{k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}, "method": "sdpo",
              "num_generations": 2, "max_new_tokens": 200, "max_prompt_length": 600, "max_reprompt_length": 800,
              "environment": "tests.conversations.toolbox:Adder", "max_turns": 3, "reward_funcs": [],
              "distillation_weight": 1.0, "output_dir": str(tmp_path / "run"),
              "chat_template_kwargs": {"enable_thinking": False}}
    student = long_lm(tokenizer, 2)
    run = Distiller(DistillConfig(**values), student=student, tokenizer=tokenizer,
                    train_dataset=datasets.Dataset.from_list(rows))
    run.setup()
    completions = [c for mb in run.rollout.take(0, {}) for c in mb.completions]
    metrics = run.rollout.take_stage_metrics()
    heads = [c for c in completions if c.piece == 0]
    assert len(completions) > len(heads)  # the rollouts that called a tool come in two pieces
    assert metrics["reward/environment/mean"][1] == len(heads)  # a reward per rollout, not per piece
    for k, completion in enumerate(completions):
        if completion.piece:
            head = completions[k - 1]
            assert ADVANTAGE.of(completion) == ADVANTAGE.of(head) and completion.layout.reward == head.layout.reward
            reprompt = TEACHER_PROMPT.of(completion)
            if reprompt is not None:
                text = tokenizer.decode(reprompt.ids)
                assert "<tool_response>\n5\n</tool_response>" in text.split("Correct solution:")[-1]
    result = run.train()
    assert result["steps"] == 2 and math.isfinite(result["train"]["loss"])


def test_the_evaluation_scores_every_piece_and_reads_the_answer_from_the_last(tmp_path, monkeypatch):
    import distill.evaluation.evaluator
    import distill.teachers.local
    import distill.training.student_sampler

    tokenizer, _ = family_tokenizer("qwen3")
    generate, call, _, answer = qwen3_turns(tokenizer)
    for module in (distill.training.student_sampler, distill.teachers.local, distill.evaluation.evaluator):
        monkeypatch.setattr(module, "generate_completions", lambda *a, seeds=None, **k: generate(*a, seeds=None, **k))
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}], "answer": "5"} for i in range(8)]
    config = DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "method": "on_policy", "max_new_tokens": 200,
                              "max_prompt_length": 600, "seq_kd": True, "lmbda_schedule": "step", "max_steps": 1,
                              "tools": ["tests.conversations.toolbox:plus"], "eval_before_after": True,
                              "eval_max_new_tokens": 200, "chat_template_kwargs": {"enable_thinking": False}})
    run = Distiller(config, student=long_lm(tokenizer, 2), teacher=long_lm(tokenizer, 1), tokenizer=tokenizer,
                    train_dataset=datasets.Dataset.from_list(rows), eval_dataset=datasets.Dataset.from_list(rows[:3]))
    assert run.train()["steps"] == 1
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    for name in ("before", "after"):
        metrics = report["metrics"][name]
        assert metrics["answer_accuracy"]["accuracy"] == 1.0 and metrics["tool_use"]["turns_per_question"] == 2.0
        for part in ("on_teacher_completions", "on_student_completions"):  # both pieces' turns, each in its context
            assert metrics[part]["tokens"] == 3 * (len(call) + len(answer))
    shown = report["examples"][0]["student_after"]
    assert '"name": "plus"' in shown and "<tool_response>\n5\n</tool_response>" in shown and shown.endswith("It is 5.")
