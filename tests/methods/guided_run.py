"""`python -m tests.methods.guided_run train ...`: `distill train` with the student's and the teacher's turns scripted
(`tests.conversations.scripted_run`'s script for both), for whole runs in a subprocess (kill and resume) whose
conversations mix the two writers (Guided-OPD)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import distill.teachers.local
    import distill.training.student_sampler
    from distill.cli import main as distill_main
    from tests.conversations.scripted_run import scripted

    original = distill.training.student_sampler.StudentSampler._conversations

    def conversations(self, loop, *args, **kwargs):
        script = scripted(loop.environment.tokenizer)
        distill.training.student_sampler.generate_completions = script
        distill.teachers.local.generate_completions = script
        return original(self, loop, *args, **kwargs)

    distill.training.student_sampler.StudentSampler._conversations = conversations
    return distill_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
