"""A vision-language pair's loss and gradients against a float64 twin from the definition, on the text completion
positions; image positions carry no loss; the teacher reads exactly the student's pixel values; the sums do not
depend on how rows with different numbers of images are split into micro-batches; image tokens are never sampled."""

from __future__ import annotations

import random

import pytest
import torch

from distill.batch import Completion, collate
from distill.data import Example
from distill.generation import SamplingParams, generate_completions
from distill.images import ImageRef
from distill.models.kinds import model_kind_of
from distill.models.vision import attach_processor, image_token_ids
from distill.objectives import DivergenceObjective, StepContext
from distill.objectives.student import student_loss
from distill.teachers.local import LocalTeacher
from tests.losses.reference import jsd, probs
from tests.models.vision.models import qwen_processor, shape_image, tiny_qwen_vl

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def pair():
    processor = qwen_processor()
    teacher, student = tiny_qwen_vl(processor.tokenizer, layers=3, seed=1), tiny_qwen_vl(processor.tokenizer, layers=2, seed=2)
    for model in (teacher, student):
        attach_processor(model, processor)
    return processor, teacher.eval(), student


def _rows(processor, student, counts=(1, 0, 2, 1)) -> list[Completion]:
    """Completions of prompts showing `counts[i]` images each (different pictures), with random text completions."""
    tokenizer = processor.tokenizer
    encoder = model_kind_of(student).encoder(tokenizer, 64, 8, [tokenizer.eos_token_id], student)
    banned = set(image_token_ids(student)) | {tokenizer.eos_token_id, tokenizer.pad_token_id}
    text_ids = [i for i in range(len(tokenizer)) if i not in banned]
    rng = random.Random(3)
    rows = []
    for i, count in enumerate(counts):
        images = tuple(ImageRef(image=shape_image(("red", "green", "blue")[(i + k) % 3], ("circle", "square")[k % 2]))
                       for k in range(count))
        prompt = [{"role": "user", "content": [{"type": "image"}] * count + [{"type": "text", "text": f"What is shown {i}?"}]}]
        encoded = encoder.row(Example(i, prompt, None, images=images))
        completion = [rng.choice(text_ids) for _ in range(5 + i)] + [tokenizer.eos_token_id]
        rows.append(Completion(encoded.prompt_ids, completion, "student", extras=encoded.extras))
    return rows


def _naive_loss(processor, student, teacher, rows, counts, beta):
    """float64, probability space: each row alone through the model's own forward (logits), its images through the
    processor again; JSD_beta at every completion token, summed."""
    total = torch.zeros((), dtype=torch.float64)
    for i, (c, count) in enumerate(zip(rows, counts)):
        ids = torch.tensor([c.prompt_ids + c.completion_ids])
        inputs = {}
        if count:
            images = [shape_image(("red", "green", "blue")[(i + k) % 3], ("circle", "square")[k % 2]) for k in range(count)]
            out = processor.image_processor(images=images, return_tensors="pt")
            inputs = {"pixel_values": out["pixel_values"].double(), "image_grid_thw": out["image_grid_thw"]}
        inputs["mm_token_type_ids"] = (ids == student.config.image_token_id).long()
        s_logits = student(input_ids=ids, **inputs).logits[0].double()
        with torch.no_grad():
            t_logits = teacher(input_ids=ids, **inputs).logits[0].double()
        for k in range(len(c.completion_ids)):
            at = len(c.prompt_ids) + k - 1
            total = total + jsd(probs(s_logits[at], TEMPERATURE), probs(t_logits[at], TEMPERATURE), beta)
    return total


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_loss_and_gradients_equal_a_float64_twin_on_the_text_positions(pair, beta):
    processor, teacher_model, student = pair
    counts = (1, 0, 2, 1)
    rows = _rows(processor, student, counts)
    batch = collate(rows, "student", processor.tokenizer.pad_token_id)
    image_positions = batch.input_ids == student.config.image_token_id
    assert int(image_positions.sum()) == 4 * sum(counts) and not bool((batch.completion_mask & image_positions).any())
    teacher = LocalTeacher(teacher_model, len(processor.tokenizer), [processor.tokenizer.eos_token_id],
                           processor.tokenizer.pad_token_id, torch.device("cpu"))
    objective = DivergenceObjective.constant(beta, TEMPERATURE, 4)
    student.zero_grad()
    got = student_loss(student, len(processor.tokenizer), batch, teacher.score(batch, TEMPERATURE), objective, StepContext("student"))
    got.loss_sum.backward()
    trained = [p for p in student.parameters() if p.grad is not None]
    got_grad = torch.cat([p.grad.flatten() for p in trained]).double()
    student.zero_grad()
    student.double(), teacher_model.double()
    try:
        want = _naive_loss(processor, student, teacher_model, rows, counts, beta)
        want.backward()
        want_grad = torch.cat([p.grad.flatten() for p in trained])
    finally:
        student.float(), teacher_model.float()
    assert float(got.num_tokens) == sum(len(c.completion_ids) for c in rows)
    torch.testing.assert_close(got.loss_sum.double(), want, rtol=1e-5, atol=1e-7)
    assert float((got_grad - want_grad).abs().max() / want_grad.abs().max()) < 1e-4


def test_the_teacher_reads_exactly_the_students_pixel_values(pair):
    processor, teacher_model, student = pair
    rows = _rows(processor, student)
    batch = collate(rows, "student", processor.tokenizer.pad_token_id)
    seen = {}
    hooks = [model.model.visual.register_forward_pre_hook(lambda m, args, kw, name=name: seen.__setitem__(name, args[0].clone()),
                                                          with_kwargs=True)
             for name, model in (("teacher", teacher_model), ("student", student))]
    try:
        teacher = LocalTeacher(teacher_model, len(processor.tokenizer), [processor.tokenizer.eos_token_id],
                               processor.tokenizer.pad_token_id, torch.device("cpu"))
        teacher.score(batch, 1.0)
        with torch.no_grad():
            student_loss(student, len(processor.tokenizer), batch, teacher.score(batch, 1.0),
                         DivergenceObjective.constant(0.5, 1.0, 4), StepContext("student"))
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(seen["teacher"], seen["student"]) and seen["teacher"].shape[0] == 16 * 4  # 4 images, 16 patches


def test_the_sums_do_not_depend_on_how_rows_with_different_image_counts_are_split(pair):
    processor, teacher_model, student = pair
    rows = _rows(processor, student, counts=(2, 0, 1, 0))
    teacher = LocalTeacher(teacher_model, len(processor.tokenizer), [processor.tokenizer.eos_token_id],
                           processor.tokenizer.pad_token_id, torch.device("cpu"))
    objective = DivergenceObjective.constant(0.5, 1.0, 4)

    def sums_and_grad(splits):
        student.zero_grad()
        total = torch.zeros(())
        for part in splits:
            batch = collate(part, "student", processor.tokenizer.pad_token_id)
            loss = student_loss(student, len(processor.tokenizer), batch, teacher.score(batch, 1.0), objective, StepContext("student"))
            loss.loss_sum.backward()
            total = total + loss.loss_sum.detach()
        return total, torch.cat([p.grad.flatten() for p in student.parameters() if p.grad is not None])

    whole, whole_grad = sums_and_grad([rows])
    split, split_grad = sums_and_grad([rows[:1], rows[1:3], rows[3:]])
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(split_grad, whole_grad, rtol=1e-4, atol=1e-6)


def test_image_tokens_are_never_sampled_even_where_the_model_prefers_them(pair):
    processor, _, student = pair
    rows = _rows(processor, student, counts=(1, 0))
    image_tokens = image_token_ids(student)
    head = student.lm_head
    original = head.forward

    def favour_images(hidden):  # the model now ranks the image placeholder first at every position
        logits = original(hidden)
        logits[..., student.config.image_token_id] += 100.0
        return logits

    head.forward = favour_images
    try:
        prompts, extras = [c.prompt_ids for c in rows], [c.extras for c in rows]
        tokenizer = processor.tokenizer
        for sampling in (SamplingParams(1.0, 1.0, 0, 6), SamplingParams(1.0, 1.0, 0, 6, do_sample=False)):
            out = generate_completions(student, prompts, sampling, [tokenizer.eos_token_id], tokenizer.pad_token_id,
                                       torch.device("cpu"), extras=extras, seeds=[1, 2])
            assert all(s.ids and not set(s.ids) & set(image_tokens) for s in out)
        # Without the suppression the same model would write them (the test could fail).
        with torch.no_grad():
            batch = collate(rows, "student", tokenizer.pad_token_id)
            logits = student(input_ids=batch.input_ids, **model_kind_of(student).forward_inputs(
                student, batch.input_ids, batch.extras)).logits
        assert int(logits[0, -1].argmax()) == student.config.image_token_id
    finally:
        head.forward = original


@pytest.mark.parametrize("engine", ["vllm", "vllm_server"])
def test_the_vllm_engines_refuse_a_vision_language_model_saying_why(pair, engine):
    from distill.generation.complete import choose_engine

    _, _, student = pair
    with pytest.raises(ValueError, match="decode token ids only: a vision-language model's images are not passed to vLLM"):
        if engine == "vllm_server":
            from distill.generation.registry import get_engine

            server = get_engine(engine)
            url, server.url = server.url, "http://127.0.0.1:9"
            try:
                choose_engine(engine, student, torch.device("cpu"))
            finally:
                server.url = url
        else:
            choose_engine(engine, student, torch.device("cpu"))
