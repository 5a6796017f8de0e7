"""Dataset conversations with the real Qwen2.5, Qwen3 and Llama 3 chat templates (read at test time from the installed
trl, `tests.conversations.templates`): parallel calls, thinking on and off, `reasoning_content`, templates that add a
system prompt, and a template that re-renders its history trained in pieces, each turn in the context it was
generated in; on a template that preserves prefixes the pieces give the single sequence's loss and gradient."""

from __future__ import annotations

import datasets
import pytest
import torch

from distill.batch import Completion, collate
from distill.data import examples_from_dataset
from distill.objectives import DivergenceObjective, StepContext
from distill.objectives.student import student_loss
from distill.rendering import ConversationRenderer, TextRenderer
from distill.rendering.conversation import first_difference
from distill.teachers.local import LocalTeacher
from tests.conftest import tiny_lm
from tests.conversations.conftest import family_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "arithmetic",
                                           "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]


def call(expr: str) -> dict:
    return {"type": "function", "function": {"name": "calc", "arguments": {"expr": expr}}}


USER = {"role": "user", "content": "What are 2 + 3 and 4 + 5?"}
PARALLEL = [USER,
            {"role": "assistant", "content": "", "tool_calls": [call("2+3"), call("4+5")]},
            {"role": "tool", "name": "calc", "content": "5"},
            {"role": "tool", "name": "calc", "content": "9"},
            {"role": "assistant", "content": "They are 5 and 9."}]


def template_text(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def trained_runs(tokenizer, piece) -> list[str]:
    """The trained runs of a piece's completion, decoded."""
    runs, current = [], []
    for token, flag in zip(piece.completion_ids, piece.trained):
        if flag:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3"])
def test_parallel_calls_train_with_the_qwen_templates(family):
    """Consecutive tool results are one user turn in both templates: not a prefix of itself after the first tool
    message, so only assistant-turn boundaries are checked. Qwen2.5's conversation is one sequence whose ids decode to
    exactly what the template renders; Qwen3's re-renders the first turn without its empty <think> block once the
    results follow, so each turn is a piece whose prompt is that context."""
    tokenizer, eos = family_tokenizer(family)
    rendered = ConversationRenderer(tokenizer, eos).render(PARALLEL, TOOLS, "row 0")
    runs = [run for piece in rendered.pieces for run in trained_runs(tokenizer, piece)]
    assert len(runs) == 2 and runs[0].count("<tool_call>") == 2 and runs[1].endswith("They are 5 and 9.<|im_end|>")
    results = "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n9\n</tool_response><|im_end|>"
    if family == "qwen2_5":
        (piece,) = rendered.pieces
        assert tokenizer.decode(piece.prompt_ids + piece.completion_ids) == template_text(tokenizer, PARALLEL, tools=TOOLS)
        assert results in tokenizer.decode([t for t, f in zip(piece.completion_ids, piece.trained) if not f])
    else:
        first, second = rendered.pieces
        assert runs[0].startswith("<think>\n\n</think>\n\n<tool_call>")  # what a thinking model wrote: an empty block
        assert tokenizer.decode(second.prompt_ids) == template_text(tokenizer, PARALLEL[:4], tools=TOOLS,
                                                                    add_generation_prompt=True)
        assert results in tokenizer.decode(second.prompt_ids) and "<think>" not in tokenizer.decode(second.prompt_ids)
        assert second.layout.history == tuple(PARALLEL[1:4])


def test_a_failed_prefix_names_what_differs_and_blames_think_only_when_one_is_dropped():
    no_think = first_difference("<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n",
                                "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n9")
    assert "'<|im_end|>\\n'" in no_think and "<tool_response>" in no_think and "think" not in no_think
    dropped = first_difference("<|im_start|>assistant\n<think>\nx\n</think>\n\n4<|im_end|>", "<|im_start|>assistant\n4<|im_end|>")
    assert "it had '<think>" in dropped and "`<think>` block of an earlier turn is no longer shown" in dropped


THINKING = [USER,
            {"role": "assistant", "reasoning_content": "Two sums: one call each.", "content": "",
             "tool_calls": [call("2+3"), call("4+5")]},
            {"role": "tool", "name": "calc", "content": "5"},
            {"role": "tool", "name": "calc", "content": "9"},
            {"role": "assistant", "reasoning_content": "Both came back.", "content": "5 and 9."},
            {"role": "user", "content": "And their sum?"},
            {"role": "assistant", "reasoning_content": "5 + 9 = 14.", "content": "14."}]


def test_qwen3_keeps_a_querys_reasoning_and_starts_a_piece_where_a_later_query_drops_it():
    """Thinking on (the default): `reasoning_content` is rendered and trained as <think> blocks; the turns answering the
    first question keep theirs while it is the last query (one piece), and the next question's context drops them
    (a second piece, whose prompt is that context)."""
    tokenizer, eos = family_tokenizer("qwen3")
    first, second = ConversationRenderer(tokenizer, eos).render(THINKING, TOOLS, "row 0").pieces
    assert first.turns == 2 and second.turns == 1
    runs = trained_runs(tokenizer, first) + trained_runs(tokenizer, second)
    assert runs[0].startswith("<think>\nTwo sums: one call each.\n</think>\n\n<tool_call>")
    assert runs[1] == "<think>\nBoth came back.\n</think>\n\n5 and 9.<|im_end|>"
    assert runs[2] == "<think>\n5 + 9 = 14.\n</think>\n\n14.<|im_end|>"
    context = tokenizer.decode(second.prompt_ids)
    assert context == template_text(tokenizer, THINKING[:6], tools=TOOLS, add_generation_prompt=True)
    assert "Both came back." not in context and "5 and 9." in context  # the reasoning is gone, the answer stays
    assert tokenizer.decode(first.prompt_ids + first.completion_ids) == template_text(tokenizer, THINKING[:5], tools=TOOLS)


def test_qwen3_with_thinking_off_trains_the_answers_after_the_empty_block_its_prompt_opens_with():
    """enable_thinking false: the generation prompt ends with an empty <think> block, so the trained turn is the
    answer alone; the next context drops that block (a piece per turn). A turn with reasoning_content cannot follow
    that prompt: refused, naming the message and what differs."""
    tokenizer, eos = family_tokenizer("qwen3")
    renderer = ConversationRenderer(tokenizer, eos, {"enable_thinking": False})
    first, second = renderer.render(PARALLEL, TOOLS, "row 0").pieces
    assert tokenizer.decode(first.prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    runs = trained_runs(tokenizer, first) + trained_runs(tokenizer, second)
    assert runs[0].startswith("<tool_call>") and runs[1] == "They are 5 and 9.<|im_end|>"
    assert tokenizer.decode(second.prompt_ids) == template_text(tokenizer, PARALLEL[:4], tools=TOOLS,
                                                                add_generation_prompt=True, enable_thinking=False)
    with pytest.raises(ValueError, match=r"row 7 message 1: .*no continuation of its own generation prompt \(from "
                                         r"character \d+ it had '\\n</think>.*now 'Two sums.*enable_thinking false"):
        renderer.render(THINKING, TOOLS, "row 7")


def test_max_new_tokens_counts_the_conversation_after_its_first_prompt_across_pieces():
    """A piece that starts past `max_new_tokens` (its context grown by the conversation before it) is dropped, and the
    conversation marked cut; a budget that holds it keeps it."""
    tokenizer, eos = family_tokenizer("qwen3")
    example = examples_from_dataset(datasets.Dataset.from_list([{"messages": PARALLEL, "tools": TOOLS}]), "d")[0]
    whole = TextRenderer(tokenizer, 4096, 4096, eos).row(example)
    assert len(whole.later) == 1 and not whole.completion_cut and not whole.later[0].completion_cut
    grown = len(whole.later[0].prompt_ids) - len(whole.prompt_ids)
    cut = TextRenderer(tokenizer, 4096, grown, eos).row(example)
    assert cut.later == () and cut.completion_cut and cut.completion_ids == whole.completion_ids
    held = TextRenderer(tokenizer, 4096, grown + 3, eos).row(example)
    assert len(held.later[0].completion_ids) == 3 and held.later[0].completion_cut


def test_reasoning_content_of_a_single_answer_is_trained_as_the_template_shows_it():
    rows = datasets.Dataset.from_list([{"messages": [{"role": "user", "content": "2 + 2?"},
                                                     {"role": "assistant", "content": "4.", "reasoning_content": "Add."}]}])
    (example,) = examples_from_dataset(rows, "dataset")
    assert example.turns is not None and example.completion is None  # a one-turn conversation, not a bare answer
    tokenizer, eos = family_tokenizer("qwen3")
    encoded = TextRenderer(tokenizer, 256, 256, eos).row(example)
    assert tokenizer.decode([t for t, f in zip(encoded.completion_ids, encoded.completion_trained) if f]) == (
        "<think>\nAdd.\n</think>\n\n4.<|im_end|>")
    chatml, chatml_eos = family_tokenizer("chatml")
    with pytest.raises(ValueError, match=r"row 0 message 1: has 'reasoning_content', which this chat template does not "
                                         r"show, so it would not be trained"):
        TextRenderer(chatml, 256, 256, chatml_eos).row(example)


def test_templates_that_add_a_system_prompt_keep_it_in_the_prompt():
    """Qwen2.5 adds its default system prompt; Llama 3.2 a dated one (pinned by its `date_string` argument), with the
    tools in the first user message and a call as its own JSON: the prompt holds them, untrained."""
    qwen, qwen_eos = family_tokenizer("qwen2_5")
    (piece,) = ConversationRenderer(qwen, qwen_eos).render(PARALLEL, TOOLS, "row 0").pieces
    assert "You are Qwen, created by Alibaba Cloud." in qwen.decode(piece.prompt_ids)
    llama, llama_eos = family_tokenizer("llama3_2")
    one_call = [USER, {"role": "assistant", "content": "", "tool_calls": [call("2+3")]},
                {"role": "tool", "name": "calc", "content": "5"}, {"role": "assistant", "content": "It is 5."}]
    renderer = ConversationRenderer(llama, llama_eos, {"date_string": "01 Jan 2025"})
    (piece,) = renderer.render(one_call, TOOLS, "row 0").pieces
    prompt = llama.decode(piece.prompt_ids)
    assert "Today Date: 01 Jan 2025" in prompt and '"name": "calc"' in prompt.split("<|eot_id|>")[1]  # the user turn
    runs = trained_runs(llama, piece)
    assert runs == ['{"name": "calc", "parameters": {"expr": "2+3"}}<|eot_id|>', "It is 5.<|eot_id|>"]
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|>' in llama.decode(piece.completion_ids)
    assert llama.decode(piece.prompt_ids + piece.completion_ids) == template_text(llama, one_call, tools=TOOLS,
                                                                                  date_string="01 Jan 2025")
    with pytest.raises(Exception, match="only supports single tool-calls"):  # the template's own refusal
        renderer.render(PARALLEL, TOOLS, "row 0")


def test_template_arguments_reach_every_rendering_of_a_renderer():
    tokenizer, eos = family_tokenizer("qwen3")
    example = examples_from_dataset(datasets.Dataset.from_list([{"messages": PARALLEL, "tools": TOOLS}]), "d")[0]
    off = TextRenderer(tokenizer, 4096, 512, eos, {"enable_thinking": False})
    on = TextRenderer(tokenizer, 4096, 512, eos)
    empty = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tokenizer.decode(off.prompt(example).ids).endswith(empty)  # a row's prompt
    assert tokenizer.decode(off.row(example).prompt_ids).endswith(empty)  # a conversation row
    assert not tokenizer.decode(on.row(example).prompt_ids).endswith(empty)
    later = off.prompt(example, history=tuple(PARALLEL[1:4])).ids  # a later piece's context (another renderer's too)
    assert tokenizer.decode(later) == template_text(tokenizer, PARALLEL[:4], tools=TOOLS, add_generation_prompt=True,
                                                    enable_thinking=False)
    assert off.offering(TOOLS).template_kwargs == {"enable_thinking": False}
    # A later piece's context keeps as many tokens beyond the prompt budget as its history adds, as the student's does.
    small = TextRenderer(tokenizer, 64, 512, eos, {"enable_thinking": False})
    cut = small.prompt(example, history=tuple(PARALLEL[1:4]))
    grown = len(later) - len(off.prompt(example).ids)
    assert cut.truncated and len(cut.ids) == 64 + grown and cut.ids == later[-len(cut.ids):]
    assert len(small.prompt(example).ids) == 64


def _loss_and_gradient(student, teacher, completions, pad_id):
    batch = collate(completions, "dataset", pad_id)
    student.zero_grad()
    loss = student_loss(student, student.config.vocab_size, batch, teacher.score(batch, 1.0),
                        DivergenceObjective.constant(0.5, 1.0, 8), StepContext("dataset"))
    loss.loss_sum.backward()
    return loss, torch.cat([p.grad.flatten() for p in student.parameters()])


@pytest.mark.parametrize("family", ["chatml", "qwen2_5", "llama3"])
def test_the_per_turn_path_equals_the_single_sequence_path_on_a_prefix_preserving_template(family):
    """The same conversation as one sequence and as a piece per turn (what a template that re-renders its history
    gives): every piece's prompt is the single sequence's ids up to its turn, the same tokens are trained, and the
    loss sum, its token count (the per-token normalizer) and the gradient agree. allclose, not torch.equal: the two
    are the same sums over other batch shapes (one long row against three padded ones), which fp32 rounds
    differently; the token count is exact."""
    tokenizer, eos = family_tokenizer(family)
    conversation = [*PARALLEL[:4], {"role": "assistant", "content": "", "tool_calls": [call("5+9")]},
                    {"role": "tool", "name": "calc", "content": "14"}, {"role": "assistant", "content": "14 in all."}]
    renderer = ConversationRenderer(tokenizer, eos)
    (whole,) = renderer.render(conversation, TOOLS, "row 0").pieces
    pieces = renderer.render(conversation, TOOLS, "row 0", per_turn=True).pieces
    assert len(pieces) == 3 and [p.turns for p in pieces] == [1, 1, 1]
    sequence = whole.prompt_ids + whole.completion_ids
    trained_at = [len(whole.prompt_ids) + k for k, flag in enumerate(whole.trained) if flag]
    pieces_at = []
    for piece in pieces:
        assert sequence[: len(piece.prompt_ids) + len(piece.completion_ids)] == piece.prompt_ids + piece.completion_ids
        pieces_at += [len(piece.prompt_ids) + k for k, flag in enumerate(piece.trained) if flag]
    assert pieces_at == trained_at  # each trained token once, at its place in the conversation

    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=eos[0])
    teacher = LocalTeacher(tiny_lm(len(tokenizer), layers=2, seed=3, eos_token_id=eos[0]), len(tokenizer), eos,
                           tokenizer.pad_token_id, torch.device("cpu"))
    one = [Completion(whole.prompt_ids, whole.completion_ids, "dataset", trained_mask=whole.trained)]
    split = [Completion(p.prompt_ids, p.completion_ids, "dataset", trained_mask=p.trained, piece=k)
             for k, p in enumerate(pieces)]
    single_loss, single_grad = _loss_and_gradient(student, teacher, one, tokenizer.pad_token_id)
    split_loss, split_grad = _loss_and_gradient(student, teacher, split, tokenizer.pad_token_id)
    assert float(single_loss.num_tokens) == float(split_loss.num_tokens) == len(trained_at)
    torch.testing.assert_close(split_loss.loss_sum, single_loss.loss_sum, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(split_grad, single_grad, rtol=1e-4, atol=1e-6)
    assert float(single_grad.abs().max()) > 0
