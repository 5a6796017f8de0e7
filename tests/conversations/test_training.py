"""Conversation rows in a run: every assistant turn trained, the tools' turns attended, scored whole once by the teacher;
what is not built yet (the tool-call loop, other tokenizers) is refused before any model loads."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from distill.batch import Completion, collate
from distill.cli import main
from distill.data import examples_from_dataset
from distill.generation.sample import Sample
from distill.rendering import TextRenderer
from distill.teachers.local import LocalTeacher
from tests.conftest import tiny_lm
from tests.conversations.test_render import CONVERSATION, TOOLS, call
from tests.helpers.training import forbid_model_loading, make_distiller


def conversation_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = 3 + i, 7 + 2 * i
        rows.append({"messages": [
            {"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": "", "tool_calls": [call("calc", expr=f"{a}*{b}")]},
            {"role": "tool", "name": "calc", "content": str(a * b)},
            {"role": "assistant", "content": f"It is {a * b}."}], "tools": TOOLS})
    return rows


def test_rows_hold_conversations_and_bad_ones_name_the_row():
    data = datasets.Dataset.from_list(conversation_rows(2))
    example = examples_from_dataset(data, "dataset")[0]
    assert example.prompt == conversation_rows(1)[0]["messages"][:1] and example.completion is None
    assert len(example.turns) == 3 and example.has_completion and example.is_conversation and example.tools == TOOLS
    one_answer = examples_from_dataset(datasets.Dataset.from_list(
        [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]), "dataset")[0]
    assert one_answer.completion == "a" and one_answer.turns is None and not one_answer.is_conversation  # as before
    as_json = examples_from_dataset(datasets.Dataset.from_list([{**conversation_rows(1)[0], "tools": json.dumps(TOOLS)}]), "d")
    assert as_json[0].tools == TOOLS

    def refused(row: dict, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            examples_from_dataset(datasets.Dataset.from_list([row]), "dataset")

    user = {"role": "user", "content": "q"}
    refused({"messages": [user, {"role": "tool", "content": "4"}]}, r"dataset row 0 message 1: a 'tool' message answers no")
    refused({"messages": [user, {"role": "assistant", "content": None, "tool_calls": [call("search")]}], "tools": TOOLS},
            r"message 1: calls \['search'\], which the row's 'tools' do not offer")
    bad_arguments = {"type": "function", "function": {"name": "calc", "arguments": "{not json"}}
    refused({"messages": [user, {"role": "assistant", "content": "", "tool_calls": [bad_arguments]}]}, "not JSON")
    refused({"prompt": "text", "tools": TOOLS}, "needs a 'prompt' of chat messages")
    refused({"prompt": [user], "completion": "x", "messages": None, "tools": "[oops"}, "'tools' is text that is not JSON")


def test_the_rollout_trains_the_assistant_turns_only(tokenizer, tmp_path):
    """The dataset's conversations reach the micro-batch with their trained mask: assistant tokens trained, the tool's
    and the template's between them not."""
    run = make_distiller(tokenizer, tmp_path, rows=conversation_rows(8), lmbda=0.0, max_new_tokens=200)
    run.setup()
    batch = run.rollout.take(0, {})[0]
    for completion in batch.completions:
        trained = tokenizer.decode([t for t, f in zip(completion.completion_ids, completion.mask) if f])
        untrained = tokenizer.decode([t for t, f in zip(completion.completion_ids, completion.mask) if not f])
        answer = completion.example.turns[-1]["content"]
        assert answer in trained and '"name": "calc"' in trained and trained.count("<|im_end|>") == 2
        assert completion.example.turns[1]["content"] in untrained and "tool" in untrained
        assert not completion.hit_max_new_tokens
    assert batch.num_completion_tokens == sum(c.num_trained for c in batch.completions)


def test_a_conversation_cut_at_max_new_tokens_cuts_its_mask_with_it(tokenizer):
    example = examples_from_dataset(datasets.Dataset.from_list(conversation_rows(1)), "dataset")[0]
    whole = TextRenderer(tokenizer, 256, 1000, [tokenizer.eos_token_id]).row(example)
    cut = TextRenderer(tokenizer, 256, 9, [tokenizer.eos_token_id]).row(example)
    assert len(cut.completion_ids) == len(cut.completion_trained) == 9 and cut.completion_cut and not whole.completion_cut
    assert cut.completion_ids == whole.completion_ids[:9] and cut.completion_trained == whole.completion_trained[:9]


def test_the_teachers_signal_over_a_conversation_is_each_turn_scored_with_its_full_prefix(tokenizer):
    """Scored once, whole: the teacher's hidden states at the trained tokens equal those of each assistant turn scored
    with everything before it (a causal model; the tool turns between are attended)."""
    encoder = TextRenderer(tokenizer, 256, 1000, [tokenizer.eos_token_id])
    example = examples_from_dataset(datasets.Dataset.from_list([{"messages": CONVERSATION, "tools": TOOLS}]), "d")[0]
    encoded = encoder.row(example)
    teacher = LocalTeacher(tiny_lm(len(tokenizer), layers=2, seed=5, eos_token_id=tokenizer.eos_token_id), len(tokenizer),
                           [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    whole = Completion(encoded.prompt_ids, encoded.completion_ids, "dataset", trained_mask=encoded.completion_trained)
    signal = teacher.score(collate([whole], "dataset", tokenizer.pad_token_id), 1.0)
    mask = encoded.completion_trained
    starts = [k for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1])]
    pieces = []
    for start in starts:
        end = next((k for k in range(start, len(mask)) if not mask[k]), len(mask))
        turn = tuple(start <= k < end for k in range(end))
        row = Completion(encoded.prompt_ids, encoded.completion_ids[:end], "dataset", trained_mask=turn)
        pieces.append(teacher.score(collate([row], "dataset", tokenizer.pad_token_id), 1.0).hidden)
    assert len(starts) == 4
    torch.testing.assert_close(signal.hidden, torch.cat(pieces), rtol=1e-4, atol=1e-5)  # fp32, other lengths


def _recipe(tmp_path, model_dirs, rows, **fields) -> str:
    data = tmp_path / "conversations.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    teacher = {} if fields.get("method") == "sft" else {"teacher": str(model_dirs["teacher"])}
    values = {**teacher, "student": str(model_dirs["student"]), "dataset": str(data),
              "max_steps": 2, "logging_steps": 1, "max_new_tokens": 120, "per_device_train_batch_size": 2,
              "gradient_accumulation_steps": 1, "eval_before_after": False, "progress_bar": False, "save_steps": 0, **fields}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items()))
    return str(recipe)


@pytest.mark.parametrize("method, fields", [("sft", {}), ("gkd", {"lmbda": 0.0, "lmbda_schedule": "constant",
                                                                    "seq_kd": False})])
def test_sft_and_gkd_train_on_conversations_end_to_end(tmp_path, model_dirs, method, fields):
    recipe = _recipe(tmp_path, model_dirs, conversation_rows(6), method=method, **fields)
    assert main(["train", recipe, "--output-dir", str(tmp_path / "run")]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["loss"] > 0 for r in records)


@pytest.mark.parametrize("fields, match", [
    ({"method": "gkd", "lmbda": 0.5, "seq_kd": False, "lmbda_schedule": "constant"},
     r"dataset row 0 offers tools, and this run samples completions \(student\), but no tool runs their calls"),
    ({"method": "gkd", "lmbda": 0.0, "seq_kd": True, "lmbda_schedule": "constant"},
     r"this run samples completions \(teacher\), but no tool runs their calls"),
    ({"method": "on_policy"}, "name the functions in `tools`"),
    ({"method": "gold", "tools": ["tests.conversations.toolbox:add"], "teacher": "smollm2-135m-instruct", "seq_kd": True,
      "lmbda": 0.0, "lmbda_schedule": "constant"}, "cannot do in the tool-call loop yet"),
])
def test_a_run_that_would_sample_a_conversation_is_refused_before_models_load(tmp_path, model_dirs, monkeypatch, capsys,
                                                                              fields, match):
    forbid_model_loading(monkeypatch)
    recipe = _recipe(tmp_path, model_dirs, conversation_rows(4), **fields)
    assert main(["train", recipe, "--output-dir", str(tmp_path / "run")]) == 2
    import re

    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- the student's tool-call loop --
def scripted_turns(tokenizer):
    """A stand-in for generation: a prompt whose conversation holds no tool result yet gets a call to `add`, one with a
    result gets the answer (each turn ends with EOS, as sampling does); log-probs -0.25 per token."""
    call_ids = tokenizer('<tool_call>\n{"name": "plus", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
                         add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    answer_ids = tokenizer("It is 5.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def generate(model, prompts, sampling, *args, with_log_probs=False, **kwargs):
        out = []
        for prompt in prompts:
            ids = (answer_ids if "<|im_start|>tool" in tokenizer.decode(prompt) else call_ids)[: sampling.max_new_tokens]
            out.append(Sample(list(ids), False, [-0.25] * len(ids) if with_log_probs else None))
        return out

    return generate, call_ids, answer_ids


def test_on_policy_with_tools_samples_conversations_and_trains_only_the_sampled_turns(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    generate, call_ids, answer_ids = scripted_turns(tokenizer)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}]} for i in range(8)]
    run = make_distiller(tokenizer, tmp_path, rows=rows, method="on_policy", max_new_tokens=200, max_prompt_length=300,
                         seq_kd=True, lmbda_schedule="step", tools=["tests.conversations.toolbox:plus"], max_turns=3)
    run.setup()
    assert '"name": "plus"' in tokenizer.decode(run.parts.encoded[0].prompt_ids)  # the tool's schema is in every prompt
    assert not run.parts.encoded[0].prompt_truncated
    batch = run.rollout.take(0, {})[0]
    for completion in batch.completions:
        ids, mask = completion.completion_ids, completion.mask
        assert ids[: len(call_ids)] == call_ids and ids[-len(answer_ids):] == answer_ids  # the sampled ids, bitwise
        assert mask == (True,) * len(call_ids) + (False,) * (len(ids) - len(call_ids) - len(answer_ids)) + (
            True,) * len(answer_ids)
        assert "<|im_start|>tool\n5<|im_end|>" in tokenizer.decode(ids)
        assert completion.weights_version == 0 and not completion.hit_max_new_tokens
    metrics = run.rollout.take_stage_metrics()
    assert metrics["tools/turns"][0] / metrics["tools/turns"][1] == 2.0
    assert metrics["tools/calls"][0] / metrics["tools/calls"][1] == 1.0 and metrics["tools/failed_raised"][0] == 0.0
    result = run.train()
    assert result["steps"] == 2
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(record["tools/turns"] == 2.0 and record["tools/calls"] == 1.0 for record in logged)
    assert 0 < logged[-1]["tools/environment_token_fraction"] < 1


def test_every_turn_of_a_rollout_hands_the_engine_one_cache_keyed_by_row(tokenizer, tmp_path, monkeypatch):
    """The student's turns reach the engine with the rollout's `ConversationCache` and each prompt's row in the loop, the
    same key for a conversation's every turn (what the lean loop keeps its keys and values by); the cache is emptied
    when the rollout ends."""
    import distill.training.student_sampler

    scripted, _, _ = scripted_turns(tokenizer)
    seen: list[tuple[object, list[int], int]] = []

    def generate(model, prompts, sampling, *args, conversations=None, conversation_keys=None, **kwargs):
        seen.append((conversations, list(conversation_keys), len(prompts)))
        conversations.state = "held"
        return scripted(model, prompts, sampling, *args, **kwargs)

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}]} for i in range(8)]
    run = make_distiller(tokenizer, tmp_path, rows=rows, method="on_policy", max_new_tokens=200, max_prompt_length=300,
                         seq_kd=True, lmbda_schedule="step", tools=["tests.conversations.toolbox:plus"], max_turns=3)
    run.setup()
    run.rollout.take(0, {})
    caches = {id(cache) for cache, _, _ in seen}
    assert len(seen) == 2 and len(caches) == 1  # two turns (the call, the answer), one cache
    assert all(keys == list(range(count)) for _, keys, count in seen)
    assert seen[0][0].state is None


def test_a_reused_conversation_rollout_is_checkpointed_with_its_mask(tokenizer, tmp_path, monkeypatch):
    """iw_opd reuses a rollout for num_iterations steps: its checkpointed state gives back the same conversations,
    masks and sampling log-probs (0.0 at the environment's ids, which no loss reads)."""
    import distill.training.student_sampler

    generate, call_ids, answer_ids = scripted_turns(tokenizer)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}]} for i in range(8)]
    run = make_distiller(tokenizer, tmp_path, rows=rows, method="iw_opd", max_new_tokens=200, max_prompt_length=300,
                         seq_kd=True, lmbda_schedule="step", tools=["tests.conversations.toolbox:plus"], num_iterations=2,
                         temperature=1.0)
    run.setup()
    first = run.rollout.take(0, {})
    state = run.rollout.state_dict()
    run.rollout.load_state_dict(json.loads(json.dumps(state)))  # plain values, as a checkpoint holds them
    again = run.rollout.take(1, {})
    for before, after in zip(first, again):
        for a, b in zip(before.completions, after.completions):
            assert a.completion_ids == b.completion_ids and a.mask == b.mask and a.rollout_log_probs == b.rollout_log_probs
            assert False in a.mask and a.rollout_log_probs[len(call_ids)] == 0.0
        assert torch.equal(before.completion_mask, after.completion_mask)


# ------------------------------------------------------------------------------------------ environments --
def test_an_environment_is_made_per_row_its_reset_shown_and_its_methods_the_tools(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    generate, call_ids, answer_ids = scripted_turns(tokenizer)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"Add 2 and 3 to {i}."}], "start": i} for i in range(8)]
    run = make_distiller(tokenizer, tmp_path, rows=rows, method="on_policy", max_new_tokens=200, max_prompt_length=300,
                         seq_kd=True, lmbda_schedule="step", environment="tests.conversations.toolbox:Tally")
    run.setup()
    assert '"name": "plus"' in tokenizer.decode(run.parts.encoded[0].prompt_ids)
    for completion in run.rollout.take(0, {})[0].completions:
        start = completion.example.row["start"]
        assert tokenizer.decode(completion.prompt_ids).endswith(f"to {start}. (the tally starts at {start})<|im_end|>\n"
                                                                "<|im_start|>assistant\n")
        assert f"tally {start + 5}<|im_end|>" in tokenizer.decode(completion.completion_ids)  # its own state, from the row
    with pytest.raises(ValueError, match=r"environment: .*NoReset\(\) made a NoReset without a `reset` method"):
        make_distiller(tokenizer, tmp_path, rows=rows, method="on_policy", seq_kd=True, lmbda_schedule="step",
                       environment="tests.conversations.toolbox:NoReset")


def test_a_sampling_teacher_acts_in_the_conversation_too(tokenizer, tmp_path, monkeypatch):
    """gkd with seq_kd and tools: the teacher's samples are conversations, made by the same loop (its own seeds)."""
    import distill.teachers.local
    import distill.training.student_sampler

    generate, call_ids, answer_ids = scripted_turns(tokenizer)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    monkeypatch.setattr(distill.teachers.local, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}]} for i in range(8)]
    run = make_distiller(tokenizer, tmp_path, rows=rows, method="gkd", lmbda=0.0, seq_kd=True, max_new_tokens=200,
                         max_prompt_length=300, tools=["tests.conversations.toolbox:plus"])
    run.setup()
    batch = run.rollout.take(0, {})[0]
    assert batch.source == "teacher"
    for completion in batch.completions:
        ids = completion.completion_ids
        assert ids[: len(call_ids)] == call_ids and ids[-len(answer_ids):] == answer_ids
        assert completion.num_trained == len(call_ids) + len(answer_ids) and completion.rollout_log_probs is None
    calls, conversations = run.rollout.take_stage_metrics()["tools/calls"]
    assert calls == conversations == 8  # one call each, over the teacher's window (2 steps x 2 micro-batches x 2 rows)


def test_the_evaluation_runs_the_conversations_and_reports_tool_use_and_the_final_answers_accuracy(
        tokenizer, tmp_path, monkeypatch):
    import distill.evaluation.evaluator
    import distill.teachers.local
    import distill.training.student_sampler

    generate, call_ids, answer_ids = scripted_turns(tokenizer)
    for module in (distill.training.student_sampler, distill.teachers.local, distill.evaluation.evaluator):
        monkeypatch.setattr(module, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}], "answer": "5"} for i in range(8)]
    held_out = datasets.Dataset.from_list(rows[:3])
    run = make_distiller(tokenizer, tmp_path, rows=rows, method="on_policy", max_new_tokens=200, max_prompt_length=300,
                         seq_kd=True, lmbda_schedule="step", tools=["tests.conversations.toolbox:plus"],
                         eval_before_after=True, eval_dataset=held_out, eval_max_new_tokens=200, max_steps=1)
    result = run.train()
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    for name in ("before", "after"):
        metrics = report["metrics"][name]
        assert metrics["answer_accuracy"]["accuracy"] == 1.0  # "It is 5." is the last turn; "5" from the tool too
        assert metrics["tool_use"]["calls_per_question"] == 1.0 and metrics["tool_use"]["valid_call_rate"] == 1.0
        assert metrics["tool_use"]["turns_per_question"] == 2.0
        # The divergences are measured on sampled conversations too, over the model's turns only.
        for part in ("on_teacher_completions", "on_student_completions"):
            assert metrics[part]["tokens"] == 3 * (len(call_ids) + len(answer_ids))
    assert report["teacher"]["tool_use"]["calls_per_question"] == 1.0
    shown = report["examples"][0]["student_after"]
    assert '"name": "plus"' in shown and "tool\n5" in shown and shown.endswith("It is 5.")  # the whole conversation
    assert "Tool use of the greedy conversations" in (tmp_path / "run" / "eval" / "eval.md").read_text()
    assert result["steps"] == 1


def test_the_scored_answer_of_a_conversation_is_its_last_assistant_turn():
    from distill.evaluation.evaluator import _last_run

    assert _last_run([1, 2, 3, 4, 5, 6], [True, True, False, True, True, False]) == [4, 5]
    assert _last_run([1, 2], [False, False]) == [] and _last_run([7], [True]) == [7]
