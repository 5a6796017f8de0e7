"""Datasets of prompts (and optional completions): loading and validation, and the records of a row in a model's ids.

A row holds either `prompt` (a string, or a list of chat messages) or `messages` (a chat: the turns before its
first assistant turn are the prompt, the rest its completion). Optional columns: `completion` (a string, or a list
of messages) gives off-policy completions; a completion of one assistant message is its text (one with a
`reasoning_content` is a one-turn conversation: the chat template shows the reasoning its own way), and one of several
turns (assistant turns that call tools, `tool` turns answering them, later user turns) is a conversation, trained
on every assistant turn (`distill.conversations`); `tools` (JSON schemas, a list or its JSON text) are the tools
the conversation's assistant may call; `privileged_context` (text: a demonstration, a fact,
a hint; or content blocks showing images too, from their own paths or a `privileged_images` column) is context a
self-teacher sees and the student does not; `answer` (text or a number) is a short
checkable answer (the evaluation reports how often a greedy answer contains it; reward functions check
it); `feedback` (text) is environment feedback an SDPO self-teacher may be re-prompted with; `teacher_id`
routes the row to one of several teachers; `images` (a list) are the images its chat messages show through
`{"type": "image"}` content blocks (`distill.images`: paths, bytes or PIL images, decoded once to check them,
then again only when a micro-batch needs them). Every problem is reported when the run is set up, before any model is loaded, with the
column or row at fault. Loading files and splits is `distill.data_files`; rendering a row in a model's ids
(`EncodedExample`, `RowPrompt`) is `distill.rendering`. The step sampler (which prompts each optimizer step trains
on) is here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from distill.conversations.layout import Layout
from distill.conversations.tool_calls import check_tools
from distill.conversations.turn_checks import check_turns, empty_turn_message, says_something
from distill.data_files import check_columns
from distill.images import ImageRef, context_images, is_block_list, row_images
from distill.models.inputs import RowExtras
from distill.seeds import epoch_order_seed

ROLES = ("system", "user", "assistant", "tool")
IMAGE_COLUMNS = ("images", "privileged_images")


@dataclass(frozen=True)
class Example:
    """One training or evaluation example, independent of any tokenizer."""

    index: int
    prompt: str | list[dict[str, str]]  # plain text, or chat messages ending before the answer
    completion: str | None  # the dataset's own answer, when it has one
    teacher_id: str | None = None  # which teacher scores it, when several are configured
    # What a self-teacher is shown and the student is not: text, or content blocks whose images are privileged_images.
    privileged_context: str | list[dict[str, str]] | None = None
    answer: str | None = None  # a short checkable answer, when the task has one
    feedback: str | None = None  # environment feedback on an earlier attempt (SDPO's reprompt), when given
    turns: list[dict[str, Any]] | None = None  # a conversation's turns from its first assistant turn on, when not one answer
    tools: list[dict[str, Any]] | None = None  # the tools' JSON schemas, when the row offers tools
    images: tuple[ImageRef, ...] = ()  # the images the prompt's messages show, in order (not decoded)
    privileged_images: tuple[ImageRef, ...] = ()  # the images the privileged context shows, in order (not decoded)
    # The dataset row as loaded, every column (user reward functions read their own columns).
    row: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_completion(self) -> bool:
        """The row brings its own completion: an answer's text or a conversation's turns."""
        return self.completion is not None or self.turns is not None

    @property
    def is_conversation(self) -> bool:
        """A conversation (several turns, or tools) rather than a prompt and one answer."""
        return self.turns is not None or self.tools is not None


@dataclass
class EncodedExample:
    """An example in the student's tokens: the prompt (end kept), and the completion when it has one."""

    prompt_ids: list[int]
    prompt_truncated: bool
    completion_ids: list[int] | None
    extras: RowExtras = field(default_factory=dict)  # the model kind's inputs beyond the ids (`distill.models.kinds`)
    completion_trained: tuple[bool, ...] | None = None  # a conversation's trained mask; None: every token trained
    completion_cut: bool = False  # a conversation cut at max_new_tokens (an answer's cut shows as a missing EOS)
    completion_layout: Layout | None = None  # a conversation's model and environment segments
    # A conversation whose template re-renders its history: its later pieces, each a later assistant turn (or turns)
    # with the context it was generated in as its prompt (`distill.rendering.conversation`); this record is the first.
    later: tuple["EncodedExample", ...] = ()


class RowPrompt(NamedTuple):
    """Another prompt of a row (a self-teacher's) in a model's ids."""

    ids: list[int]
    truncated: bool  # cut to its budget, keeping its end
    extras: RowExtras | None = None  # its own inputs beyond the ids when it shows other images than the row's prompt


def examples_from_dataset(dataset, field: str, image_root: Path | None = None) -> list[Example]:
    """Validate every row and turn it into an Example; raises ValueError naming the column or row.

    `image_root`: where relative image paths start (the dataset file's folder). Each image is decoded once, to check
    it, and dropped (`ImageRef.check`): an image column of `datasets.Image` is read with `decode=False`."""
    check_columns(dataset.column_names, field)
    if len(dataset) == 0:
        raise ValueError(f"{field}: the dataset is empty")
    dataset = _undecoded_images(dataset)
    examples = []
    for index, row in enumerate(dataset):
        example = _example(index, row, field, image_root)
        for image in example.images + example.privileged_images:
            image.check()  # its errors name the row and the image
        examples.append(example)
    return examples


def _undecoded_images(dataset):
    """The dataset with its `datasets.Image` features (the `images` and `privileged_images` columns, or one nested
    in them) not decoded."""
    import datasets

    features = dataset.features if hasattr(dataset, "features") and dataset.features else {}
    for column in IMAGE_COLUMNS:
        feature = features.get(column)
        inner = getattr(feature, "feature", None) if feature is not None else None
        if isinstance(feature, list) and feature:  # datasets 3+: a list feature is `[Image()]`
            inner = feature[0]
        if isinstance(inner, datasets.Image) and inner.decode:
            dataset = dataset.cast_column(column, datasets.Sequence(datasets.Image(decode=False)))
        elif isinstance(feature, datasets.Image) and feature.decode:
            dataset = dataset.cast_column(column, datasets.Image(decode=False))
    return dataset


def _without_nulls(value: Any, keep: tuple[str, ...] = ()) -> Any:
    """`value` with the null entries of its mappings dropped, at any depth (but the keys in `keep` of the top one).

    A `datasets.Dataset` stores a column of mappings as one struct type: every message gets every key any message has
    (`tool_calls: None` on a user turn), every tool call's arguments every argument any call has. Their nulls are
    the column's, not the row's. (Arguments given as JSON text keep exactly their keys.)"""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None or k in keep}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _messages(value: Any) -> Any:
    return [_without_nulls(m, keep=("content",)) if isinstance(m, dict) else m for m in value] if isinstance(value, list) else value


def _example(index: int, row: dict[str, Any], field: str, image_root: Path | None = None) -> Example:
    where = f"{field} row {index}"
    row = {**row, **{name: _messages(row[name]) for name in ("prompt", "messages", "completion") if name in row}}
    column = _image_column(row.get("images"))
    images: tuple[ImageRef, ...] = ()
    for name in ("prompt", "messages"):
        if isinstance(row.get(name), list):
            row[name], images = row_images(row[name], column, image_root, where)
            break
    else:
        if column:
            raise ValueError(f"{where}: has images but a text prompt; give the prompt as chat messages with an "
                             "{'type': 'image'} content block where each image goes")
    if isinstance(row.get("completion"), list):
        row["completion"], shown = row_images(row["completion"], None, image_root, f"{where} completion")
        assert not shown  # an image in an assistant turn was refused
    if row.get("tools") is not None and not isinstance(row["tools"], str):
        row["tools"] = _without_nulls(row["tools"])
    completion = row.get("completion")
    turns = None
    if "prompt" in row and row["prompt"] is not None:
        prompt = row["prompt"]
        if isinstance(prompt, list):
            _check_messages(prompt, where, "prompt")
        elif not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}: 'prompt' must be non-empty text or a list of chat messages")
    else:
        messages = row.get("messages")
        if messages is None:
            raise ValueError(f"{where}: has no 'prompt' and no 'messages' (missing or null); every row needs one of them")
        _check_messages(messages, where, "messages")
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        if first == 0:
            what = "holds only an assistant turn" if len(messages) == 1 else "starts with an assistant turn"
            raise ValueError(f"{where}: 'messages' {what}; a prompt is needed before it")
        prompt, rest = messages[:first], messages[first:]
        if completion is None and rest:
            completion = rest
        elif rest and (len(rest) > 1 or rest[0].get("tool_calls")):
            raise ValueError(f"{where}: has both a 'completion' and a conversation after the first assistant turn in "
                             "'messages'; give one of them")
        # else a 'completion' column wins over the one assistant answer that ends 'messages' (as it always has)
    if completion is not None:
        if isinstance(completion, list):
            _check_messages(completion, where, "completion")
            if completion[0]["role"] != "assistant":
                raise ValueError(f"{where}: a completion of messages starts with an assistant turn, got "
                                 f"{completion[0]['role']!r}")
            if len(completion) == 1 and not completion[0].get("tool_calls") and not completion[0].get("reasoning_content"):
                if not says_something(completion[0]["content"]):  # message indices count the prompt's first
                    at = f"message {len(prompt)}" if isinstance(prompt, list) else "'completion' message 0"
                    raise ValueError(empty_turn_message(f"{where} {at}"))
                completion = completion[0]["content"]  # one answer (with reasoning_content: a turn the template renders)
            else:
                turns, completion = completion, None
        elif not isinstance(completion, str):
            raise ValueError(f"{where}: 'completion' must be text or a list of messages")
        elif not completion.strip():
            raise ValueError(empty_turn_message(f"{where} 'completion'"))
    tools = None if row.get("tools") is None else check_tools(row["tools"], where)
    if isinstance(prompt, str) and (turns is not None or tools is not None):
        raise ValueError(f"{where}: a conversation (tools, or a completion of several turns) needs a 'prompt' of chat "
                         "messages, got text")
    prompt_messages = prompt if isinstance(prompt, list) else []
    check_turns([*prompt_messages, *(turns or [])], tools, where, trained_from=len(prompt_messages))
    teacher_id = row.get("teacher_id")
    if teacher_id is not None and not isinstance(teacher_id, (str, int)):
        raise ValueError(f"{where}: 'teacher_id' must be text (the id of a configured teacher)")
    context, privileged_images = _privileged_context(row, where, image_root)
    if privileged_images and not isinstance(prompt, list):
        raise ValueError(f"{where}: its 'privileged_context' shows images but its prompt is text; give the prompt as "
                         "chat messages (the self-teacher's last user turn shows the context's images)")
    answer = row.get("answer")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip()):
        raise ValueError(f"{where}: 'answer' must be non-empty text or a number, got {answer!r}")
    feedback = row.get("feedback")
    if feedback is not None and not isinstance(feedback, str):
        raise ValueError(f"{where}: 'feedback' must be text, got {type(feedback).__name__}")
    if (images or privileged_images) and (turns is not None or tools is not None):
        raise ValueError(f"{where}: images in a conversation with tools or several turns are not supported yet; give "
                         "images with a prompt and one answer")
    return Example(index, prompt, completion, None if teacher_id is None else str(teacher_id), context,
                   None if answer is None else str(answer), feedback, turns, tools, images, privileged_images, dict(row))


def _image_column(column: Any) -> list | tuple | None:
    if column is not None and not isinstance(column, (list, tuple)):
        return [column]  # one image (a datasets.Image column)
    return column


def _privileged_context(row: dict[str, Any], where: str, image_root: Path | None
                        ) -> tuple[str | list[dict[str, str]] | None, tuple[ImageRef, ...]]:
    """The row's privileged context (text, or content blocks with their images bare) and the images it shows."""
    context, column = row.get("privileged_context"), _image_column(row.get("privileged_images"))
    if context is None:
        if column:
            raise ValueError(f"{where}: has 'privileged_images' but no 'privileged_context' to show them; give the "
                             "context as content blocks with an {'type': 'image'} block where each image goes")
        return None, ()
    if not isinstance(context, (str, list)):
        raise ValueError(f"{where}: 'privileged_context' must be text or a list of content blocks, got "
                         f"{type(context).__name__}")
    if isinstance(context, str) and column:
        raise ValueError(f"{where}: has 'privileged_images' but its 'privileged_context' is text; give the context as "
                         "content blocks with an {'type': 'image'} block where each image goes")
    return context_images(_without_nulls(context), column, image_root, f"{where} privileged_context")


def _check_messages(messages: Any, where: str, column: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: '{column}' must be a non-empty list of {{'role', 'content'}} messages")
    for turn in messages:
        calls = isinstance(turn, dict) and turn.get("role") == "assistant" and turn.get("tool_calls")
        content = turn.get("content") if isinstance(turn, dict) else None
        content_ok = isinstance(content, str) or (calls and content is None) or is_block_list(content)
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or not content_ok:
            raise ValueError(f"{where}: '{column}' has a malformed message {turn!r}; each needs string 'role' and 'content' "
                             "(an assistant turn with 'tool_calls' may have no content; a prompt's content may be a list "
                             "of text and image blocks)")
        if turn["role"] not in ROLES:
            raise ValueError(f"{where}: '{column}' has an unknown role {turn['role']!r} (expected one of {ROLES})")


class StepSampler:
    """Which dataset rows each optimizer step trains on: epochs of seeded permutations, cut into every
    process's micro-batches. Depends only on (seed, step), so a resumed run sees the same rows.

    With `generations` G > 1 (GRPO-style groups) a step holds global_batch / G distinct prompts, each
    repeated G times in a row of the step's global order: (process 0: micro-batch 0, 1, ...; process 1: ...),
    so a group may span micro-batches and processes. Global row r belongs to group r // G."""

    def __init__(self, num_examples: int, batch_size: int, accumulation: int, num_processes: int, process_index: int,
                 seed: int, generations: int = 1):
        self.num_examples, self.batch_size, self.accumulation = num_examples, batch_size, accumulation
        self.num_processes, self.process_index, self.seed = num_processes, process_index, seed
        self.generations = generations
        if self.global_batch % generations:
            raise ValueError(
                f"per_device_train_batch_size ({batch_size}) x gradient_accumulation_steps ({accumulation}) x processes "
                f"({num_processes}) = {self.global_batch} completions per step is not a multiple of num_generations "
                f"({generations}); every prompt of a step needs its whole group")

    @property
    def global_batch(self) -> int:
        """Completions (rows) per optimizer step, over all processes."""
        return self.batch_size * self.accumulation * self.num_processes

    @property
    def prompts_per_step(self) -> int:
        """Distinct prompts per optimizer step (global_batch / generations)."""
        return self.global_batch // self.generations

    @property
    def first_row(self) -> int:
        """The global index (in the step's order) of this process's first row."""
        return self.process_index * self.batch_size * self.accumulation

    def prompts_for_step(self, step: int) -> list[int]:
        """Indices of the step's rows, all processes' shares in order (each prompt `generations` times)."""
        n, size = self.num_examples, self.prompts_per_step
        indices: list[int] = []
        cached_epoch: int | None = None
        order: list[int] = []
        for position in range(step * size, (step + 1) * size):
            epoch = position // n
            if epoch != cached_epoch:
                order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch_order_seed(self.seed, epoch))).tolist()
                cached_epoch = epoch
            indices.extend([order[position % n]] * self.generations)
        return indices

    def micro_batch_indices(self, step: int) -> list[list[int]]:
        """This process's micro-batches of prompt indices for optimizer step `step`."""
        bs, share_size = self.batch_size, self.batch_size * self.accumulation
        share = self.prompts_for_step(step)[self.first_row : self.first_row + share_size]
        return [share[i * bs : (i + 1) * bs] for i in range(self.accumulation)]
