"""Per-token trained masks (`Completion.trained_mask`): a completion's tokens are all attended, only the masked-in
ones are trained. A mask with holes is what a multi-turn trajectory needs (model turns trained, the environment's
turns between them not); every teacher location serves it (the server, cache and cross-tokenizer tests run
holed masks too: tests/teachers, tests/methods/gold)."""

from __future__ import annotations

import random

import pytest
import torch

from distill.batch import Completion, all_trained, collate, skipping_first, untrained
from distill.objectives import DivergenceObjective, StepContext
from distill.objectives.student import student_loss
from distill.teachers.local import LocalTeacher
from tests.conftest import tiny_lm
from tests.helpers.training import holed_mask
from tests.losses.reference import jsd, probs

VOCAB, PAD = 64, 0


def random_completions(rng: random.Random, rows: int) -> list[Completion]:
    """Trajectories of random lengths with random masks: runs of trained and untrained tokens, empty ones too."""
    completions = []
    for _ in range(rows):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 6))]
        ids = [rng.randrange(1, VOCAB) for _ in range(rng.randint(0, 12))]
        mask, trained = [], rng.random() < 0.5
        for _ in ids:
            if rng.random() < 0.3:
                trained = not trained
            mask.append(trained)
        log_probs = [-rng.random() for _ in ids]
        completions.append(Completion(prompt, ids, "student", rollout_log_probs=log_probs, trained_mask=tuple(mask)))
    return completions


@pytest.mark.parametrize("seed", range(20))
def test_collated_masks_are_the_completions_and_every_token_stays_attended(seed):
    rng = random.Random(seed)
    completions = random_completions(rng, rng.randint(1, 5))
    batch = collate(completions, "student", PAD)
    assert batch.input_ids.dtype == torch.long and batch.completion_mask.dtype == torch.bool
    assert batch.num_completion_tokens == sum(c.num_trained for c in completions)
    for row, c in enumerate(completions):
        length = len(c.prompt_ids) + len(c.completion_ids)
        assert len(c.mask) == len(c.completion_ids)
        assert batch.input_ids[row, :length].tolist() == c.prompt_ids + c.completion_ids
        assert batch.attention_mask[row].tolist() == [1] * length + [0] * (batch.input_ids.shape[1] - length)
        assert batch.completion_mask[row].tolist() == [False] * len(c.prompt_ids) + list(c.mask) + [False] * (
            batch.input_ids.shape[1] - length)
    expected = [lp for c in completions for lp, flag in zip(c.rollout_log_probs, c.mask) if flag]
    assert batch.rollout_log_probs.tolist() == pytest.approx(expected)


def test_mask_constructors_and_a_mask_of_the_wrong_length_is_refused():
    assert skipping_first(4, 1) == (False, True, True, True) and skipping_first(2, 5) == (False, False)
    assert untrained(3) == (False,) * 3 and all_trained(2) == (True, True) and all_trained(0) == ()
    assert Completion([1], [2, 3], "dataset").mask == (True, True)
    assert Completion([1], [2, 3], "dataset", trained_mask=[1, 0]).trained_indices() == [0]
    with pytest.raises(ValueError, match="one flag per completion token"):
        Completion([1], [2, 3], "dataset", trained_mask=(True,))
    with pytest.raises(ValueError, match="one per completion token"):
        Completion([1], [2, 3], "dataset", rollout_log_probs=[-1.0])


def _naive_loss(student, teacher, completions, beta, temperature):
    """float64, probability space, from the definition: JSD_beta at every trained completion token, summed."""
    total = torch.zeros((), dtype=torch.float64)
    for c in completions:
        ids = torch.tensor([c.prompt_ids + c.completion_ids])
        s_logits = student(ids).logits[0].double()
        with torch.no_grad():
            t_logits = teacher(ids).logits[0].double()
        for k in c.trained_indices():
            at = len(c.prompt_ids) + k - 1  # the position predicting completion token k
            total = total + jsd(probs(s_logits[at], temperature), probs(t_logits[at], temperature), beta)
    return total


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_a_holed_mask_trains_its_tokens_only_and_keeps_the_holes_attended(beta):
    torch.manual_seed(0)
    student = tiny_lm(VOCAB, layers=2, seed=2, eos_token_id=1)
    teacher_model = tiny_lm(VOCAB, layers=2, seed=3, eos_token_id=1)
    teacher = LocalTeacher(teacher_model, VOCAB, [1], PAD, torch.device("cpu"))
    rng = random.Random(7)
    completions = []
    for row in range(3):
        ids = [rng.randrange(2, VOCAB) for _ in range(9 + row)]
        completions.append(Completion([rng.randrange(2, VOCAB) for _ in range(3)], ids, "student",
                                      trained_mask=holed_mask(len(ids), row)))
    batch = collate(completions, "student", PAD)
    objective = DivergenceObjective.constant(beta, 0.8, 4)

    student.zero_grad()
    got = student_loss(student, VOCAB, batch, teacher.score(batch, 0.8), objective, StepContext("student"))
    got.loss_sum.backward()
    got_grad = torch.cat([p.grad.flatten() for p in student.parameters()]).double()
    student.zero_grad()
    want = _naive_loss(student.double(), teacher_model.double(), completions, beta, 0.8)
    want.backward()
    want_grad = torch.cat([p.grad.flatten() for p in student.parameters()])
    student.float(), teacher_model.float()
    assert float(got.num_tokens) == batch.num_completion_tokens == sum(c.num_trained for c in completions)
    torch.testing.assert_close(got.loss_sum.double(), want, rtol=1e-5, atol=1e-7)
    assert float((got_grad - want_grad).abs().max() / want_grad.abs().max()) < 1e-4  # fp32 against float64

    # The holes are attended: a token inside one changes the loss of the trained tokens after it.
    hole = completions[0].mask.index(False)
    changed = list(completions[0].completion_ids)
    changed[hole] = (changed[hole] + 1) % (VOCAB - 2) + 2
    moved = [Completion(completions[0].prompt_ids, changed, "student", trained_mask=completions[0].mask), *completions[1:]]
    moved_batch = collate(moved, "student", PAD)
    with torch.no_grad():
        other = student_loss(student, VOCAB, moved_batch, teacher.score(moved_batch, 0.8), objective, StepContext("student"))
    assert not torch.equal(other.loss_sum, got.loss_sum.detach())


def test_the_self_teacher_scores_the_holed_mask_of_its_row(tokenizer, tmp_path, monkeypatch):
    """sdft's teacher row carries the student row's mask: its hidden states are at the same trained positions."""
    import distill.training.student_sampler
    from distill.teachers.hidden import backbone_hidden
    from tests.helpers.training import with_holes
    from tests.methods.test_sdft import context_rows, distiller, fixed_completions

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", fixed_completions)
    run = distiller(tokenizer, tmp_path, rows=context_rows(8), teacher_model_kind="base")
    run.setup()
    whole = run.rollout.take(0, {})[0]
    batch = with_holes(whole, tokenizer.pad_token_id)
    assert 0 < batch.num_completion_tokens < whole.num_completion_tokens
    signal = run.teacher.score(batch, 1.0)
    expected = []
    with run.teacher.model() as model:
        for c in batch.completions:
            ids = run.teacher.teacher_prompt(c.example)[0]
            with torch.no_grad():
                hidden = backbone_hidden(model, torch.tensor([ids + c.completion_ids]),
                                         torch.ones(1, len(ids) + len(c.completion_ids), dtype=torch.long))
            expected += [hidden[0, len(ids) + k - 1] for k in c.trained_indices()]
    assert signal.hidden.shape[0] == batch.num_completion_tokens == len(expected)
    torch.testing.assert_close(signal.hidden, torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_a_later_pieces_turns_count_on_from_the_assistant_turns_of_its_history():
    """Per-turn metrics (`reverse_kl/turn_K`) index a turn by its place in the whole conversation, also in a later
    piece of a conversation trained in pieces (whose own layout starts again at its first segment)."""
    from distill.batch import Completion, model_turns
    from distill.conversations.layout import Layout, Segment

    history = ({"role": "assistant", "content": "a"}, {"role": "tool", "content": "1"},
               {"role": "assistant", "content": "b"}, {"role": "tool", "content": "2"})
    segments = (Segment(2, True), Segment(1, False), Segment(3, True))
    mask = (True, True, False, True, True, True)
    first = Completion([1], [5] * 6, "student", trained_mask=mask, layout=Layout(segments))
    later = Completion([1], [5] * 6, "student", trained_mask=mask, layout=Layout(segments, history=history), piece=1)
    assert model_turns(first) == [0, 0, 1, 1, 1]
    assert model_turns(later) == [2, 2, 3, 3, 3]
