"""`python -m tests.conversations.scripted_run train ...`: `distill train` with the student's turns scripted, for
tests of whole runs in a subprocess (kill and resume) whose rollouts must call tools.

The script: a turn after fewer than `1 + seed % 2` tool results calls the environment's `tick` (or the call the
environment variable SCRIPTED_CALL holds, as JSON: {"name": ..., "arguments": {...}}); then the turn answers with the
last result's text. Each turn's ids are a function of the conversation so far and of the row's seed, as sampling's
are, so a resumed run writes the same conversations."""

from __future__ import annotations

import json
import os
import re
import sys


class Ticker:
    """A stateful environment: a counter started from the row, stepped by each call."""

    def reset(self, **row) -> str:
        self.count = int(row["start"])
        return f" (the counter starts at {self.count})"

    def tick(self) -> int:
        """Steps the counter and returns its new value."""
        self.count += 3
        return self.count


def scripted(tokenizer):
    from distill.generation.sample import Sample

    eos = tokenizer.eos_token_id
    scripted_call = json.loads(os.environ.get("SCRIPTED_CALL", '{"name": "tick", "arguments": {}}'))
    call = tokenizer(f"<tool_call>\n{json.dumps(scripted_call)}\n</tool_call>", add_special_tokens=False)["input_ids"]

    def generate(model, prompts, sampling, *args, with_log_probs=False, seeds=None, **kwargs):
        out = []
        for prompt, seed in zip(prompts, seeds):
            text = tokenizer.decode(prompt)
            results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text, re.DOTALL)
            if len(results) < 1 + seed % 2:
                ids = call + [eos]
            else:
                ids = tokenizer(f"It is {results[-1]}.", add_special_tokens=False)["input_ids"] + [eos]
            ids = ids[: sampling.max_new_tokens]
            out.append(Sample(ids, False, [-0.5] * len(ids) if with_log_probs else None))
        return out

    return generate


def main(argv: list[str]) -> int:
    import distill.training.student_sampler
    from distill.cli import main as distill_main

    original = distill.training.student_sampler.StudentSampler._conversations

    def conversations(self, loop, *args, **kwargs):
        distill.training.student_sampler.generate_completions = scripted(loop.environment.tokenizer)
        return original(self, loop, *args, **kwargs)

    distill.training.student_sampler.StudentSampler._conversations = conversations
    return distill_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
