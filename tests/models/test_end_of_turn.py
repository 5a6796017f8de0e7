"""The token that ends a completion is the chat template's end of turn, which need not be the tokenizer's EOS
(Llama-3's `<|eot_id|>`, Gemma's `<end_of_turn>`): dataset and teacher completions end with it, generation
stops at it and at every EOS the tokenizer and the generation config name, and the run says which it used."""

from __future__ import annotations

import logging

import pytest
import torch

from distill.data import Example
from distill.generation import first_eos_mask
from distill.models import end_of_turn_id, eos_token_ids
from distill.rendering import TextRenderer
from distill.teachers.cross_tokenizer import CrossTokenizerTeacher
from tests.conftest import chat_rows, tiny_lm, train_tiny_tokenizer
from tests.helpers.training import make_distiller

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}"
    "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def eos_is_not_end_of_turn():
    """The tests' ChatML tokenizer, its EOS moved to a new `<|endoftext|>`: turns still end with <|im_end|>."""
    tokenizer = train_tiny_tokenizer()
    tokenizer.add_special_tokens({"eos_token": "<|endoftext|>"})
    return tokenizer


@pytest.fixture(scope="module")
def llama3_style():
    """A Llama-3-style tokenizer: EOS <|end_of_text|>, turns end with <|eot_id|>."""
    tokenizer = train_tiny_tokenizer()
    tokenizer.add_special_tokens({"eos_token": "<|end_of_text|>", "bos_token": "<|begin_of_text|>",
                                  "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


def test_the_end_of_turn_comes_from_the_chat_template_and_is_appended_first(eos_is_not_end_of_turn, llama3_style):
    turn = eos_is_not_end_of_turn.convert_tokens_to_ids("<|im_end|>")
    assert turn != eos_is_not_end_of_turn.eos_token_id
    model = tiny_lm(len(eos_is_not_end_of_turn), eos_token_id=eos_is_not_end_of_turn.eos_token_id)
    assert end_of_turn_id(eos_is_not_end_of_turn) == turn
    assert eos_token_ids(eos_is_not_end_of_turn, model) == [turn, eos_is_not_end_of_turn.eos_token_id]

    eot = llama3_style.convert_tokens_to_ids("<|eot_id|>")
    model = tiny_lm(len(llama3_style), eos_token_id=llama3_style.eos_token_id)
    model.generation_config.eos_token_id = [llama3_style.eos_token_id, eot, 7]  # a list, as Llama-3's
    assert eos_token_ids(llama3_style, model) == [eot, llama3_style.eos_token_id, 7]

    encoder = TextRenderer(llama3_style, 48, 20, eos_token_ids(llama3_style, model))
    ids = encoder.completion_ids("a short answer")
    assert ids[-1] == eot and llama3_style.eos_token_id not in ids
    # generation stops at any of them: everything after the first is masked
    tokens = torch.tensor([[5, 7, 9, 9], [5, eot, 9, 9], [llama3_style.eos_token_id, 5, 5, 5]])
    assert first_eos_mask(tokens, eos_token_ids(llama3_style, model)).tolist() == [
        [True, True, False, False], [True, True, False, False], [True, False, False, False]]


def test_without_a_chat_template_the_eos_ends_a_turn(eos_is_not_end_of_turn):
    plain = train_tiny_tokenizer()
    plain.chat_template = None
    assert end_of_turn_id(plain) is None
    assert eos_token_ids(plain, tiny_lm(len(plain), eos_token_id=plain.eos_token_id)) == [plain.eos_token_id]


def test_a_run_trains_dataset_completions_ending_with_the_turn_token_and_logs_it(eos_is_not_end_of_turn, tmp_path, caplog):
    tokenizer = eos_is_not_end_of_turn
    turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    teacher = tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id)
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    with caplog.at_level(logging.INFO, logger="distill"):
        rows = [{**row, "completion": f"a short answer {i}"} for i, row in enumerate(chat_rows(16))]
        distiller = make_distiller(tokenizer, tmp_path, rows=rows, teacher=teacher, student=student, lmbda=0.0,
                                   max_new_tokens=30)
    assert "end of turn (appended to dataset and teacher completions): '<|im_end|>'" in caplog.text
    assert all(e.completion_ids[-1] == turn for e in distiller.parts.encoded)
    assert not any(tokenizer.eos_token_id in e.completion_ids for e in distiller.parts.encoded)
    distiller.train()


def test_a_cross_tokenizer_teacher_ends_its_side_with_its_own_turn_token(llama3_style, tokenizer):
    """The teacher (Llama-3 style) gets its <|eot_id|> where the student's completion ended; a teacher sample
    ending with <|eot_id|> comes back to the student ending with the student's end of turn."""
    teacher_model = tiny_lm(len(llama3_style), eos_token_id=llama3_style.eos_token_id)
    student_eos = eos_token_ids(tokenizer, tiny_lm(len(tokenizer), eos_token_id=tokenizer.eos_token_id))
    teacher = CrossTokenizerTeacher(teacher_model, llama3_style, tokenizer, student_eos, 48, None, torch.device("cpu"))
    eot = llama3_style.convert_tokens_to_ids("<|eot_id|>")
    assert teacher.eos_ids[0] == eot
    example = Example(0, chat_rows(1)[0]["prompt"], None)
    student_ids = tokenizer("an answer", add_special_tokens=False)["input_ids"] + [student_eos[0]]
    mapped = teacher.map_completion(example, student_ids)
    assert mapped.completion_ids[-1] == eot
    back, hit_max = teacher.to_student(llama3_style("an answer", add_special_tokens=False)["input_ids"] + [eot], False, 30)
    assert back[-1] == student_eos[0] and not hit_max
