"""The conversations feature's settings (tools and environments in the student's rollouts): a leaf, composed into
`DistillConfig` when the feature is declared (`distill.parts`) and read back typed (`ConversationFields.of(config)`);
its reads and rules are `distill.agents.feature`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distill.config.io import PartFields, setting


@dataclass
class ConversationFields(PartFields):
    """Tools and an environment between the student's turns, and the tool-call loop's bounds."""

    placed_after: ClassVar[str] = "seq_kd_generation_steps"

    tools: list = setting([], "Tools the student may call in its rollouts: import paths 'package.module:function' (a "
                          "function of keyword arguments returning text; `async def` too). Their JSON schemas are shown "
                          "in every prompt (the template's tool format, or distill's Hermes format where it has none), "
                          "and each on-policy completion becomes a conversation: a turn, its calls run, their results, "
                          "the next turn (docs/usage.md, conversations). Empty: single-turn completions.")
    environment: str | None = setting(None, "An environment for the student's rollouts: the import path of a factory "
                                      "('package.module:Factory', the reference library's environment_factory "
                                      "contract): one instance per rollout row, `reset(**row)` called first (its text, "
                                      "if any, appended to the row's last user message), its public methods the row's "
                                      "tools beside `tools`.")
    max_turns: int = setting(4, "With tools: assistant turns per rollout at most (the last one's calls are not run).")
    fail_on_token_drift: bool = setting(False, "With tools: stop the run when a sampled conversation's text re-tokenizes to "
                                        "other ids (distill trains the sampled ids either way; "
                                        "tools/retokenization_drift counts such conversations).")
    tool_timeout: float = setting(10.0, "With tools: seconds a call may run (above 0, at most a day); a slower one is stopped (its "
                                  "worker process killed) and becomes an error message the model reads as its result. "
                                  "Also bounds an environment's reset and get_reward.")
    tool_workers: int = setting(4, "With tools: worker processes the calls run in, started when first needed and kept "
                                "for the run (with an environment, as many more hold its instances: a row's lives in one "
                                "worker for its whole conversation). A round's calls run at once, one per worker at a "
                                "time; raise it for slow calls that wait on the network.")
    tool_memory_gb: float = setting(0.0, "With tools: GiB of address space each tool worker may map (RLIMIT_AS, where "
                                    "the system enforces it: Linux); a call that allocates past it fails as "
                                    "out_of_memory and the run goes on. 0: no limit.")
