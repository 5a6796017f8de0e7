"""Errors that cross module boundaries (kept free of heavy imports so the CLI can catch them cheaply)."""


class StepFailure(RuntimeError):
    """An optimizer step could not be completed for a reason outside distill (a teacher server, a user's
    reward function): the run checkpoints the state from before the step, then stops with this error.
    `resume_hint` says when resuming makes sense."""

    resume_hint = "once the cause is fixed"


class TeacherServerError(StepFailure):
    """The teacher server could not give a usable answer after every retry (or refused the request).
    `status`: the HTTP status of a refusal (a 4xx answer), None when the server gave no usable answer."""

    resume_hint = "when the server is back"
    status: int | None = None


class RewardFunctionError(StepFailure):
    """A reward function raised, or returned a wrong number of values or a non-finite one; the message names
    the function and the dataset row."""

    resume_hint = "once the reward function is fixed"


class ImageChangedError(StepFailure):
    """An image that decoded at the start of the run no longer decodes, or decodes to another size: its file changed
    during the run. The message names the dataset row and the image."""

    resume_hint = "once the image is restored"


class EnvironmentLost(StepFailure):
    """The tool worker that held a conversation's environment instance ended mid-conversation (a call past
    `tool_timeout`, `os._exit`, a crash): its state cannot be rebuilt, so the step stops; the message names the
    environment, what it was doing and the dataset row."""

    resume_hint = "once the environment's work is bounded (or tool_timeout raised)"
