"""A vision-language teacher outside the process: `distill serve-teacher` of a Qwen2-VL reads each prompt's images
(`distill_images`, base64 PNG), in both payloads (top-k log-probs, final hidden states), and equals the same
teacher held locally; a server that takes no images is refused before it could ignore them."""

from __future__ import annotations

import pytest
import torch

from distill.batch import Completion, collate
from distill.data import Example
from distill.images import ImageRef
from distill.models.kinds import model_kind_of
from distill.serving.app import build_app
from distill.serving.scoring import ScoringEngine
from distill.teachers.build import load_model
from distill.teachers.hidden import backbone_hidden, predicting_positions
from distill.teachers.hidden_server import HiddenStateServerTeacher
from distill.teachers.server import ServerSettings, ServerTeacher
from tests.teachers.servers import post, serve_app, serve_teacher
from tests.vision.models import save_qwen_vl, shape_image


@pytest.fixture(scope="module")
def vl_teacher(tmp_path_factory):
    directory = save_qwen_vl(tmp_path_factory.mktemp("vl-teacher") / "teacher", layers=3, seed=1)
    model, tokenizer = load_model(str(directory), "teacher")
    with serve_teacher(directory, "--max-logprobs", "300") as (url, _):
        yield directory, model, tokenizer, url


def _batch(model, tokenizer, counts=(1, 0, 2)):
    encoder = model_kind_of(model).encoder(tokenizer, 64, 8, [tokenizer.eos_token_id], model)
    rows = []
    for i, count in enumerate(counts):
        images = tuple(ImageRef(image=shape_image(("red", "blue", "green")[(i + k) % 3], ("circle", "square")[k % 2]))
                       for k in range(count))
        example = Example(i, [{"role": "user", "content": [{"type": "image"}] * count + [{"type": "text", "text": "Colour?"}]}],
                          None, images=images)
        encoded = encoder.encode(example)
        rows.append(Completion(encoded.prompt_ids, [40 + i, 50, 60, tokenizer.eos_token_id], "dataset", example=example,
                               extras=encoded.extras))
    return collate(rows, "dataset", tokenizer.pad_token_id)


def _local_hidden(model, batch):
    with torch.no_grad():
        hidden = backbone_hidden(model, batch.input_ids, batch.attention_mask, batch.extras)
    return hidden[:, :-1][predicting_positions(batch.completion_mask)]


def test_the_served_teacher_reads_the_images_and_equals_the_local_one(vl_teacher):
    _, model, tokenizer, url = vl_teacher
    batch = _batch(model, tokenizer)
    vocab = len(tokenizer)
    teacher = ServerTeacher(ServerSettings(url, vocab, retries=0, timeout_s=60.0), vocab_size=vocab)
    teacher.check(tokenizer)
    signal = teacher.score(batch, 1.0)
    expected = torch.log_softmax(model.get_output_embeddings()(_local_hidden(model, batch)).double(), dim=-1)
    got = torch.full_like(expected, float("-inf")).scatter(1, signal.topk_ids, signal.topk_log_probs.double())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    # Without its images the same ids score otherwise: the images reached the teacher.
    blind = collate([Completion(c.prompt_ids, c.completion_ids, "dataset", example=Example(c.example.index, "x", None),
                                extras=c.extras) for c in batch.completions], "dataset", tokenizer.pad_token_id)
    status, _ = post(url, "/v1/completions", {"prompt": [blind.completions[0].prompt_ids + [40]], "max_tokens": 1,
                                               "prompt_logprobs": 1})
    assert status == 500  # 4 image tokens and no image: the model refuses, the request fails

    hidden_teacher = HiddenStateServerTeacher(ServerSettings(url, 20, retries=0, timeout_s=60.0), vocab)
    hidden_teacher.check(tokenizer)
    states = hidden_teacher.score(batch, 1.0).hidden
    torch.testing.assert_close(states, _local_hidden(model, batch), atol=1e-5, rtol=0)


def test_a_server_that_takes_no_images_is_refused_before_it_could_ignore_them(vl_teacher, model_dirs, tokenizer):
    _, model, vl_tokenizer, _ = vl_teacher
    batch = _batch(model, vl_tokenizer)
    text_model, text_tokenizer = load_model(str(model_dirs["teacher"]), "teacher")
    with serve_app(build_app(ScoringEngine(text_model, text_tokenizer, torch.device("cpu")), "text")) as url:
        teacher = ServerTeacher(ServerSettings(url, 5, retries=0, timeout_s=30.0), vocab_size=len(text_tokenizer))
        with pytest.raises(ValueError, match="rows show images, and this server takes none"):
            teacher.score(batch, 1.0)
        status, answer = post(url, "/v1/completions", {"prompt": [[1, 2, 3]], "max_tokens": 1, "prompt_logprobs": 1,
                                                       "distill_images": [["aGVsbG8="]]})
        assert status == 400 and "text-only model" in answer["error"]["message"]
