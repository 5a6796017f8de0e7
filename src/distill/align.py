"""Aligning two tokenizations of one completion text, through the bytes each token spells.

Cross-tokenizer distillation (method gold) compares a student and a teacher that cut the same text into
different tokens. Both sides are put on one coordinate system, the UTF-8 bytes of the completion text:

    student ids --TokenBytes--> bytes of each token --> text --teacher tokenizer--> teacher ids
                                   |                                                     |
                          cumulative byte ends                         cumulative byte ends (TokenBytes)
                                   \\__________________ align_groups ____________________/

A group closes at a byte position where both tokenizations have a token boundary; inside a group each side
has one or more consecutive tokens spelling the same bytes. Bytes, not characters, so a character split
across tokens (an emoji in two byte tokens) still lands at the right boundary, and no token is ever decoded
on its own (a lone token of a multi-byte character is not valid text).

`TokenBytes` reads the bytes of every vocabulary entry once, from the vocabulary itself: byte-level BPE
(GPT-2 style, SmolLM2, Llama 3, Qwen) and SentencePiece with byte fallback (Llama 2, Mistral, Gemma) are
supported; anything else (WordPiece, SentencePiece without byte fallback, normalising tokenizers) fails when
the run is set up with a message, because its tokens do not spell their bytes.
"""

from __future__ import annotations

import bisect
import codecs
import re
from dataclasses import dataclass

PROBE_TEXT = "Café naïve, déjà vu: 東京で ありがとう 🙂👍🏽!\nx = 3 * (4 + 5)"
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_METASPACE = "\u2581"


def byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level alphabet, character -> byte.

    Bytes that are printable Latin-1 characters stand for themselves; the other 68 bytes are shifted to the
    characters 256, 257, ... in byte order, so every byte has a visible, non-whitespace character.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[chr(byte)] = byte
        else:
            mapping[chr(256 + shifted)] = byte
            shifted += 1
    return mapping


@dataclass
class TokenBytes:
    """The UTF-8 bytes each token id spells (`table[id]`); `kind` is 'byte_level' or 'sentencepiece'."""

    table: list[bytes]
    kind: str
    max_plain_bytes: int = 1  # the most bytes one non-special token spells
    prefix_space: bool = False  # SentencePiece's dummy prefix: tokenizing a text spells " " + its bytes

    @classmethod
    def from_tokenizer(cls, tokenizer, who: str) -> "TokenBytes":
        """Read the table from `tokenizer`'s vocabulary; raises ValueError naming `who` when it cannot."""
        vocab = tokenizer.get_vocab()
        added = {token.content if hasattr(token, "content") else str(token)
                 for token in getattr(tokenizer, "added_tokens_decoder", {}).values()}
        size = max(vocab.values()) + 1
        plain = {token: index for token, index in vocab.items() if token not in added}
        alphabet = byte_level_alphabet()
        if plain and all(all(ch in alphabet for ch in token) for token in plain):
            kind = "byte_level"

            def spell(token: str) -> bytes:
                return bytes(alphabet[ch] for ch in token)
        elif any(_METASPACE in token or _BYTE_TOKEN.match(token) for token in plain):
            kind = "sentencepiece"

            def spell(token: str) -> bytes:
                match = _BYTE_TOKEN.match(token)
                return bytes([int(match.group(1), 16)]) if match else token.replace(_METASPACE, " ").encode("utf-8")
        else:
            raise ValueError(cls._unsupported(who, "its vocabulary is neither byte-level BPE nor SentencePiece"))
        table = [b""] * size
        for token, index in vocab.items():
            literal = token in added and not (kind == "sentencepiece" and _BYTE_TOKEN.match(token))
            table[index] = token.encode("utf-8") if literal else spell(token)
        result = cls(table, kind, max(1, max((len(table[i]) for i in plain.values()), default=1)))
        ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        spelled = result.join(ids)
        expected = PROBE_TEXT.encode("utf-8")
        if spelled != expected and not (kind == "sentencepiece" and spelled == b" " + expected):
            raise ValueError(cls._unsupported(who, f"its tokens of {PROBE_TEXT!r} spell {spelled!r}, not the text's bytes"))
        result.prefix_space = spelled != expected
        return result

    @staticmethod
    def _unsupported(who: str, why: str) -> str:
        return (f"{who} tokenizer: method gold maps completions between tokenizers through the bytes each token spells, "
                f"but {why}. Use a byte-level BPE tokenizer or a SentencePiece tokenizer with byte fallback; if the "
                "student and teacher share one tokenizer, use method gkd or on_policy instead.")

    def join(self, ids: list[int]) -> bytes:
        return b"".join(self.table[i] for i in ids)

    def ends(self, ids: list[int]) -> list[int]:
        """Cumulative byte end of each token, (L,) non-decreasing."""
        ends, total = [], 0
        for i in ids:
            total += len(self.table[i])
            ends.append(total)
        return ends


def text_and_ends(token_bytes: TokenBytes, ids: list[int]) -> tuple[str, list[int]]:
    """The text `ids` spell and each token's byte end in that text's UTF-8 encoding.

    Sampled ids need not spell valid UTF-8 (a tiny student may emit half a character); invalid bytes become
    U+FFFD, and a token's end is then counted in the text actually handed to the other tokenizer: the bytes
    of the characters completed once the token is read, so a broken character never splits a group wrongly.
    """
    raw = token_bytes.join(ids)
    text = raw.decode("utf-8", errors="replace")
    if text.encode("utf-8") == raw:
        return text, token_bytes.ends(ids)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    ends, total = [], 0
    for position, i in enumerate(ids):
        total += len(decoder.decode(token_bytes.table[i], final=position == len(ids) - 1).encode("utf-8"))
        ends.append(total)
    return text, ends


def drop_prefix_space(token_bytes: TokenBytes, text: str, ends: list[int]) -> tuple[str, list[int]]:
    """Remove a SentencePiece dummy-prefix space from a text its own ids spell, and from their byte ends.

    A SentencePiece tokenizer with a dummy prefix spells " hello" for "hello": the space is not the text's (its
    decoder drops it too). Left in, every byte end of that side would be one past the other side's, so no
    boundary would ever be shared. A token that spelled only that space ends at 0 and joins the first group.
    """
    if not (token_bytes.prefix_space and text.startswith(" ")):
        return text, ends
    return text[1:], [max(end - 1, 0) for end in ends]


def encode_with_ends(tokenizer, token_bytes: TokenBytes, text: str) -> tuple[list[int], list[int]]:
    """`text` tokenized without special tokens, and each token's byte end in `text`'s UTF-8 encoding."""
    if not text:
        return [], []
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ends = token_bytes.ends(ids)
    if token_bytes.prefix_space and token_bytes.join(ids) == b" " + text.encode("utf-8"):
        ends = [max(end - 1, 0) for end in ends]  # the dummy prefix is not one of the text's bytes
    return ids, ends


def _closing_ends(ends: list[int]) -> set[int]:
    """Byte positions where a token boundary lies: the end of each token not followed by a zero-width one."""
    return {end for k, end in enumerate(ends) if k + 1 == len(ends) or ends[k + 1] > end}


def align_groups(student_ends: list[int], teacher_ends: list[int]) -> tuple[list[int], list[int], int]:
    """Group each token of two tokenizations of one text: (student group per token, teacher group per token, groups).

    Groups close at the byte positions where both sides have a token boundary, in order. Tokens past the
    last common boundary (the sides disagree about the text's end) share one trailing group. Every group
    index in [0, groups) is used by at least one side; `paired_groups` drops those only one side has.
    """
    common = sorted(_closing_ends(student_ends) & _closing_ends(teacher_ends))
    student = [bisect.bisect_left(common, end) for end in student_ends]
    teacher = [bisect.bisect_left(common, end) for end in teacher_ends]
    groups = max(student + teacher, default=-1) + 1
    return student, teacher, groups


def paired_groups(student_groups: list[int], teacher_groups: list[int], groups: int) -> list[tuple[list[int], list[int]]]:
    """[(student token positions, teacher token positions)] of each group both sides have, in order."""
    sides: list[tuple[list[int], list[int]]] = [([], []) for _ in range(groups)]
    for position, group in enumerate(student_groups):
        sides[group][0].append(position)
    for position, group in enumerate(teacher_groups):
        sides[group][1].append(position)
    return [(s, t) for s, t in sides if s and t]
