"""A step's micro-batches from its samples: the student's (sampled by a producer), the teacher's (its seq_kd window)
and the dataset's own completions, each row made a `Completion` with what the method trains of it.

A conversation whose template re-renders its history comes in pieces (`Sample.later`, `EncodedExample.later`): each
piece is a `Completion` of its own (`Completion.piece` counts them), with its own prompt, so a micro-batch holds a row
for every piece. Each assistant turn is trained in exactly one piece, and the loss is a sum over trained tokens divided
by the step's trained tokens, so a conversation's turns weigh the same whether it is one sequence or several."""

from __future__ import annotations

from dataclasses import replace

from distill.batch import Completion, MicroBatch, by_row, collate, skipping_first, untrained
from distill.data import EncodedExample, Example
from distill.generation.sample import Sample
from distill.training.plan import RolloutSchedule, RolloutSettings
from distill.training.student_sampler import Metrics
from distill.training.teacher_window import TeacherWindow


class RolloutAssembler:
    """Builds `step`'s micro-batches (`assemble`) and single completions (`completion`: a checkpoint's restored)."""

    def __init__(self, schedule: RolloutSchedule, examples: list[Example], encoded: list[EncodedExample],
                 settings: RolloutSettings, teacher: TeacherWindow, eos_ids: list[int], pad_id: int):
        self.schedule, self.examples, self.encoded, self.settings = schedule, examples, encoded, settings
        self.teacher, self.eos_ids, self.pad_id = teacher, eos_ids, pad_id

    def assemble(self, step: int, student: dict[int, list[Sample]], version: int, timings: dict[str, float],
                 loop_metrics_into: Metrics) -> list[MicroBatch]:
        """`step`'s micro-batches: the student's samples `student` (by micro-batch index, drawn by the weights of
        `version`), the teacher's (sampled here, a window at a time; a conversation's loop metrics added to
        `loop_metrics_into`) and the dataset's completions."""
        sources = self.schedule.sources(step)
        groups = self.schedule.prompt_groups(step)
        generated = dict(student)
        if "teacher" in sources:
            window = self.teacher.samples(step, timings, loop_metrics_into)
            generated.update({i: window[(step, i)] for i, s in enumerate(sources) if s == "teacher"})
        micro_batches = []
        for i, (source, group) in enumerate(zip(sources, groups)):
            samples = [self.dataset_sample(j) for j in group] if source == "dataset" else generated[i]
            completions = [completion for j, sample in zip(group, samples)
                           for completion in self.completions(j, source, sample, version if source == "student" else None)]
            micro_batches.append(collate(completions, source, self.pad_id))
        return micro_batches

    def dataset_sample(self, j: int) -> Sample:
        """Example `j`'s own completion: hit_max where it was cut to fit (a conversation's), or where it ends without
        an EOS; its trained mask and layout are the row's (`completion`), its later pieces the row's too."""
        encoded = self.encoded[j]
        assert encoded.completion_ids is not None, "a dataset completion is drawn only for rows that have one"
        ids = list(encoded.completion_ids)
        hit_max = encoded.completion_cut if encoded.completion_trained is not None else bool(ids) and ids[-1] not in self.eos_ids
        later = tuple(Sample(list(piece.completion_ids or []), piece.completion_cut, None, piece.completion_trained,
                             piece.prompt_ids, piece.completion_layout) for piece in encoded.later)
        return Sample(ids, hit_max, later=later)

    def completions(self, j: int, source: str, sample: Sample, weights_version: int | None) -> list[Completion]:
        """Example `j`'s completion `sample` as the micro-batch rows it trains: one, or one per piece of a conversation
        whose template re-renders its history (module docstring)."""
        return [self.completion(j, source, piece, weights_version, k) for k, piece in enumerate(sample.pieces())]

    def completion(self, j: int, source: str, sample: Sample, weights_version: int | None, piece: int = 0) -> Completion:
        """Example `j`'s completion `sample`, with what the method trains of it; `weights_version`: the student
        weights that sampled it (the optimizer steps applied when it was sampled), None for another source;
        `sample.trained`: a sampled conversation's own mask (its sampled turns), None for a completion sampled whole;
        `sample.prompt_ids`: the prompt it followed, when not the row's own (an environment's observation appended);
        `sample.layout`: a sampled conversation's model and environment segments (a dataset conversation's are the
        row's); `piece`: which piece of a conversation `sample` is (0: the first, whose prompt is the row's; a later
        one brings its own prompt, trained mask and layout, and its prompt's truncation is not counted again)."""
        ids, trains_row, encoded = sample.ids, self.settings.trains_row, self.encoded[j]
        skip = self.settings.loss_skip if piece == 0 else 0  # the conversation's first tokens, not each piece's
        mask = (skipping_first(len(ids), skip) if trains_row is None or trains_row(self.examples[j])
                else untrained(len(ids)))
        row = source == "dataset" and piece == 0  # the row's own mask and layout (a later piece brings its own)
        conversation = encoded.completion_trained if row else sample.trained
        if conversation is not None:  # a conversation's own turns: only the assistant's trained
            mask = tuple(a and b for a, b in zip(mask, conversation))
        prompt = encoded.prompt_ids if sample.prompt_ids is None else sample.prompt_ids
        layout = encoded.completion_layout if row else sample.layout
        return Completion(prompt, ids, source, sample.hit_max, encoded.prompt_truncated and piece == 0, self.examples[j],
                          sample.log_probs, mask, weights_version, extras=encoded.extras, layout=layout, piece=piece)


def sample_of(completion: Completion) -> Sample:
    """The sample a completion holds (what a checkpoint keeps of it: `distill.generation.sample.sample_to_plain`)."""
    return Sample(completion.completion_ids, completion.hit_max_new_tokens, completion.rollout_log_probs, completion.mask,
                  completion.prompt_ids, completion.layout, completion.weights_version)


def samples_of(completions: list[Completion]) -> list[Sample]:
    """One sample per row of a micro-batch's completions: a conversation's later pieces (`Completion.piece` > 0)
    joined to its first as `Sample.later`."""
    return [replace(sample_of(row[0]), later=tuple(sample_of(c) for c in row[1:])) for row in by_row(completions)]
