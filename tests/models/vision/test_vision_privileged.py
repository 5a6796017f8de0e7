"""Privileged context that shows images (sdft, sdpo): content blocks in `privileged_context` whose images come from
a `privileged_images` column or name their own; the self-teacher's prompt shows the row's images, then the
context's, and its pass reads exactly those pixels (against a twin built by hand); bad rows fail naming the row,
before any model loads."""

from __future__ import annotations

import json
import random

import datasets
import pytest
import torch

from distill import DistillConfig
from distill.batch import Completion, collate
from distill.data import examples_from_dataset
from distill.images import ImageRef
from distill.methods.sdpo.reprompts import (
    DEFAULT_FEEDBACK_TEMPLATE,
    DEFAULT_REPROMPT_TEMPLATE,
    DEFAULT_SOLUTION_TEMPLATE,
    Reprompts,
)
from distill.methods.self_teacher_prompts import TeacherPrompts, fill
from distill.models.inputs import DeferredExtras
from distill.models.kinds import model_kind_of
from distill.models.vision import attach_processor, image_token_ids
from distill.teachers.self_teacher import SelfTeacher
from distill.training.trainer import Distiller
from tests.conftest import tiny_lm, train_tiny_tokenizer
from tests.helpers.training import FAST, forbid_model_loading
from tests.models.vision.models import qwen_processor, save_qwen_vl, shape_image, tiny_qwen_vl
from tests.models.vision.test_vision_runs import GKD_ONLY

CPU = torch.device("cpu")
TEMPLATE = "{prompt} Hint: {privileged_context} Answer."
QUESTION = {"type": "text", "text": "What colour?"}
HINT = [{"type": "text", "text": "this one is "}, {"type": "image"}, {"type": "text", "text": " so answer red."}]


def _rows(tmp_path) -> list[dict]:
    """Rows showing 1, 0 and 2 images in their prompts and one hint image in their privileged context (from the
    `privileged_images` column, or named by the block), and one row whose context is text."""
    (tmp_path / "images").mkdir(parents=True, exist_ok=True)
    for name, colour, shape in (("a", "red", "circle"), ("b", "blue", "square"), ("c", "green", "triangle"),
                                ("hint", "yellow", "circle")):
        shape_image(colour, shape).save(tmp_path / "images" / f"{name}.png")
    own = [HINT[0], {"type": "image", "image": "images/hint.png"}, HINT[2]]
    return [
        {"prompt": [{"role": "user", "content": [{"type": "image"}, QUESTION]}], "images": ["images/a.png"],
         "privileged_context": HINT, "privileged_images": ["images/hint.png"], "completion": "red", "answer": "red"},
        {"prompt": [{"role": "user", "content": [QUESTION]}], "images": [],
         "privileged_context": own, "privileged_images": [], "completion": "red", "answer": "red"},
        {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, QUESTION]}],
         "images": ["images/b.png", "images/c.png"], "privileged_context": HINT, "privileged_images": ["images/hint.png"],
         "completion": "red", "answer": "red"},
        {"prompt": [{"role": "user", "content": [{"type": "image"}, QUESTION]}], "images": ["images/c.png"],
         "privileged_context": [{"type": "text", "text": "It is green."}], "privileged_images": [], "completion": "green", "answer": "green"},
    ]


def _write(tmp_path, rows) -> str:
    path = tmp_path / "privileged.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _examples(tmp_path):
    rows = datasets.load_dataset("json", data_files=_write(tmp_path, _rows(tmp_path)), split="train")
    return examples_from_dataset(rows, "dataset", tmp_path)


def test_a_privileged_context_of_content_blocks_brings_its_own_images(tmp_path):
    examples = _examples(tmp_path)
    hint = str(tmp_path / "images" / "hint.png")
    assert [len(e.images) for e in examples] == [1, 0, 2, 1]
    assert [[i.path for i in e.privileged_images] for e in examples] == [[hint], [hint], [hint], []]
    assert examples[0].privileged_context == HINT and examples[3].privileged_context == "It is green."
    # Blocks without an image are text; the filled-in turn shows the prompt's images, then the context's.
    text_only = {"prompt": "Q?", "privileged_context": [{"type": "text", "text": "a fact"}]}
    assert examples_from_dataset(datasets.Dataset.from_list([text_only]), "dataset")[0].privileged_context == "a fact"
    filled = fill(TEMPLATE, examples[0].prompt, examples[0].privileged_context)
    assert filled[0]["content"] == [{"type": "image"}, {"type": "text", "text": "What colour? Hint: this one is "},
                                    {"type": "image"}, {"type": "text", "text": " so answer red. Answer."}]


@pytest.mark.parametrize("change, message", [
    ({"privileged_images": ["images/missing.png"]}, r"dataset row 0 privileged_context, image 1 of the 'privileged_images' column: image .*missing.png does not exist"),
    ({"privileged_images": ["images/a.png", "images/a.png"]}, "'privileged_images' column holds 2 images and its content blocks show 1"),
    ({"privileged_images": []}, "show 1 or more images from the 'privileged_images' column, which holds 0"),
    ({"privileged_context": "text"}, "has 'privileged_images' but its 'privileged_context' is text"),
    ({"privileged_context": None}, "has 'privileged_images' but no 'privileged_context'"),
    ({"prompt": "What colour?", "images": []}, "its 'privileged_context' shows images but its prompt is text"),
    ({"privileged_context": [{"type": "image", "image": "https://example.com/a.png"}], "privileged_images": []}, "is a URL"),
    ({"privileged_context": [{"type": "video"}]}, "a content block must be"),
])
def test_bad_privileged_images_fail_naming_the_row(tmp_path, change, message):
    row = {**_rows(tmp_path)[0], **change}
    with pytest.raises(ValueError, match=message):
        examples_from_dataset(datasets.Dataset.from_list([row]), "dataset", tmp_path)


@pytest.fixture(scope="module")
def student():
    processor = qwen_processor()
    model = tiny_qwen_vl(processor.tokenizer, layers=2, seed=5)
    attach_processor(model, processor)
    return processor, model.eval()


def _twin_hidden(processor, model, example, completion_ids, hint: bool) -> torch.Tensor:
    """The final hidden states predicting `completion_ids` after the teacher prompt written out by hand: the
    prompt's images, the question, then the hint's text around its image (or, `hint` False, without its pixels)."""
    images = [image.load() for image in example.images]
    context = example.privileged_context
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": "What colour? Hint: this one is "}]
    content += [{"type": "image"}, {"type": "text", "text": " so answer red. Answer."}] if hint else [
        {"type": "text", "text": " so answer red. Answer."}]
    assert context == HINT
    text = processor.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                   add_generation_prompt=True)
    shown = images + ([ImageRef(path=example.privileged_images[0].path).load()] if hint else [])
    inputs = processor(text=[text], images=shown, return_tensors="pt", add_special_tokens=False)
    ids = torch.cat([inputs.pop("input_ids"), torch.tensor([completion_ids])], dim=1)
    inputs.pop("attention_mask", None)
    inputs["mm_token_type_ids"] = (ids == model.config.image_token_id).long()
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True, **inputs).hidden_states[-1][0]
    start = ids.shape[1] - len(completion_ids) - 1
    return hidden[start : start + len(completion_ids)]


def test_the_self_teacher_reads_the_prompts_images_then_the_contexts(tmp_path, student):
    processor, model = student
    tokenizer = processor.tokenizer
    examples = _examples(tmp_path)
    encoder = model_kind_of(model).encoder(tokenizer, 64, 8, [tokenizer.eos_token_id], model)
    teacher_encoder = model_kind_of(model).encoder(tokenizer, 160, 8, [tokenizer.eos_token_id], model)
    teacher = SelfTeacher("live", model, TeacherPrompts(teacher_encoder, TEMPLATE), len(tokenizer),
                          [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU)
    placeholder = model.config.image_token_id
    rng = random.Random(0)
    text_ids = [i for i in range(len(tokenizer)) if i not in set(image_token_ids(model)) | {tokenizer.eos_token_id}]
    rows = []
    for example in examples:
        encoded = encoder.row(example)
        prompt = teacher.teacher_prompt(example)
        shown = len(example.images) + len(example.privileged_images)
        assert prompt.ids.count(placeholder) == 4 * shown and not prompt.truncated
        # Its own image inputs where the context shows images; the row's (the student's) otherwise.
        assert (prompt.extras is not None) == bool(example.privileged_images)
        assert prompt.extras is None or isinstance(prompt.extras, DeferredExtras)
        rows.append(Completion(encoded.prompt_ids, [rng.choice(text_ids) for _ in range(4)] + [tokenizer.eos_token_id],
                               "student", example=example, extras=encoded.extras))
    seen = []
    hook = model.model.visual.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    try:
        signal = teacher.score(collate(rows, "student", tokenizer.pad_token_id), 1.0)
    finally:
        hook.remove()
    assert seen[0].shape[0] == 16 * sum(len(e.images) + len(e.privileged_images) for e in examples)  # 16 patches each
    at = 0
    for example, row in zip(examples, rows):
        got = signal.hidden[at : at + len(row.completion_ids)]
        at += len(row.completion_ids)
        if example.privileged_images:
            torch.testing.assert_close(got, _twin_hidden(processor, model, example, row.completion_ids, hint=True),
                                       rtol=1e-4, atol=1e-4)
            without = _twin_hidden(processor, model, example, row.completion_ids, hint=False)
            assert (got - without).abs().max() > 1e-3  # the hint's pixels change what the teacher sees
    assert at == signal.hidden.shape[0]


def test_sdpo_reprompts_show_the_contexts_images_as_feedback(tmp_path, student):
    processor, model = student
    tokenizer = processor.tokenizer
    example = _examples(tmp_path)[0]
    encoder = model_kind_of(model).encoder(tokenizer, 200, 8, [tokenizer.eos_token_id], model)
    reprompts = Reprompts(encoder, DEFAULT_REPROMPT_TEMPLATE, DEFAULT_SOLUTION_TEMPLATE, DEFAULT_FEEDBACK_TEMPLATE)
    with_feedback = reprompts.ids(example, "red", example.privileged_context)
    assert with_feedback.ids.count(model.config.image_token_id) == 8 and with_feedback.extras is not None
    content = reprompts.text(example, "red", example.privileged_context)[0]["content"]
    assert [b["type"] for b in content] == ["image", "text", "image", "text"]
    assert content[1]["text"].endswith("earlier attempt:\n\nthis one is ")
    solution_only = reprompts.ids(example, "red", None)
    assert solution_only.ids.count(model.config.image_token_id) == 4 and solution_only.extras is None


@pytest.mark.parametrize("method", ["sdft", "sdpo"])
def test_sdft_and_sdpo_train_on_rows_whose_privileged_context_shows_images(tmp_path, method, monkeypatch):
    from distill.rendering import ImageRenderer

    own_inputs = []
    prompt = ImageRenderer.prompt
    monkeypatch.setattr(ImageRenderer, "prompt", lambda self, *a, **k: own_inputs.append(prompt(self, *a, **k).extras)
                        or prompt(self, *a, **k))
    data = _write(tmp_path, _rows(tmp_path))
    student_dir = save_qwen_vl(tmp_path / "student", layers=2, seed=2)
    fast = {k: v for k, v in FAST.items() if k not in GKD_ONLY}
    values = {**fast, "student": str(student_dir), "dataset": data, "max_prompt_length": 64, "method": method,
              "output_dir": str(tmp_path / method)}
    if method == "sdft":
        values.update(max_teacher_prompt_length=160, generate_from_teacher=True)
    else:
        values.update(num_generations=2, reward_funcs=["contains_answer"], max_reprompt_length=200, include_feedback=True)
    run = Distiller(DistillConfig(**values))
    assert run.train()["steps"] == 2
    assert any(isinstance(extras, DeferredExtras) for extras in own_inputs)  # teacher prompts with the hint's pixels
    lines = [json.loads(line) for line in (tmp_path / method / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(line["loss"])) for line in lines if "loss" in line)


def test_privileged_images_with_a_text_only_student_fail_before_any_model_loads(tmp_path, monkeypatch):
    rows = _rows(tmp_path)
    rows = [{**rows[1]}]  # a text prompt's row whose context alone shows an image
    text_model = tmp_path / "text-model"
    tokenizer = train_tiny_tokenizer()
    tiny_lm(len(tokenizer)).save_pretrained(text_model)
    tokenizer.save_pretrained(text_model)
    forbid_model_loading(monkeypatch)
    fast = {k: v for k, v in FAST.items() if k not in GKD_ONLY}
    with pytest.raises(ValueError, match=r"row 0 shows 1 image\(s\) in its privileged_context, and the student .* is a "
                                         "text-only model"):
        Distiller(DistillConfig(**fast, student=str(text_model), dataset=_write(tmp_path, rows), method="sdft",
                                output_dir=str(tmp_path / "run")))
