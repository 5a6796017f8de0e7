"""The tool-call loop: a rollout that is a conversation. The model writes a turn; its calls run; their results join
the conversation as the template renders them; the model writes the next turn; until a turn without a call,
`max_turns` turns, or the token budget.

Token-in, token-out: a trajectory's ids are the prompt's, then exactly the ids the engine sampled for each turn,
then the ids of what the template adds after the turn's end-of-turn token (the newline after `<|im_end|>`, the tool
turns, the next turn's header), and so on. Nothing already in the trajectory is re-tokenized. What follows a turn
comes from the model's renderer (`distill.rendering.environment`): with a template that preserves prefixes, the
template's tool turns appended to the sampled ids; with one that re-renders its history (Qwen3's), the next turn's
context is the conversation re-rendered, and where that context no longer starts with the ids so far the trajectory
goes on in a new piece (`Piece`), that context its prompt: each turn is trained in the context it was sampled in.

The sampled turns are trained (their mask is True), the environment's ids are attended only. With a `Guide`
(Guided-OPD, `distill.agents.guidance`) the teacher writes some turns in the student's place, continuing the same ids:
its turns are model turns of the layout, attended and not trained unless the guide trains them. A turn that reaches
the budget ends the trajectory (cut). Tool results that would not fit in the budget with room for another turn are
rolled back, as the reference library does: the trajectory ends with the turn that made the calls, its calls counted
as unanswered (`rolled_back_results`). The calls of the last turn `max_turns` allows are counted but not run (no
turn would read their results).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from distill.conversations.calls import Conversations, ToolCalls
from distill.conversations.layout import Layout, LayoutBuilder, with_observation
from distill.conversations.tool_calls import ParsedTurn
from distill.conversations.tools import FAILURES, malformed
from distill.data import Example
from distill.generation.sample import Sample

if TYPE_CHECKING:  # the renderer builds them; the loop only calls them
    from distill.rendering.base import Renderer
    from distill.rendering.environment import EnvironmentTurns, Next, TurnContexts

# generate(prompts, max_new_tokens, turn, rows) -> per prompt its next turn, a `Sample` (its ids, hit_max, log_probs;
# the rest unread); `rows`: the indices of the prompts' rows among all the loop's (for per-row seeds and extras)
Generate = Callable[[list[list[int]], int, int, list[int]], list[Sample]]


@dataclass(frozen=True)
class Guide:
    """What the loop needs to let the teacher write turns (Guided-OPD, `distill.agents.guidance`): its `generate` (the
    `Generate` contract), `writes(turn, rows)`: per row (the loop's row indices) whether the teacher writes turn `turn`,
    and `trained`: its turns trained (else attended only)."""

    generate: Generate
    writes: Callable[[int, list[int]], list[bool]]
    trained: bool = False


@dataclass
class Piece:
    """One sequence of a trajectory: its prompt (the row's, or for a later piece the context its first turn was
    sampled in, with `history`: the conversation's messages after the row's prompt), then its completion ids, their
    trained flags and sampling log-probs (0.0 at the environment's ids), and their layout."""

    prompt: list[int]
    history: tuple[dict[str, Any], ...] = ()
    ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    log_probs: list[float] | None = None
    segments: LayoutBuilder = field(default_factory=LayoutBuilder)


@dataclass
class Trajectory:
    """One row's rollout: its pieces (one, in a template that preserves prefixes), the completion so far of the last
    (`ids`, `trained`, `log_probs`), and what happened."""

    pieces: list[Piece] = field(default_factory=lambda: [Piece([])])
    hit_max: bool = False  # the budget cut it
    length: int = 0  # the conversation's tokens after the row's prompt, as its latest context renders them
    turns: int = 0
    guided_turns: int = 0  # written by the teacher (a `Guide`)
    calls: int = 0
    unanswered_calls: int = 0  # made in the last turn max_turns allows
    rolled_back_results: int = 0
    failures: Counter = field(default_factory=Counter)
    tool_seconds: float = 0.0
    drifted: bool = False  # re-tokenizing its text gives other ids (what a loop that re-tokenizes would have trained)
    observation: str | None = None  # what its environment's reset appended to the prompt
    reward: float | None = None  # what its environment's get_reward said at the end

    @classmethod
    def following(cls, prompt: list[int], record_log_probs: bool) -> "Trajectory":
        return cls([Piece(list(prompt), log_probs=[] if record_log_probs else None)])

    @property
    def ids(self) -> list[int]:
        return self.pieces[-1].ids

    @property
    def trained(self) -> list[bool]:
        return self.pieces[-1].trained

    @property
    def log_probs(self) -> list[float] | None:
        return self.pieces[-1].log_probs

    @property
    def context(self) -> list[int]:
        """What the next turn is sampled after: the last piece's prompt and ids."""
        return self.pieces[-1].prompt + self.pieces[-1].ids

    def extend(self, ids: list[int], trained: bool, log_probs: list[float] | None,
               messages: tuple[dict[str, Any], ...] = (), model_turn: bool | None = None) -> None:
        """Append a sampled turn (`trained`) or the environment's ids, which render `messages` (its tool turns);
        `model_turn`: the ids are a model's turn (None: when trained; a teacher's untrained turn is one too)."""
        piece = self.pieces[-1]
        piece.ids.extend(ids)
        piece.trained.extend([trained] * len(ids))
        piece.segments.add(len(ids), trained if model_turn is None else model_turn, messages)
        if piece.log_probs is not None:
            piece.log_probs.extend(log_probs if log_probs is not None else [0.0] * len(ids))
        self.length += len(ids)

    def follow(self, after: Next, messages: tuple[dict[str, Any], ...]) -> None:
        """Go on after a turn: the environment's ids appended (rendering `messages`), or a new piece."""
        if after.environment is not None:
            self.extend(after.environment, False, None, messages)
        else:
            assert after.prompt is not None
            self.pieces.append(Piece(after.prompt, after.history,
                                     log_probs=None if self.pieces[-1].log_probs is None else []))
        self.length = after.length

    @property
    def layout(self) -> Layout:
        return self._layout(self.pieces[-1])

    def _layout(self, piece: Piece) -> Layout:
        return piece.segments.layout(self.observation, self.reward, piece.history)

    def sample(self, prompt_ids: list[int], with_log_probs: bool = True) -> Sample:
        """The trajectory as the sample of a conversation that followed `prompt_ids` (its trained mask and layout;
        its log-probs unless `with_log_probs` is False), its later pieces in `Sample.later`."""
        def piece_sample(piece: Piece, prompt: list[int], hit_max: bool) -> Sample:
            return Sample(list(piece.ids), hit_max, piece.log_probs if with_log_probs else None, tuple(piece.trained),
                          prompt, self._layout(piece))

        last = len(self.pieces) - 1
        samples = [piece_sample(piece, prompt_ids if k == 0 else piece.prompt, self.hit_max and k == last)
                   for k, piece in enumerate(self.pieces)]
        return replace(samples[0], later=tuple(samples[1:]))


@dataclass(frozen=True)
class LoopSettings:
    max_turns: int
    budget: int  # completion tokens of a whole trajectory (max_new_tokens)
    record_log_probs: bool = False
    fail_on_drift: bool = False  # a conversation whose text re-tokenizes to other ids stops the run


@dataclass(frozen=True)
class ToolLoop:
    """What a rollout needs to sample conversations: the tools and environment and where their calls run (`calls`),
    the template's tool turns, how a turn is read; `renderer`: renders a row's prompt with its environment's
    observation."""

    calls: ToolCalls
    environment: EnvironmentTurns
    decode: Callable[[list[int]], str]
    settings: LoopSettings
    renderer: Renderer | None = None

    def run(self, generate: Generate, prompts: list[list[int]], examples: list[Example], eos_ids: list[int],
            guide: Guide | None = None, max_turns: int | None = None) -> tuple[list[Trajectory], list[list[int]]]:
        """(the trajectories, the prompts they followed: a row's own, or with its environment's observation);
        `guide`: the teacher writes some turns (Guided-OPD); `max_turns`: this rollout's bound instead of the settings'
        (a depth curriculum)."""
        settings = self.settings if max_turns is None else replace(self.settings, max_turns=max_turns)
        conversations = self.calls.open([example.row for example in examples], [example.index for example in examples])
        try:
            observations = conversations.observations
            if any(observation is not None for observation in observations):
                assert self.renderer is not None
                prompts = [prompt if observation is None else self.renderer.prompt(example, observation=observation).ids
                           for prompt, example, observation in zip(prompts, examples, observations)]
            contexts = [self._contexts(prompt, example, observation)
                        for prompt, example, observation in zip(prompts, examples, observations)]
            trajectories = run_tool_loop(generate, prompts, conversations, self.environment, self.decode, eos_ids,
                                         settings, contexts, guide)
            rewards = conversations.rewards() if self.calls.owns_reward else [None] * len(trajectories)
        finally:
            conversations.close()
        for trajectory, observation, reward in zip(trajectories, observations, rewards):
            trajectory.observation, trajectory.reward = observation, reward
        return trajectories, prompts

    def standing_in(self) -> ContextManager[None]:
        """While inside, no tool or environment runs: a stand-in answers (`ToolCalls.standing_in`)."""
        return self.calls.standing_in()

    def close(self) -> None:
        """End the tool workers (the run's end); they start again if the loop runs again."""
        self.calls.close()

    def _contexts(self, prompt: list[int], example: Example, observation: str | None) -> TurnContexts:
        """What follows each of a row's turns (`distill.rendering.environment`): the template's tool turns appended,
        or the conversation re-rendered from the row's prompt messages (with its observation) and tools, which takes
        the renderer."""
        if self.renderer is None:
            return self.environment.contexts(prompt, None, None, len(prompt))
        messages = with_observation(example.prompt, observation)
        return self.environment.contexts(prompt, list(messages) if isinstance(messages, list) else None,
                                         self.renderer.tools_of(example), self.renderer.max_prompt_length)


def run_tool_loop(generate: Generate, prompts: list[list[int]], conversations: Conversations,
                  environment: EnvironmentTurns, decode: Callable[[list[int]], str], eos_ids: list[int],
                  settings: LoopSettings, contexts: list[TurnContexts] | None = None,
                  guide: Guide | None = None) -> list[Trajectory]:
    """Every prompt's trajectory; `conversations`: where each row's calls run; `contexts`: what follows each row's
    turns (default: the template's tool turns appended, which needs a template that preserves prefixes); `guide`: the
    teacher writes the turns it chooses. Each round generates the next turn of every row still going, in one batch
    (the teacher's turns in another); the calls of a round run together."""
    if contexts is None:
        contexts = [environment.contexts(prompt, None, None, len(prompt)) for prompt in prompts]
    trajectories = [Trajectory.following(prompt, settings.record_log_probs) for prompt in prompts]
    going = list(range(len(prompts)))
    read_calls = environment.call_format.parse  # the template's call format: what the model was trained to write
    for turn in range(settings.max_turns):
        if not going:
            break
        room = {i: settings.budget - trajectories[i].length for i in going}
        guided = set() if guide is None else {i for i, teacher in zip(going, guide.writes(turn, list(going))) if teacher}
        outputs = _next_turns(generate, guide, guided, trajectories, going, max(room.values()), turn)
        pending: list[tuple[int, list]] = []
        sampled: dict[int, tuple[list[int], ParsedTurn]] = {}  # each pending row's turn, read back
        for i, sample in zip(going, outputs):
            trajectory, ids, log_probs = trajectories[i], sample.ids, sample.log_probs
            cut = len(ids) > room[i]
            ids = ids[: room[i]]
            if i in guided:  # the teacher's turn: no behaviour log-probs of the student's (0.0, never a ratio's)
                assert guide is not None
                trajectory.extend(ids, guide.trained, None, model_turn=True)
                trajectory.guided_turns += 1
            else:
                trajectory.extend(ids, True, None if log_probs is None else log_probs[: room[i]])
            trajectory.turns += 1
            if sample.hit_max or cut or not ids or ids[-1] not in eos_ids:
                trajectory.hit_max = True
                continue
            parsed = read_calls(decode(ids[:-1]))  # the turn's text without its end of turn
            if not parsed.calls and not parsed.malformed:
                continue  # an answer: the trajectory is done
            trajectory.calls += len(parsed.calls) + len(parsed.malformed)
            if turn + 1 == settings.max_turns:
                trajectory.unanswered_calls += len(parsed.calls) + len(parsed.malformed)
                continue
            pending.append((i, [parsed.calls, parsed.malformed]))
            sampled[i] = (ids, parsed)
        results = iter(conversations.run([(i, call) for i, (calls, _) in pending for call in calls]))
        going = []
        for i, (calls, unreadable) in pending:
            trajectory = trajectories[i]
            answered = [next(results) for _ in calls] + [malformed(why) for why in unreadable]
            for result in answered:
                trajectory.tool_seconds += result.seconds
                if result.failure is not None:
                    trajectory.failures[result.failure] += 1
            after = contexts[i].after(trajectory.length, *sampled[i], answered)
            if after.length >= settings.budget:  # no room for the results and a turn: roll back
                trajectory.rolled_back_results += 1
                trajectory.unanswered_calls += len(answered)
                trajectory.hit_max = True
                continue
            trajectory.follow(after, tuple(result.message() for result in answered))
            going.append(i)
    for trajectory in trajectories:
        trajectory.drifted = any(environment.retokenized(p.prompt + p.ids) != p.prompt + p.ids for p in trajectory.pieces)
    drifted = [i for i, t in enumerate(trajectories) if t.drifted]
    if drifted and settings.fail_on_drift:
        raise ValueError(f"fail_on_token_drift: {len(drifted)} of {len(trajectories)} conversations re-tokenize to other "
                         f"ids than were sampled (first: row {drifted[0]} of the batch); distill trains the sampled ids, so "
                         "this only says that a trainer that re-tokenizes the text would train something else. Set "
                         "fail_on_token_drift: false to count it (tools/retokenization_drift) instead")
    return trajectories


def _next_turns(generate: Generate, guide: Guide | None, guided: set[int], trajectories: list[Trajectory],
                going: list[int], max_new_tokens: int, turn: int) -> list[Sample]:
    """The next turn of each row in `going`, in its order, sampled after its context: the student's (`generate`), the
    teacher's for the rows in `guided` (`guide.generate`), each batch in one call."""
    writers: list[tuple[Generate, list[int]]] = [(generate, [i for i in going if i not in guided])]
    if guide is not None:
        writers.append((guide.generate, [i for i in going if i in guided]))
    turns: dict[int, Sample] = {}
    for writer, rows in writers:
        if rows:
            turns.update(zip(rows, writer([trajectories[i].context for i in rows], max_new_tokens, turn, rows)))
    return [turns[i] for i in going]


def loop_metrics(trajectories: list[Trajectory]) -> dict[str, tuple[float, float]]:
    """Means over trajectories (numerator, denominator), reduced across processes like every metric."""
    n = float(len(trajectories))
    turns = float(sum(t.turns for t in trajectories))
    trained = float(sum(sum(p.trained) for t in trajectories for p in t.pieces))
    environment = float(sum(len(p.ids) for t in trajectories for p in t.pieces)) - trained
    metrics = {
        "tools/turns": (float(sum(t.turns for t in trajectories)), n),
        "tools/calls": (float(sum(t.calls for t in trajectories)), n),
        "tools/unanswered_calls": (float(sum(t.unanswered_calls for t in trajectories)), n),
        "tools/truncated": (float(sum(t.hit_max for t in trajectories)), n),
        "tools/rolled_back_results": (float(sum(t.rolled_back_results for t in trajectories)), n),
        "tools/seconds": (float(sum(t.tool_seconds for t in trajectories)), n),
        "tools/environment_token_fraction": (environment, environment + trained),
        "tools/retokenization_drift": (float(sum(t.drifted for t in trajectories)), n),
        "tools/teacher_turn_fraction": (float(sum(t.guided_turns for t in trajectories)), turns),
        "tools/calls_per_turn": (float(sum(t.calls for t in trajectories)), turns),
    }
    calls = float(sum(t.calls for t in trajectories))
    for kind in FAILURES:
        metrics[f"tools/failed_{kind}"] = (float(sum(t.failures[kind] for t in trajectories)), calls)
    return metrics


LOOP_METRICS = ("tools/turns", "tools/calls", "tools/unanswered_calls", "tools/truncated", "tools/rolled_back_results",
                "tools/seconds", "tools/environment_token_fraction", "tools/retokenization_drift", "tools/teacher_turn_fraction",
                "tools/calls_per_turn", *(f"tools/failed_{kind}" for kind in FAILURES))
