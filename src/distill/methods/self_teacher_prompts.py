"""Teacher prompts for a self-teacher: the student's prompt with privileged context the student does not see.

A template with `{prompt}` and `{privileged_context}` (and no other field) says how the two combine. A text
prompt is the template filled in; a chat prompt, which must end with a user turn (the question), keeps every
turn and has that turn's content replaced by the filled-in template (system prompts and earlier turns stay
as they are; a turn showing images keeps them, the filled-in text after them). A privileged context of content
blocks (text and images) is spliced into the filled-in turn where its placeholder is, so its images come after the
prompt's, in order: the teacher prompt shows the row's images, then the context's. The teacher prompt
is tokenized like any prompt and has its own length budget, truncated keeping its end (where the question
and the assistant header are).
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the templates are read by the config, which imports no torch
    from distill.data import Example, RowPrompt
    from distill.images import ImageRef
    from distill.rendering import Renderer

# SDFT (arXiv 2601.19897): the demonstration is shown as an example answer, and the model is asked for its own.
DEFAULT_TEACHER_PROMPT_TEMPLATE = ("{prompt}\n\nThis is an example for a response to the question:\n{privileged_context}"
                                   "\n\nNow answer with a response of your own.")
TEMPLATE_FIELDS = ("prompt", "privileged_context")


def check_template(template: str, name: str, fields: tuple[str, ...] = TEMPLATE_FIELDS) -> None:
    """Every one of `fields` appears, nothing else does, and no field has a format spec or conversion
    (`{prompt!r}`, `{prompt:>9}`): a ValueError naming `name` otherwise. Literal braces are written `{{ }}`."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"{name} is not a valid template ({error}); write literal braces as {{{{ and }}}}") from None
    seen = []
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in fields:
            raise ValueError(f"{name} has the placeholder {{{field}}}; only {', '.join('{' + f + '}' for f in fields)} "
                             "are filled in (write literal braces as {{ and }})")
        if spec or conversion:
            raise ValueError(f"{name}: write {{{field}}} plainly, without a format spec or conversion")
        seen.append(field)
    missing = [f for f in fields if f not in seen]
    if missing:
        raise ValueError(f"{name} must contain {', '.join('{' + f + '}' for f in missing)} (it has "
                         f"{', '.join('{' + f + '}' for f in seen) or 'no placeholder'})")


Value = str | list[dict[str, str]]  # text, or content blocks (a privileged context showing images)


def fill(template: str, prompt: Value | list[dict], context: Value) -> Value | list[dict]:
    """The teacher prompt: `template` filled with the prompt's text (a chat's last user turn) and `context`."""
    return fill_fields(template, prompt, privileged_context=context)


def fill_fields(template: str, prompt: str | list[dict], **values: Value) -> str | list[dict]:
    """`template` filled with {prompt} (the text, or a chat's last user turn, which the result replaces) and
    `values` (text, or content blocks spliced in where their placeholder is: a chat prompt's only)."""
    if isinstance(prompt, str):
        if any(not isinstance(value, str) for value in values.values()):
            raise ValueError("a privileged context with images needs a prompt of chat messages (its images are shown in "
                             "the last user turn), got a text prompt")
        return template.format(prompt=prompt, **values)
    problem = chat_prompt_problem(prompt)
    if problem is not None:
        raise ValueError(problem)
    turns = [dict(turn) for turn in prompt]
    content = prompt[-1]["content"]
    if isinstance(content, list):  # content blocks with images: they stay, the filled text follows them
        text = "".join(block["text"] for block in content if block.get("type") == "text")
        shown = [block for block in content if block.get("type") != "text"]
        turns[-1]["content"] = shown + as_blocks(format_blocks(template, prompt=text, **values))
    else:
        turns[-1]["content"] = format_blocks(template, prompt=content, **values)
    return turns


def format_blocks(template: str, **values: Value) -> Value:
    """`template.format(**values)` when every value is text; otherwise content blocks: the template's text with
    each block-valued placeholder's blocks spliced in where it stands (adjacent texts joined)."""
    if all(isinstance(value, str) for value in values.values()):
        return template.format(**values)
    blocks: list[dict[str, str]] = []

    def add_text(text: str) -> None:
        if not text:
            return
        if blocks and blocks[-1]["type"] == "text":
            blocks[-1] = {"type": "text", "text": blocks[-1]["text"] + text}
        else:
            blocks.append({"type": "text", "text": text})

    for literal, name, _, _ in string.Formatter().parse(template):
        add_text(literal)
        if name is None:
            continue
        value = values[name]
        for block in as_blocks(value):
            if block["type"] == "text":
                add_text(block["text"])
            else:
                blocks.append(dict(block))
    return blocks


def as_blocks(value: Value) -> list[dict[str, str]]:
    """Content blocks of a text or of blocks (a copy)."""
    return [{"type": "text", "text": value}] if isinstance(value, str) else [dict(block) for block in value]


def shows_something(value: Value) -> bool:
    """Whether a context shows anything: text that is not blank, or an image."""
    return any(block["type"] != "text" or block["text"].strip() for block in as_blocks(value))


def shown_images(example: Example, *values: Value | None) -> tuple[ImageRef, ...]:
    """The images a teacher prompt built from `example`'s prompt and `values` shows, in order: the prompt's, then the
    privileged context's when one of `values` is its blocks (a block-valued context is always the row's own)."""
    return example.images + (example.privileged_images if any(isinstance(v, list) for v in values) else ())


def chat_prompt_problem(prompt: list[dict[str, str]]) -> str | None:
    """Why a chat prompt cannot carry a teacher prompt, or None. Its last turn must be the user's question:
    turns after it (an assistant's answer, say) would come after the privileged context and the teacher would
    continue them instead of answering the question."""
    roles = [turn["role"] for turn in prompt]
    if "user" not in roles:
        return "a chat prompt without a user turn has no question to show the privileged context with"
    if roles[-1] != "user":
        return (f"the chat prompt ends with a {roles[-1]!r} turn after its last user turn (roles {roles}); a teacher prompt "
                "replaces the last user turn, so the prompt must end with it: drop the turns after it or move them "
                "into the completion")
    return None


def check_chat_prompts(examples: list[Example], field: str) -> None:
    """Every chat prompt of `examples` can carry a teacher prompt (`chat_prompt_problem`); the first that
    cannot is named. Called before any model loads."""
    for example in examples:
        problem = None if isinstance(example.prompt, str) else chat_prompt_problem(example.prompt)
        if problem is not None:
            raise ValueError(f"{field} row {example.index}: {problem}")


def for_row(example: Example, make):
    """make(), with a ValueError naming `example`'s row."""
    try:
        return make()
    except ValueError as error:
        raise ValueError(f"row {example.index}: {error}") from None


class TeacherPrompts:
    """Token ids of each example's teacher prompt, for a tokenizer, a template and a length budget.

    An example without privileged context gets its bare prompt (a self-teacher then is the model itself,
    which is what the evaluation compares the student with on general prompts)."""

    def __init__(self, renderer: Renderer, template: str):
        check_template(template, "teacher_prompt_template")
        self.renderer, self.template = renderer, template

    def ids(self, example: Example, context: Value | None = None, observation: str | None = None,
            history: tuple[dict, ...] = ()) -> RowPrompt:
        """`example`'s teacher prompt in the renderer's ids (and its own image inputs when it shows other images than
        the row's prompt: the privileged context's); `context` replaces the example's own privileged context when
        given; `observation`: an environment's text after the prompt, as the student saw it; `history`: a later
        piece's conversation after the prompt (`Layout.history`). The row's tools are shown as in the student's
        prompt."""
        context = context if context is not None else example.privileged_context
        prompt = example.prompt if context is None else for_row(example, lambda: fill(self.template, example.prompt, context))
        return self.renderer.prompt(example, prompt, images=shown_images(example, context), observation=observation,
                                    history=history)
