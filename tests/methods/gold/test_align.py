"""Byte alignment of two tokenizations (SmolLM2's and the test BPE) on text with accents, CJK and emoji."""

from __future__ import annotations

import pytest

from distill.align import TokenBytes, align_groups, paired_groups, text_and_ends
from tests.methods.gold.conftest import TEXT


def test_token_bytes_spell_the_text_on_both_tokenizers(tokenizer, smol_tokenizer):
    for tok, who in ((tokenizer, "student"), (smol_tokenizer, "teacher")):
        table = TokenBytes.from_tokenizer(tok, who)
        ids = tok(TEXT, add_special_tokens=False)["input_ids"]
        assert table.kind == "byte_level"
        assert table.join(ids) == TEXT.encode("utf-8")
        assert table.ends(ids)[-1] == len(TEXT.encode("utf-8"))


def test_groups_spell_the_same_bytes_on_both_sides(tokenizer, smol_tokenizer):
    student_table, teacher_table = TokenBytes.from_tokenizer(tokenizer, "s"), TokenBytes.from_tokenizer(smol_tokenizer, "t")
    s_ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    t_ids = smol_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert len(s_ids) != len(t_ids)  # genuinely different tokenizations
    s_groups, t_groups, count = align_groups(student_table.ends(s_ids), teacher_table.ends(t_ids))
    pairs = paired_groups(s_groups, t_groups, count)
    assert len(pairs) == count and any(len(s) > 1 for s, _ in pairs)
    assert [p for s, _ in pairs for p in s] == list(range(len(s_ids)))
    assert [p for _, t in pairs for p in t] == list(range(len(t_ids)))
    for s, t in pairs:
        assert student_table.join([s_ids[p] for p in s]) == teacher_table.join([t_ids[p] for p in t])
    # The student spells the emoji in several byte tokens, the teacher in one: they form one group.
    assert any("🙂".encode() in teacher_table.join([t_ids[p] for p in t]) and len(s) > 1 for s, t in pairs)


def test_zero_width_tokens_and_disagreeing_tails():
    s, t, count = align_groups([0, 3, 5, 5, 9], [3, 4, 5, 7])
    assert s == [0, 0, 1, 1, 2] and t == [0, 1, 1, 2] and count == 3
    assert paired_groups(s, t, count) == [([0, 1], [0]), ([2, 3], [1, 2]), ([4], [3])]
    s, t, count = align_groups([2, 4], [])
    assert paired_groups(s, t, count) == []


def test_invalid_utf8_from_sampling_keeps_ends_in_text_coordinates(tokenizer):
    table = TokenBytes.from_tokenizer(tokenizer, "student")
    emoji = tokenizer("🙂", add_special_tokens=False)["input_ids"]
    assert len(emoji) > 1  # the test BPE spells the emoji in byte tokens
    ids = tokenizer("ok ", add_special_tokens=False)["input_ids"] + emoji[:1] + tokenizer("x", add_special_tokens=False)["input_ids"]
    text, ends = text_and_ends(table, ids)
    assert "\ufffd" in text and text.startswith("ok ") and text.endswith("x")
    assert ends == sorted(ends) and ends[-1] == len(text.encode("utf-8"))


def test_wordpiece_fails_with_a_message_naming_the_fix():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.train_from_iterator([TEXT, "hello world"], trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=wp, unk_token="[UNK]")
    with pytest.raises(ValueError, match="teacher tokenizer: method gold .*byte-level BPE.*SentencePiece"):
        TokenBytes.from_tokenizer(fast, "teacher")


def _sentencepiece_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    sp = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    sp.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    sp.train_from_iterator(["hello world café", "naïve déjà vu"], trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", *byte_tokens]))
    return PreTrainedTokenizerFast(tokenizer_object=sp, unk_token="<unk>")


def test_sentencepiece_with_byte_fallback_is_supported():
    fast = _sentencepiece_tokenizer()
    table = TokenBytes.from_tokenizer(fast, "student")
    assert table.kind == "sentencepiece" and table.prefix_space
    ids = fast(TEXT, add_special_tokens=False)["input_ids"]
    assert table.join(ids).lstrip(b" ") == TEXT.encode("utf-8")  # 東京 etc. through byte fallback


def test_sentencepiece_dummy_prefix_does_not_shift_the_alignment(smol_tokenizer):
    """A Llama-2-style tokenizer spells " hello" for "hello": its byte ends must not be one past the other side's."""
    from distill.align import drop_prefix_space, encode_with_ends

    sp = _sentencepiece_tokenizer()
    sp_table, smol_table = TokenBytes.from_tokenizer(sp, "teacher"), TokenBytes.from_tokenizer(smol_tokenizer, "student")
    text = "hello world café 東京"
    s_ids, s_ends = encode_with_ends(smol_tokenizer, smol_table, text)
    t_ids, t_ends = encode_with_ends(sp, sp_table, text)
    assert sp_table.join(t_ids) == b" " + text.encode() and t_ends[-1] == s_ends[-1] == len(text.encode())
    s_groups, t_groups, count = align_groups(s_ends, t_ends)
    pairs = paired_groups(s_groups, t_groups, count)
    assert len(pairs) >= 3  # "hello", " world", ... close groups on both sides, not one group for everything
    for s, t in pairs:
        assert smol_table.join([s_ids[p] for p in s]).strip() == sp_table.join([t_ids[p] for p in t]).strip()
    # The other direction: an SP side's own text loses the dummy space, and its ends with it.
    spelled, ends = drop_prefix_space(sp_table, sp_table.join(t_ids).decode(), sp_table.ends(t_ids))
    assert spelled == text and ends == t_ends
