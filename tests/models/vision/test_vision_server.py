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
from distill.teachers.hidden_client import HiddenStateServerTeacher
from distill.teachers.topk_client import ServerSettings, ServerTeacher
from tests.models.vision.models import save_qwen_vl, shape_image
from tests.teachers.servers import post, serve_app, serve_teacher


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
        encoded = encoder.row(example)
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


def test_an_offline_cache_of_a_vision_language_teacher_is_keyed_by_its_images(tmp_path, vl_teacher):
    import json

    from distill import DistillConfig
    from distill.cli import main
    from distill.teachers.cache import TeacherCache
    from distill.training.trainer import Distiller
    from tests.models.vision.test_vision_runs import write_shapes

    directory, _, _, _ = vl_teacher
    data = write_shapes(tmp_path / "data")
    for payload in ("topk", "hidden"):
        size = ["--top-k", "8"] if payload == "topk" else []
        assert main(["cache-teacher", "--teacher", str(directory), "--dataset", data, *size, "--payload", payload,
                     "--out", str(tmp_path / payload), "--max-prompt-length", "64", "--max-new-tokens", "6", "--no-progress", "--device", "cpu"]) == 0
    assert TeacherCache(tmp_path / "topk").top_k == 8
    # The hidden-state cache (float32) holds exactly the local teacher's states, images read.
    import datasets

    from distill.data import examples_from_dataset

    _, model, tokenizer, _ = vl_teacher
    examples = examples_from_dataset(datasets.load_dataset("json", data_files=data, split="train"), "dataset", tmp_path / "data")
    encoder = model_kind_of(model).encoder(tokenizer, 64, 6, [tokenizer.eos_token_id], model)
    cached = TeacherCache(tmp_path / "hidden")
    for example in examples[:3]:  # 1, 1 and 2 images
        encoded = encoder.row(example)
        batch = collate([Completion(encoded.prompt_ids, encoded.completion_ids, "dataset", extras=encoded.extras)], "dataset",
                        tokenizer.pad_token_id)
        entry = cached.get(example.index)
        assert entry.tokens.tolist() == encoded.completion_ids
        torch.testing.assert_close(entry.hidden.float(), _local_hidden(model, batch), atol=1e-5, rtol=0)

    def run(cache, out):
        payload = {"teacher_logprobs": 8} if cache.name == "topk" else {"teacher_payload": "hidden"}
        return Distiller(DistillConfig(method="gkd", teacher_cache=str(cache), student=str(directory), dataset=data, lmbda=0.0,
                                       lmbda_schedule="constant", seq_kd=False, eval_before_after=False, progress_bar=False,
                                       **payload, max_new_tokens=6, max_prompt_length=64, per_device_train_batch_size=2,
                                       gradient_accumulation_steps=1, max_steps=2, save_steps=0, output_dir=str(out)))

    for payload in ("topk", "hidden"):
        assert run(tmp_path / payload, tmp_path / f"run-{payload}").train()["steps"] == 2
    # Another picture of the same size: the same ids, another image digest: the cache refuses the row.
    shape_image("yellow", "triangle").save(tmp_path / "data" / "images" / "1-0.png")
    with pytest.raises(ValueError, match="dataset row 1 has another prompt than the one the cache scored .*other images"):
        run(tmp_path / "topk", tmp_path / "run-changed")
    assert json.loads((tmp_path / "topk" / "manifest.json").read_text())["complete"] is True
