"""sdpo's self-teacher prompts: the row's prompt re-written around a successful sibling rollout (a
demonstration) and/or the row's feedback (`reprompt_template`, `solution_template`, `feedback_template`).
Torch-free: the config's defaults come from here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.methods.self_teacher_prompts import Value, check_template, fill_fields, for_row, format_blocks, shown_images

if TYPE_CHECKING:  # annotations only
    from distill.data import Example, RowPrompt
    from distill.rendering import Renderer

# SDPO (arXiv 2601.20802): the teacher is re-prompted with a successful sibling rollout and/or feedback.
DEFAULT_REPROMPT_TEMPLATE = "{prompt}{solution}{feedback}\n\nCorrectly solve the original question.\n"
DEFAULT_SOLUTION_TEMPLATE = "\nCorrect solution:\n\n{demonstration}\n\n"
DEFAULT_FEEDBACK_TEMPLATE = "\nThe following is feedback from your unsuccessful earlier attempt:\n\n{feedback}\n\n"
REPROMPT_FIELDS = ("prompt", "solution", "feedback")


def check_reprompt_templates(template: str, solution_template: str, feedback_template: str) -> None:
    """Each of SDPO's templates has its fields and no other (a ValueError naming the field otherwise)."""
    check_template(template, "reprompt_template", REPROMPT_FIELDS)
    check_template(solution_template, "solution_template", ("demonstration",))
    check_template(feedback_template, "feedback_template", ("feedback",))


class Reprompts:
    """Token ids of SDPO's teacher prompts: `reprompt_template` filled with the row's prompt, the solution
    block (`solution_template` around a demonstration, or empty) and the feedback block (`feedback_template`
    around the feedback, or empty); truncated to the renderer's budget keeping the end."""

    def __init__(self, renderer: Renderer, template: str, solution_template: str, feedback_template: str):
        check_reprompt_templates(template, solution_template, feedback_template)
        self.renderer, self.template = renderer, template
        self.solution_template, self.feedback_template = solution_template, feedback_template

    def text(self, example: Example, demonstration: str | None, feedback: Value | None) -> str | list[dict]:
        """The reprompt; `feedback` may be content blocks (a privileged context showing images), spliced in."""
        solution = "" if demonstration is None else self.solution_template.format(demonstration=demonstration)
        shown = "" if feedback is None else format_blocks(self.feedback_template, feedback=feedback)
        return for_row(example, lambda: fill_fields(self.template, example.prompt, solution=solution, feedback=shown))

    def ids(self, example: Example, demonstration: str | None, feedback: Value | None,
            observation: str | None = None, history: tuple[dict, ...] = ()) -> RowPrompt:
        """The reprompt in the renderer's ids (truncated keeping its end; its own image inputs when it shows the
        privileged context's images); `observation`: an environment's text after the prompt, as the student saw
        it; `history`: a later piece's conversation after the prompt (`Layout.history`); the row's tools are shown
        as in the student's prompt."""
        return self.renderer.prompt(example, self.text(example, demonstration, feedback),
                                    images=shown_images(example, feedback), observation=observation, history=history)
