"""The cross-tokenizer teacher: its own prompts, byte-aligned scoring, and seq_kd completions re-encoded into
the student's tokenizer with the EOS rules the reference library got wrong (seed 003)."""

from __future__ import annotations

import pytest
import torch

from distill.batch import Completion, collate
from distill.data import Example
from distill.generation import SamplingParams
from distill.losses import LogitHead
from distill.losses.uld import ULDSettings
from distill.objectives import (
    DivergenceObjective,
    LossSettings,
    StepContext,
    StudentTokens,
    divergence,
)
from distill.objectives.student import student_loss
from distill.teachers.cross_tokenizer import CrossTokenizerTeacher
from tests.conftest import tiny_lm
from tests.helpers.training import holed_mask
from tests.losses.reference import uld_groups_reference
from tests.methods.gold.conftest import TEXT

CHAT = [{"role": "user", "content": "Où est 東京? Réponds avec un emoji 🙂"}]


def make_teacher(smol_teacher, smol_tokenizer, tokenizer, max_prompt_length=256, settings=ULDSettings()):
    return CrossTokenizerTeacher(smol_teacher, smol_tokenizer, tokenizer, [tokenizer.eos_token_id], max_prompt_length,
                                 settings, torch.device("cpu"))


def test_pad_equals_eos_on_both_sides(tokenizer, smol_tokenizer):
    assert tokenizer.pad_token_id == tokenizer.eos_token_id and smol_tokenizer.pad_token_id == smol_tokenizer.eos_token_id == 2


def test_teacher_eos_becomes_student_eos(smol_teacher, smol_tokenizer, tokenizer):
    teacher = make_teacher(smol_teacher, smol_tokenizer, tokenizer)
    body = smol_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    ids, clipped = teacher.to_student(body + [2], hit_max=False, max_new_tokens=200)
    assert ids == tokenizer(TEXT, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] and not clipped
    # A completion that is only the teacher's EOS is the student's EOS alone, not an empty completion.
    assert teacher.to_student([2], hit_max=False, max_new_tokens=200) == ([tokenizer.eos_token_id], False)
    # Without the EOS (stopped by max_new_tokens) no EOS is invented.
    ids, clipped = teacher.to_student(body, hit_max=True, max_new_tokens=200)
    assert tokenizer.eos_token_id not in ids and clipped


def test_reencoded_completion_is_cut_to_max_new_tokens(smol_teacher, smol_tokenizer, tokenizer):
    teacher = make_teacher(smol_teacher, smol_tokenizer, tokenizer)
    body = smol_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    ids, clipped = teacher.to_student(body + [2], hit_max=False, max_new_tokens=5)
    assert len(ids) == 5 and tokenizer.eos_token_id not in ids and clipped
    # A character cut in half by the teacher's max_new_tokens is held back, not turned into U+FFFD.
    ok = smol_tokenizer("ok", add_special_tokens=False)["input_ids"]
    byte_of_emoji = smol_tokenizer.convert_tokens_to_ids(["ð"])  # the emoji's first byte as a byte-level token
    assert "🙂".encode()[0] == 0xF0 and smol_tokenizer.decode(byte_of_emoji) == "\ufffd"  # half a character: not text alone
    ids, clipped = teacher.to_student(ok + byte_of_emoji, True, 50)
    assert tokenizer.decode(ids) == "ok" and ids == tokenizer("ok", add_special_tokens=False)["input_ids"] and clipped
    # The whole character, in however many teacher tokens, is kept.
    ids, _ = teacher.to_student(ok + smol_tokenizer("🙂", add_special_tokens=False)["input_ids"], True, 50)
    assert tokenizer.decode(ids) == "ok🙂"


def test_generation_uses_the_teachers_own_prompt_with_special_tokens_budgeted_at_the_end(smol_teacher, smol_tokenizer, tokenizer, monkeypatch):
    teacher = make_teacher(smol_teacher, smol_tokenizer, tokenizer, max_prompt_length=12)
    seen = {}
    original = smol_teacher.generate

    def spy(input_ids, attention_mask, **kwargs):
        seen["prompt"] = input_ids[0][attention_mask[0].bool()].tolist()
        seen["eos"] = kwargs["eos_token_id"]
        return original(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    monkeypatch.setattr(smol_teacher, "generate", spy)
    torch.manual_seed(0)
    [sample] = teacher.generate([[5, 6, 7]], SamplingParams(1.0, 1.0, 0, 8, engine="hf"), examples=[Example(0, CHAT, None)])
    full = smol_tokenizer(smol_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    assert len(full) > 12 and seen["prompt"] == full[-12:]  # keep-end budget, in teacher tokens
    im_start = smol_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert im_start in seen["prompt"] and seen["eos"] == [2]  # special tokens kept: the assistant header
    assert all(0 <= i < len(tokenizer) for i in sample.ids) and len(sample.ids) <= 8  # student ids


def test_teacher_without_eos_runs_to_max_new_tokens(smol_tokenizer, tokenizer):
    from copy import deepcopy

    no_eos = deepcopy(smol_tokenizer)
    no_eos.eos_token = None
    no_eos.pad_token = None
    # No stop token at all: the chat template's end of turn (<|im_end|>) would be one (`end_of_turn_id`).
    no_eos.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}assistant: {% endif %}")
    model = tiny_lm(len(smol_tokenizer), layers=1, seed=3, eos_token_id=None)
    model.generation_config.eos_token_id = None
    teacher = make_teacher(model, no_eos, tokenizer)
    assert teacher.eos_ids == [] and teacher.pad_id == 0
    torch.manual_seed(0)
    outputs = teacher.generate([[1], [1]], SamplingParams(1.0, 1.0, 0, 6), examples=[Example(0, CHAT, None), Example(1, "texte brut 🙂", None)])
    for sample in outputs:
        assert tokenizer.eos_token_id not in sample.ids and sample.hit_max
    # Scoring a student completion that ended with EOS: the student EOS has no teacher counterpart and is not trained.
    body = tokenizer("déjà", add_special_tokens=False)["input_ids"]
    mapped = teacher.map_completion(Example(0, CHAT, None), body + [tokenizer.eos_token_id])
    assert all(len(body) not in s for s, _ in mapped.groups) and 2 not in mapped.completion_ids


def score_against_reference(teacher, tokenizer, smol_tokenizer, student, completions, temperature):
    batch = collate(completions, "teacher", tokenizer.pad_token_id)
    signal = teacher.score(batch, temperature)

    objective = DivergenceObjective.constant(0.5, temperature, 3)
    got = student_loss(student, len(tokenizer), batch, signal, objective, StepContext("student"))
    # Naive: full logits of both models at every position, rows picked from the mapped completions by hand.
    s_rows, t_rows, s_targets, t_targets, groups = [], [], [], [], []
    for c in completions:
        m = teacher.map_completion(c.example, c.completion_ids)
        with torch.no_grad():
            s_logits = student(torch.tensor([c.prompt_ids + c.completion_ids])).logits[0].double()
            t_logits = teacher.model(torch.tensor([m.prompt_ids + m.completion_ids])).logits[0].double()
        s0, t0 = len(s_rows), len(t_rows)
        s_rows += [s_logits[len(c.prompt_ids) + k - 1] for k in range(len(c.completion_ids))]
        t_rows += [t_logits[len(m.prompt_ids) + k - 1] for k in range(len(m.completion_ids))]
        s_targets += c.completion_ids
        t_targets += m.completion_ids
        # A group holding an untrained student token (a hole in the mask) is left out whole.
        groups += [([s0 + p for p in s], [t0 + p for p in t]) for s, t in m.groups if all(c.mask[p] for p in s)]
    want = uld_groups_reference(torch.stack(s_rows), torch.stack(t_rows), s_targets, t_targets, groups, temperature)
    return got, want, groups, batch


def test_score_matches_the_naive_reference_and_pairs_eos(smol_teacher, smol_tokenizer, tokenizer):
    teacher = make_teacher(smol_teacher, smol_tokenizer, tokenizer)
    student = tiny_lm(len(tokenizer), layers=1, seed=4, eos_token_id=tokenizer.eos_token_id)
    eos = tokenizer.eos_token_id
    prompt = tokenizer(tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    completions = [
        Completion(prompt, tokenizer(TEXT, add_special_tokens=False)["input_ids"] + [eos], "teacher", example=Example(0, CHAT, None)),
        Completion(prompt[:5], tokenizer("Zoë 東京", add_special_tokens=False)["input_ids"], "teacher", example=Example(1, "Zoë?", None)),
        Completion(prompt, [eos], "teacher", example=Example(2, CHAT, None)),
    ]
    got, want, groups, batch = score_against_reference(teacher, tokenizer, smol_tokenizer, student, completions, 1.5)
    assert abs(float(got.loss_sum.detach()) - float(want)) <= 1e-4 * float(want)
    assert int(got.num_tokens) == batch.num_completion_tokens  # every student token is in a group
    mapped = teacher.map_completion(completions[0].example, completions[0].completion_ids)
    assert mapped.completion_ids[-1] == 2 and mapped.groups[-1] == ([len(completions[0].completion_ids) - 1], [len(mapped.completion_ids) - 1])
    assert teacher.map_completion(completions[2].example, [eos]).groups == [([0], [0])]


def test_a_mask_with_holes_drops_the_groups_it_cuts_and_matches_the_reference(smol_teacher, smol_tokenizer, tokenizer):
    teacher = make_teacher(smol_teacher, smol_tokenizer, tokenizer)
    student = tiny_lm(len(tokenizer), layers=1, seed=4, eos_token_id=tokenizer.eos_token_id)
    eos = tokenizer.eos_token_id
    prompt = tokenizer(tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"] + [eos]
    other = tokenizer("Zoë 東京 déjà vu", add_special_tokens=False)["input_ids"]
    completions = [Completion(prompt, ids, "teacher", example=Example(0, CHAT, None), trained_mask=holed_mask(len(ids))),
                   Completion(prompt[:5], other, "teacher", example=Example(1, "Zoë?", None), trained_mask=holed_mask(len(other), 1))]
    got, want, groups, batch = score_against_reference(teacher, tokenizer, smol_tokenizer, student, completions, 1.5)
    whole = sum(len(teacher.map_completion(c.example, c.completion_ids).groups) for c in completions)
    assert 0 < len(groups) < whole and batch.num_completion_tokens < len(ids) + len(other)
    assert float(want) > 0 and abs(float(got.loss_sum.detach()) - float(want)) <= 1e-4 * float(want)


def test_empty_completion_is_long_typed_and_scores_zero(smol_teacher, smol_tokenizer, tokenizer):
    teacher = make_teacher(smol_teacher, smol_tokenizer, tokenizer)
    student = tiny_lm(len(tokenizer), layers=1, seed=4, eos_token_id=tokenizer.eos_token_id)
    batch = collate([Completion([3, 4, 5], [], "teacher", example=Example(0, CHAT, None))], "teacher", tokenizer.pad_token_id)
    assert batch.input_ids.dtype == torch.long and batch.num_completion_tokens == 0
    signal = teacher.score(batch, 1.0)
    assert signal.teacher_hidden.shape[0] == 0 and signal.alignment.row_group.dtype == torch.long

    out = student_loss(student, len(tokenizer), batch, signal, DivergenceObjective.constant(0.5, 1.0, 4), StepContext("student"))
    out.loss_sum.backward()
    assert float(out.loss_sum.detach()) == 0.0 and int(out.num_tokens) == 0


def test_score_refuses_another_temperature(smol_teacher, smol_tokenizer, tokenizer):
    teacher = make_teacher(smol_teacher, smol_tokenizer, tokenizer)
    batch = collate([Completion([3, 4], [7, 8], "teacher", example=Example(0, CHAT, None))], "teacher", tokenizer.pad_token_id)
    signal = teacher.score(batch, 2.0)
    with pytest.raises(ValueError, match="temperature 2.0"):
        divergence(StudentTokens(torch.zeros(2, 32), LogitHead(torch.zeros(len(tokenizer), 32)), torch.tensor([7, 8])), signal,
                   LossSettings(0.5, 1.0, 4))


@pytest.mark.parametrize("engine", ["hf", "lean"])
def test_teacher_sampling_stops_at_the_students_byte_budget_and_padding_is_not_an_eos(smol_teacher, smol_tokenizer, monkeypatch, engine):
    from distill.models.byte_student import byte_tokenizer

    student_tokenizer = byte_tokenizer()  # one byte per token: 6 student tokens are 6 bytes
    teacher = make_teacher(smol_teacher, smol_tokenizer, student_tokenizer)
    widths = []
    if engine == "lean":  # the budget criterion ends the lean loop as it ends HF generate
        import distill.generation.lean as rollout

        original = rollout.lean_generate

        def spy(model, input_ids, *args, **kwargs):
            out, log_probs = original(model, input_ids, *args, **kwargs)
            widths.append(out.shape[1])
            return out, log_probs

        monkeypatch.setattr(rollout, "lean_generate", spy)
    else:
        original = smol_teacher.generate

        def spy(**kwargs):
            out = original(**kwargs)
            widths.append(out.shape[1] - kwargs["input_ids"].shape[1])
            return out

        monkeypatch.setattr(smol_teacher, "generate", spy)
    torch.manual_seed(1)
    examples = [Example(i, CHAT, None) for i in range(3)]
    outputs = teacher.generate([[1]] * 3, SamplingParams(1.0, 1.0, 0, 6, engine=engine), batch_size=2, examples=examples)
    assert len(outputs) == 3 and len(widths) == 2 and max(widths) < 6  # stopped long before 6 teacher tokens
    for sample in outputs:
        assert len(sample.ids) == 6 and student_tokenizer.eos_token_id not in sample.ids and sample.hit_max


def test_with_one_tokenizer_on_both_sides_ids_pass_through_unchanged(tokenizer):
    """Seed 003: with the same tokenizer the raw ids pass through both ways, EOS kept, no drift at BPE
    boundaries (a text round trip merges split pieces back into one token), and every group is one token."""
    teacher = CrossTokenizerTeacher(tiny_lm(len(tokenizer), seed=5, eos_token_id=tokenizer.eos_token_id), tokenizer,
                                    tokenizer, [tokenizer.eos_token_id], 64, ULDSettings(), torch.device("cpu"))
    eos = tokenizer.eos_token_id
    # A merged token spelled in single characters: re-encoding that text through the tokenizer merges it back.
    merged = next(t for t in sorted(tokenizer.get_vocab(), key=len, reverse=True) if t.isalpha() and len(t) >= 4)
    split = [tokenizer.convert_tokens_to_ids(c) for c in merged] + tokenizer("answer", add_special_tokens=False)["input_ids"]
    assert None not in split
    assert tokenizer(tokenizer.decode(split), add_special_tokens=False)["input_ids"] != split  # the drift avoided
    ids, hit_max = teacher.to_student(split + [eos], False, 30)
    assert ids == split + [eos] and not hit_max
    assert teacher.to_student(split + [eos], False, 2) == (split[:2], True)
    mapped = teacher.map_completion(Example(0, CHAT, None), split + [eos])
    assert mapped.completion_ids == split + [eos]
    assert mapped.groups == [([k], [k]) for k in range(len(split) + 1)]
