"""A teacher with another tokenizer scores a whole conversation (method gold): it renders the conversation with its own
template (the model's turns as the bytes the student wrote, the tool turns as its template renders them) and only the
model's turns are aligned, never the environment's bytes."""

from __future__ import annotations

import copy
import json

import datasets
import pytest
import torch

from distill.align import TokenBytes
from distill.batch import Completion, collate
from distill.data import examples_from_dataset
from distill.losses.uld import ULDSettings
from distill.rendering import ConversationRenderer, TextRenderer
from distill.teachers.cross_tokenizer import CrossTokenizerTeacher
from distill.training.trainer import Distiller
from tests.conftest import tiny_lm
from tests.conversations.templates import real_template
from tests.conversations.test_render import CONVERSATION, TOOLS
from tests.conversations.test_training import scripted_turns
from tests.helpers.training import make_config

PLAIN_ULD = ULDSettings(None, 0.0, 1.0, 0.0)


def teacher_tokenizer(smol_tokenizer, family: str):
    """SmolLM2's tokenizer (another vocabulary than the student's) with its own ChatML, Qwen2.5's real template (tools
    in its system message, tool results as <tool_response> user turns) or Llama 3's (other headers, no newline after
    the end of turn), the real ones read from the installed trl."""
    tokenizer = copy.deepcopy(smol_tokenizer)
    if family == "llama3":
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
        tokenizer.chat_template = real_template("llama3")
        tokenizer.eos_token = "<|eot_id|>"
    elif family in ("qwen2_5", "qwen3"):
        tokenizer.chat_template = real_template(family)
    return tokenizer


def conversation_completion(tokenizer, messages, tools) -> Completion:
    rows = datasets.Dataset.from_list([{"messages": messages, "tools": tools}])
    example = examples_from_dataset(rows, "dataset")[0]
    encoded = TextRenderer(tokenizer, 512, 512, [tokenizer.eos_token_id]).row(example)
    return Completion(encoded.prompt_ids, encoded.completion_ids, "dataset", example=example,
                      trained_mask=encoded.completion_trained, layout=encoded.completion_layout)


@pytest.mark.parametrize("family", ["chatml", "qwen2_5", "llama3"])
def test_the_teacher_reads_the_conversation_as_its_own_template_renders_it(tokenizer, smol_tokenizer, family):
    teacher_tok = teacher_tokenizer(smol_tokenizer, family)
    completion = conversation_completion(tokenizer, CONVERSATION, TOOLS)
    layout = completion.layout
    assert layout is not None and [s.assistant for s in layout.segments].count(True) == 4
    teacher = CrossTokenizerTeacher(tiny_lm(len(teacher_tok), seed=3, eos_token_id=teacher_tok.eos_token_id), teacher_tok,
                                    tokenizer, [tokenizer.eos_token_id], 512, PLAIN_ULD, torch.device("cpu"))
    mapped = teacher.map_completion(completion.example, completion.completion_ids, layout)

    # What the teacher's template makes of the same conversation, with each assistant turn as the student wrote it.
    turns = iter(tokenizer.decode(completion.completion_ids[start:end - 1])
                 for start, end, segment in layout.spans() if segment.assistant)
    written = [{"role": "assistant", "content": next(turns)} if m["role"] == "assistant" else m for m in CONVERSATION]
    (expected,) = ConversationRenderer(teacher_tok, [teacher_tok.eos_token_id]).render(written, TOOLS, "expected").pieces
    last = max(k for k, flag in enumerate(expected.trained) if flag)
    assert mapped.prompt_ids == expected.prompt_ids
    assert mapped.completion_ids == expected.completion_ids[: last + 1]
    if family == "qwen2_5":  # its own tool turns, not the student's `<|im_start|>tool`
        assert "<tool_response>\n391\n</tool_response>" in teacher_tok.decode(mapped.completion_ids)

    # Only the model's turns are aligned: every trained student token in one group, no environment token in any, and
    # each group spells the same bytes on both sides (the EOS pairs aside).
    student_bytes = TokenBytes.from_tokenizer(tokenizer, "student")
    teacher_bytes = TokenBytes.from_tokenizer(teacher_tok, "teacher")
    grouped = [p for s, _ in mapped.groups for p in s]
    assert sorted(grouped) == completion.trained_indices()
    for s, t in mapped.groups:
        ids_s = [completion.completion_ids[p] for p in s]
        ids_t = [mapped.completion_ids[q] for q in t]
        if ids_s == [tokenizer.eos_token_id]:
            assert ids_t == [teacher_tok.eos_token_id]
        else:
            assert student_bytes.join(ids_s) == teacher_bytes.join(ids_t)


def test_the_signal_over_a_conversation_is_each_turn_scored_with_the_teachers_full_prefix(tokenizer, smol_tokenizer):
    """The teacher's hidden states at each model turn equal a forward of its prefix (its prompt, the turns before, its
    own environment turns) and that turn alone, and the environment's positions get no group (holes in the mask)."""
    teacher_tok = teacher_tokenizer(smol_tokenizer, "qwen2_5")
    model = tiny_lm(len(teacher_tok), seed=3, eos_token_id=teacher_tok.eos_token_id)
    teacher = CrossTokenizerTeacher(model, teacher_tok, tokenizer, [tokenizer.eos_token_id], 512, PLAIN_ULD, torch.device("cpu"))
    completion = conversation_completion(tokenizer, CONVERSATION, TOOLS)
    batch = collate([completion], "dataset", tokenizer.pad_token_id)
    signal = teacher.score(batch, 1.0)
    mapped = teacher.map_completion(completion.example, completion.completion_ids, completion.layout)
    rows = signal.alignment.row_group
    assert int((rows >= 0).sum()) == len(completion.trained_indices())  # every trained token is in a group
    ids = mapped.prompt_ids + mapped.completion_ids
    for group, (_, t) in enumerate(mapped.groups):
        end = len(mapped.prompt_ids) + t[-1]  # the position predicting the group's last teacher token
        with torch.no_grad():
            hidden = model.model(torch.tensor([ids[:end]])).last_hidden_state[0, -1]
        torch.testing.assert_close(signal.teacher_hidden[group], hidden, rtol=1e-4, atol=1e-5)


def test_a_teacher_template_that_drops_earlier_turns_is_refused_with_what_to_do(tokenizer, smol_tokenizer):
    teacher_tok = copy.deepcopy(smol_tokenizer)
    teacher_tok.chat_template = (  # shows only the last two messages: not prefix-preserving
        "{% for m in messages[-2:] %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    teacher = CrossTokenizerTeacher(tiny_lm(len(teacher_tok), seed=3, eos_token_id=teacher_tok.eos_token_id), teacher_tok,
                                    tokenizer, [tokenizer.eos_token_id], 512, PLAIN_ULD, torch.device("cpu"))
    completion = conversation_completion(tokenizer, CONVERSATION, TOOLS)
    with pytest.raises(ValueError, match="preserves prefixes"):
        teacher.map_completion(completion.example, completion.completion_ids, completion.layout)
    qwen3 = teacher_tokenizer(smol_tokenizer, "qwen3")  # Qwen3's real template drops the empty <think> of a turn
    teacher = CrossTokenizerTeacher(tiny_lm(len(qwen3), seed=3, eos_token_id=qwen3.eos_token_id), qwen3, tokenizer,
                                    [tokenizer.eos_token_id], 512, PLAIN_ULD, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"teacher's chat template: .*'<think>\\n\\n</think>.* preserves prefixes"):
        teacher.map_completion(completion.example, completion.completion_ids, completion.layout)


def _gold_run(tokenizer, smol_tokenizer, tmp_path, rows, **fields) -> Distiller:
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    teacher_tok = teacher_tokenizer(smol_tokenizer, "qwen2_5")
    teacher = tiny_lm(len(teacher_tok), layers=2, seed=11, eos_token_id=teacher_tok.eos_token_id)
    config = make_config(tmp_path, method="gold", max_new_tokens=200, max_prompt_length=300, **fields)
    return Distiller(config, student=student, teacher=teacher, tokenizer=tokenizer, teacher_tokenizer=teacher_tok,
                     train_dataset=datasets.Dataset.from_list(rows))


def test_gold_trains_on_the_datasets_conversations(tokenizer, smol_tokenizer, tmp_path):
    rows = [{"messages": CONVERSATION, "tools": TOOLS}] * 4
    run = _gold_run(tokenizer, smol_tokenizer, tmp_path, rows, lmbda=0.0, seq_kd=False, lmbda_schedule="constant")
    before = {n: p.detach().clone() for n, p in run.student_model.named_parameters()}
    result = run.train()
    assert result["steps"] == 2 and torch.isfinite(torch.tensor(result["train"]["loss"])) and result["train"]["loss"] > 0
    assert any(not torch.equal(before[n], p) for n, p in run.student_model.named_parameters())


def test_gold_scores_the_students_tool_calling_trajectories(tokenizer, smol_tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    generate, call_ids, answer_ids = scripted_turns(tokenizer)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}]} for i in range(4)]
    run = _gold_run(tokenizer, smol_tokenizer, tmp_path, rows, lmbda=1.0, seq_kd=False, lmbda_schedule="constant",
                    tools=["tests.conversations.toolbox:plus"], max_turns=3)
    run.setup()
    batch = run.rollout.take(0, {})[0]
    completion = batch.completions[0]
    assert completion.layout is not None and [s.assistant for s in completion.layout.segments] == [True, False, True]
    assert completion.layout.segments[1].messages == ({"role": "tool", "name": "plus", "content": "5"},)
    mapped = run.teacher.map_completion(completion.example, completion.completion_ids, completion.layout)
    text = run.teacher.tokenizer.decode(mapped.prompt_ids + mapped.completion_ids)
    assert '"name": "plus"' in text.split("<|im_start|>user")[0]  # the tools, in the teacher's system message
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>" in text
    result = run.train()
    assert result["steps"] == 2 and result["train"]["loss"] > 0
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(record["tools/turns"] == 2.0 for record in logged)
