"""The synchronous rollout producer (`StepRollout`): a step's rollout generated when the step takes it.

Sources, the producer's interface and rollout log-probs: `distill.training.plan`. The samplers: the student's
(`distill.training.student_sampler`), the teacher's seq_kd window (`distill.training.teacher_window`), the dataset's
completions and the micro-batches made of them (`distill.training.completions`).
"""

from __future__ import annotations

from distill.batch import MicroBatch, collate
from distill.generation.sample import sample_from_plain, sample_to_plain
from distill.training.completions import samples_of
from distill.training.rollout_parts import ComposedRollout, RolloutParts


class StepRollout(ComposedRollout):
    """The synchronous producer: completions for every micro-batch of this process, generated when a step takes them.

    One student `generate` for the step's on-policy micro-batches, one teacher `generate` per window of
    `seq_kd_generation_steps` steps for the seq_kd ones, dataset completions for the rest.

    With `num_iterations` > 1 the micro-batches of step k * num_iterations (prompts, completions, their
    sampling log-probs and weights version) are reused by the next num_iterations - 1 steps. The reused
    rollout is what this producer holds: checkpointed (`state_dict`), so a run resumed inside a reuse window
    trains on the same samples.
    """

    def __init__(self, parts: RolloutParts):
        super().__init__(parts)
        self._reused: tuple[int, list[MicroBatch]] | None = None

    def request(self, step: int) -> None:
        pass  # synchronous: the rollout is generated when the step takes it

    def take(self, step: int, timings: dict[str, float]) -> list[MicroBatch]:
        first = self.generation_step(step)
        if self._reused is not None and self._reused[0] == first:
            micro_batches = self._reused[1]
        else:
            micro_batches = self.sample_here(first, timings)
            if self.settings.num_iterations > 1:
                self._reused = (first, micro_batches)
        self.parts.stage.run(first, micro_batches, timings)
        return micro_batches

    # ----------------------------------------------------------------------- the reused rollout as a hook --
    def holds_state(self) -> bool:
        return self.settings.num_iterations > 1

    def state_dict(self) -> dict:
        """The reused rollout's completions as samples (`distill.generation.sample.sample_to_plain`: token ids, hit-max
        flags, sampling log-probs, weights version, trained mask, prompt, layout), plain values only; sources follow
        from the step."""
        if self._reused is None:
            return {}
        first, batches = self._reused
        return {"step": first, "batches": [[sample_to_plain(sample) for sample in samples_of(mb.completions)]
                                           for mb in batches]}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            self._reused, self.parts.stage.staged = None, None
            return
        first = int(state["step"])
        groups, sources = self.schedule.prompt_groups(first), self.sources(first)
        if [len(g) for g in groups] != [len(saved) for saved in state["batches"]]:
            raise ValueError(f"resume: the checkpoint's reused rollout (step {first}) has micro-batches of "
                             f"{[len(saved) for saved in state['batches']]} prompts, this run {[len(g) for g in groups]}; "
                             "resume with the run's per_device_train_batch_size and gradient_accumulation_steps")
        batches = []
        for source, group, saved in zip(sources, groups, state["batches"]):
            samples = [sample_from_plain(plain) for plain in saved]
            # A checkpoint from before weights versions were recorded: the student sampled at the rollout's step.
            completions = [completion for j, sample in zip(group, samples) for completion in self.parts.assembler.completions(
                j, source, sample, sample.weights_version if sample.weights_version is not None
                else first if source == "student" else None)]
            batches.append(collate(completions, source, self.parts.assembler.pad_id))
        self._reused = (first, batches)
        self.parts.stage.new_rollout(restored=True)  # restored completions are staged again when first used
