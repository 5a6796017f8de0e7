"""Datasets of prompts (and optional completions): loading, validation, chat rendering, tokenization.

A row holds either `prompt` (a string, or a list of chat messages) or `messages` (a chat whose last
assistant turn, if any, is the completion). Optional columns: `completion` (a string, or a list holding
one assistant message) gives off-policy completions; `privileged_context` (text: a demonstration, a fact,
a hint) is context a self-teacher sees and the student does not; `answer` (text or a number) is a short
checkable answer (the evaluation reports how often a greedy answer contains it; reward functions check
it); `feedback` (text) is environment feedback an SDPO self-teacher may be re-prompted with; `teacher_id`
routes the row to one of several teachers. Every problem is reported when the run is set up, before any model is loaded, with the
column or row at fault. Loading files and splits is `distill.data_files`. The step sampler (which prompts
each optimizer step trains on) is here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from distill.data_files import check_columns
from distill.models.inputs import RowExtras

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Example:
    """One training or evaluation example, independent of any tokenizer."""

    index: int
    prompt: str | list[dict[str, str]]  # plain text, or chat messages ending before the answer
    completion: str | None  # the dataset's own answer, when it has one
    teacher_id: str | None = None  # which teacher scores it, when several are configured
    privileged_context: str | None = None  # what a self-teacher is shown and the student is not
    answer: str | None = None  # a short checkable answer, when the task has one
    feedback: str | None = None  # environment feedback on an earlier attempt (SDPO's reprompt), when given
    # The dataset row as loaded, every column (user reward functions read their own columns).
    row: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class EncodedExample:
    """An example in the student's tokens: the prompt (end kept), and the completion when it has one."""

    prompt_ids: list[int]
    prompt_truncated: bool
    completion_ids: list[int] | None
    extras: RowExtras = field(default_factory=dict)  # the model kind's inputs beyond the ids (`distill.models.kinds`)


def examples_from_dataset(dataset, field: str) -> list[Example]:
    """Validate every row and turn it into an Example; raises ValueError naming the column or row."""
    check_columns(dataset.column_names, field)
    if len(dataset) == 0:
        raise ValueError(f"{field}: the dataset is empty")
    examples = []
    for index, row in enumerate(dataset):
        examples.append(_example(index, row, field))
    return examples


def _example(index: int, row: dict[str, Any], field: str) -> Example:
    where = f"{field} row {index}"
    completion = row.get("completion")
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
        if messages[-1]["role"] == "assistant":
            if completion is None:
                completion = messages[-1]["content"]
            messages = messages[:-1]
        if not messages:
            raise ValueError(f"{where}: 'messages' holds only an assistant turn; a prompt is needed before it")
        prompt = messages
    if completion is not None:
        if isinstance(completion, list):
            _check_messages(completion, where, "completion")
            if len(completion) != 1 or completion[0]["role"] != "assistant":
                raise ValueError(f"{where}: 'completion' as messages must be one assistant message")
            completion = completion[0]["content"]
        elif not isinstance(completion, str):
            raise ValueError(f"{where}: 'completion' must be text or one assistant message")
    teacher_id = row.get("teacher_id")
    if teacher_id is not None and not isinstance(teacher_id, (str, int)):
        raise ValueError(f"{where}: 'teacher_id' must be text (the id of a configured teacher)")
    context = row.get("privileged_context")
    if context is not None and not isinstance(context, str):
        raise ValueError(f"{where}: 'privileged_context' must be text, got {type(context).__name__}")
    answer = row.get("answer")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip()):
        raise ValueError(f"{where}: 'answer' must be non-empty text or a number, got {answer!r}")
    feedback = row.get("feedback")
    if feedback is not None and not isinstance(feedback, str):
        raise ValueError(f"{where}: 'feedback' must be text, got {type(feedback).__name__}")
    return Example(index, prompt, completion, None if teacher_id is None else str(teacher_id), context,
                   None if answer is None else str(answer), feedback, dict(row))


def _check_messages(messages: Any, where: str, column: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: '{column}' must be a non-empty list of {{'role', 'content'}} messages")
    for turn in messages:
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or not isinstance(turn.get("content"), str):
            raise ValueError(f"{where}: '{column}' has a malformed message {turn!r}; each needs string 'role' and 'content'")
        if turn["role"] not in ROLES:
            raise ValueError(f"{where}: '{column}' has an unknown role {turn['role']!r} (expected one of {ROLES})")


class PromptEncoder:
    """Renders and tokenizes prompts and completions for one tokenizer.

    Prompts go through the tokenizer's chat template (with the generation prompt) when they are messages;
    text prompts are tokenized as they are. Prompts longer than `max_prompt_length` keep their end, where
    the question and the assistant header are. A dataset completion is its text followed by EOS (what
    ChatML-style templates render for an assistant turn), ending at its first EOS, cut to `max_new_tokens`.
    """

    def __init__(self, tokenizer, max_prompt_length: int, max_new_tokens: int, eos_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = list(eos_token_ids)

    def render(self, prompt: str | list[dict[str, str]]) -> str:
        if isinstance(prompt, str):
            return prompt
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template, so chat-message prompts cannot be rendered; give text prompts")
        return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    def prompt_ids(self, prompt: str | list[dict[str, str]]) -> tuple[list[int], bool]:
        """(token ids, whether the prompt was truncated)."""
        text = self.render(prompt)
        # Chat templates already hold the special tokens (BOS etc.); plain text gets the tokenizer's own.
        ids = self.tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
        if len(ids) > self.max_prompt_length:
            return ids[-self.max_prompt_length :], True
        return ids, False

    def extras(self, example: "Example") -> RowExtras:
        """The row's model inputs beyond its token ids: none for a text model (a model kind's encoder adds them)."""
        return {}

    def completion_ids(self, completion: str) -> list[int]:
        """Token ids of a dataset completion, ending at its first EOS (an EOS string inside the text counts)."""
        ids = self.tokenizer(completion, add_special_tokens=False)["input_ids"] + [self.eos_token_ids[0]]
        first_eos = next(i for i, token in enumerate(ids) if token in self.eos_token_ids)
        return ids[: first_eos + 1][: self.max_new_tokens]


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
        indices, cached_epoch, order = [], None, None
        for position in range(step * size, (step + 1) * size):
            epoch = position // n
            if epoch != cached_epoch:
                order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + 7919 * epoch)).tolist()
                cached_epoch = epoch
            indices.extend([order[position % n]] * self.generations)
        return indices

    def micro_batch_indices(self, step: int) -> list[list[int]]:
        """This process's micro-batches of prompt indices for optimizer step `step`."""
        bs, share_size = self.batch_size, self.batch_size * self.accumulation
        share = self.prompts_for_step(step)[self.first_row : self.first_row + share_size]
        return [share[i * bs : (i + 1) * bs] for i in range(self.accumulation)]
