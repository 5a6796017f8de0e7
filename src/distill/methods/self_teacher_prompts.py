"""Teacher prompts for a self-teacher: the student's prompt with privileged context the student does not see.

A template with `{prompt}` and `{privileged_context}` (and no other field) says how the two combine. A text
prompt is the template filled in; a chat prompt, which must end with a user turn (the question), keeps every
turn and has that turn's content replaced by the filled-in template (system prompts and earlier turns stay
as they are; a turn showing images keeps them, the filled-in text after them). The teacher prompt
is tokenized like any prompt and has its own length budget, truncated keeping its end (where the question
and the assistant header are).
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

from distill.conversations.layout import with_observation

if TYPE_CHECKING:  # annotations only: the templates are read by the config, which imports no torch
    from distill.data import Example, PromptEncoder

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


def fill(template: str, prompt: str | list[dict[str, str]], context: str) -> str | list[dict[str, str]]:
    """The teacher prompt: `template` filled with the prompt's text (a chat's last user turn) and `context`."""
    return fill_fields(template, prompt, privileged_context=context)


def fill_fields(template: str, prompt: str | list[dict[str, str]], **values: str) -> str | list[dict[str, str]]:
    """`template` filled with {prompt} (the text, or a chat's last user turn, which the result replaces) and
    `values`."""
    if isinstance(prompt, str):
        return template.format(prompt=prompt, **values)
    problem = chat_prompt_problem(prompt)
    if problem is not None:
        raise ValueError(problem)
    turns = [dict(turn) for turn in prompt]
    content = prompt[-1]["content"]
    if isinstance(content, list):  # content blocks with images: they stay, the filled text follows them
        text = "".join(block["text"] for block in content if block.get("type") == "text")
        turns[-1]["content"] = [block for block in content if block.get("type") != "text"] + [
            {"type": "text", "text": template.format(prompt=text, **values)}]
    else:
        turns[-1]["content"] = template.format(prompt=content, **values)
    return turns


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

    def __init__(self, encoder: PromptEncoder, template: str):
        check_template(template, "teacher_prompt_template")
        self.encoder, self.template = encoder, template

    def ids(self, example: Example, context: str | None = None, observation: str | None = None) -> tuple[list[int], bool]:
        """(token ids, whether they were truncated) of `example`'s teacher prompt; `context` replaces the
        example's own privileged context when given; `observation`: an environment's text after the prompt, as the
        student saw it. The row's tools are shown as in the student's prompt."""
        context = context if context is not None else example.privileged_context
        prompt = example.prompt if context is None else for_row(example, lambda: fill(self.template, example.prompt, context))
        return self.encoder.row_prompt_ids(example, with_observation(prompt, observation))
