"""Hostile inputs to `distill serve-teacher` and `distill cache-teacher`: each case is one bad request or
invocation and the exact outcome (HTTP status and a piece of the message; files kept or removed).

The server is the real FastAPI app in-process (uvicorn on a thread, tiny model: vocabulary 320, context 512)
with small body and token limits so the over-limit requests stay small; prompt_logprobs keeps its default cap.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from distill.serving.app import build_app
from distill.serving.limits import DEFAULT_MAX_LOGPROBS, ServerLimits
from distill.serving.scoring import ScoringEngine
from tests.teachers.servers import post, serve_app

VOCAB, CONTEXT = 320, 512  # the conftest tiny teacher: len(tokenizer), max_position_embeddings
LIMITS = ServerLimits(max_request_bytes=20_000, max_prompt_tokens=600)  # max_logprobs: the default, 20


@pytest.fixture(scope="module")
def server(model_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dirs["teacher"], dtype=torch.float32)
    engine = ScoringEngine(model, AutoTokenizer.from_pretrained(model_dirs["teacher"]), torch.device("cpu"))
    assert engine.vocab_size == VOCAB and engine.max_model_len == CONTEXT
    with serve_app(build_app(engine, "teacher", max_batch_tokens=256, limits=LIMITS)) as url:
        yield url


def completion(**fields) -> dict:
    return {"prompt": [[5, 6, 7]], "max_tokens": 1, "prompt_logprobs": 4, **fields}


# (request body, expected status, a piece of the error message)
COMPLETION_CASES = {
    "logprobs 10^9": (completion(prompt_logprobs=10**9), 400, "greater than max allowed: 20"),
    "logprobs cap + 1": (completion(prompt_logprobs=DEFAULT_MAX_LOGPROBS + 1), 400, "start serve-teacher with --max-logprobs"),
    "logprobs -1": (completion(prompt_logprobs=-1), 400, "prompt_logprobs must be an integer >= 0"),
    "logprobs 1.5": (completion(prompt_logprobs=1.5), 400, "prompt_logprobs must be an integer >= 0"),
    "logprobs '5'": (completion(prompt_logprobs="5"), 400, "prompt_logprobs must be an integer >= 0"),
    "logprobs true": (completion(prompt_logprobs=True), 400, "prompt_logprobs must be an integer >= 0"),
    "logprobs missing": ({"prompt": [[5, 6]], "max_tokens": 1}, 400, "prompt_logprobs must be an integer >= 0"),
    "too many prompt tokens": (completion(prompt=[[5] * 300, [6] * 301]), 400, ("601 prompt tokens, more than this server's "
                               "limit of 600 per request: split it into smaller requests, or start serve-teacher with --max-prompt-tokens")),
    "prompt at the context": (completion(prompt=[7] * CONTEXT), 400, ("maximum context length is 512 tokens. However, you "
                              "requested 513 tokens (512 in the prompt, 1 in the completion)")),
    "empty prompt list": (completion(prompt=[]), 400, "prompt must be text, a list of token ids"),
    "empty inner prompt": (completion(prompt=[[5, 6], []]), 400, "non-empty list of token ids in [0, 320)"),
    "id = vocabulary size": (completion(prompt=[5, VOCAB]), 400, "token ids in [0, 320)"),
    "negative id": (completion(prompt=[[5, -1]]), 400, "token ids in [0, 320)"),
    "huge id": (completion(prompt=[[5, 10**30]]), 400, "token ids in [0, 320)"),
    "float ids": (completion(prompt=[[5.0, 6.0]]), 400, "token ids in [0, 320)"),
    "bool ids": (completion(prompt=[[True, False]]), 400, "token ids in [0, 320)"),
    "prompt is an object": (completion(prompt={"ids": [5]}), 400, "prompt must be text, a list of token ids"),
    "prompt is a number": (completion(prompt=5), 400, "prompt must be text, a list of token ids"),
    "prompt mixes ids and text": (completion(prompt=[[5, 6], "text"]), 400, "prompt must be text, a list of token ids"),
    "text with a lone surrogate": (b'{"prompt": "a\\ud800b", "max_tokens": 1, "prompt_logprobs": 2}', 400, "not valid Unicode"),
    "texts, one with a lone surrogate": (b'{"prompt": ["ok", "\\udfff"], "max_tokens": 1, "prompt_logprobs": 2}', 400,
                                         "not valid Unicode"),
    "unknown model": (completion(model="gpt-4"), 400, "model 'gpt-4' is not served here; this server serves 'teacher'"),
    "logprob temperature 0": (completion(prompt_logprobs_temperature=0), 400, "prompt_logprobs_temperature must be a finite number > 0"),
    "logprob temperature -1": (completion(prompt_logprobs_temperature=-1.0), 400, "finite number > 0"),
    "logprob temperature NaN": (completion(prompt_logprobs_temperature=math.nan), 400, "finite number > 0, got nan"),
    "logprob temperature inf": (completion(prompt_logprobs_temperature=math.inf), 400, "finite number > 0, got inf"),
    "logprob temperature text": (completion(prompt_logprobs_temperature="2"), 400, "finite number > 0"),
    "temperature -1": (completion(temperature=-1), 400, "temperature must be a finite number >= 0"),
    "temperature NaN": (completion(temperature=math.nan), 400, "temperature must be a finite number >= 0"),
    "max_tokens 2": (completion(max_tokens=2), 400, "set max_tokens to 1"),
    "max_tokens true": (completion(max_tokens=True), 400, "set max_tokens to 1"),
    "stream": (completion(stream=True), 400, "stream, echo and n > 1 are not supported"),
    "body is a JSON list": ([completion()], 400, "the body must be a JSON object, not a JSON array"),
    "body is a JSON string": ("prompt", 400, "the body must be a JSON object, not a JSON string"),
    "malformed JSON": (b'{"prompt": [1, 2', 400, "the body is not valid JSON"),
    "not UTF-8": (b'{"prompt": "\xff\xfe"}', 400, "the body is not valid JSON"),
    "nested too deep": (b"[" * 15_000, 400, "the body is not valid JSON"),
    "body over the byte limit": (completion(prompt=[[5] * 400] * 20), 413, ("more than this server's limit of 20000 bytes: "
                                 "send smaller requests, or start serve-teacher with --max-request-bytes")),
}


@pytest.mark.parametrize("case", list(COMPLETION_CASES))
def test_hostile_completion_request_is_refused_with_the_reason(server, case):
    body, status, message = COMPLETION_CASES[case]
    got, answer = post(server, "/v1/completions", body)
    assert got == status, answer
    assert answer["error"]["code"] == status and message in answer["error"]["message"]


def test_a_body_streamed_without_content_length_is_cut_at_the_byte_limit(server):
    """Chunked transfer: no Content-Length to judge by, so the bytes are counted as they arrive."""
    chunks = iter([b'{"prompt": [' + b"5, " * 3000, b"5" * 20_000, b"]}"])
    status, answer = post(server, "/v1/completions", chunks)
    assert status == 413 and "over this server's limit of 20000 bytes" in answer["error"]["message"]
    assert "--max-request-bytes" in answer["error"]["message"]


@pytest.mark.parametrize("k", [0, DEFAULT_MAX_LOGPROBS])
def test_prompt_logprobs_up_to_the_cap_are_answered(server, k):
    status, answer = post(server, "/v1/completions", completion(prompt=[[5, 6, 7], [8, 9]], prompt_logprobs=k))
    assert status == 200, answer
    entries = answer["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and all(max(k, 1) <= len(e) <= max(k, 1) + 1 for e in entries[1:])


def test_prompt_one_short_of_the_context_and_a_request_over_the_batch_budget_are_answered(server):
    """511 tokens + the scored next one = the context; 3 x 200 padded tokens > max_batch_tokens 256 is split."""
    status, answer = post(server, "/v1/completions", completion(prompt=[7] * (CONTEXT - 1)))
    assert status == 200 and len(answer["choices"][0]["prompt_logprobs"]) == CONTEXT - 1
    status, answer = post(server, "/v1/completions", completion(prompt=[[5] * 200, [6] * 200, [7] * 200]))
    assert status == 200 and [len(c["prompt_logprobs"]) for c in answer["choices"]] == [200, 200, 200]


TOKENIZE_CASES = {
    "malformed JSON": (b'{"prompt": ', 400, "the body is not valid JSON"),
    "JSON list": (["hello"], 400, "the body must be a JSON object, not a JSON array"),
    "JSON null": (None, 400, "the body must be a JSON object, not a JSON null"),
    "prompt is a number": ({"prompt": 5}, 400, "prompt must be text"),
    "prompt is token ids": ({"prompt": [1, 2]}, 400, "prompt must be text"),
    "lone surrogate": (b'{"prompt": "\\ud83d"}', 400, "not valid Unicode"),
    "add_special_tokens text": ({"prompt": "hi", "add_special_tokens": "yes"}, 400, "add_special_tokens must be true or false"),
    "body over the byte limit": ({"prompt": "x" * 30_000}, 413, "--max-request-bytes"),
}


@pytest.mark.parametrize("case", list(TOKENIZE_CASES))
def test_hostile_tokenize_request_is_refused_with_the_reason(server, case):
    body, status, message = TOKENIZE_CASES[case]
    got, answer = post(server, "/tokenize", body)
    assert got == status, answer
    assert message in answer["error"]["message"]


def test_server_still_answers_after_the_hostile_requests(server):
    status, answer = post(server, "/tokenize", {"prompt": "hello"})
    assert status == 200 and answer["count"] > 0 and answer["max_model_len"] == CONTEXT


@pytest.mark.parametrize("field, value", [("max_logprobs", 0), ("max_logprobs", -2), ("max_request_bytes", -1),
                                          ("max_prompt_tokens", 1.5), ("max_prompt_tokens", True)])
def test_nonsensical_limits_fail_at_start_up_naming_the_option(field, value):
    with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} must be an integer >= 1"):
        ServerLimits(**{field: value})


def test_max_logprobs_minus_one_lifts_the_cap_as_in_vllm(tokenizer):
    from distill.serving.limits import parse_completion_request

    body = completion(prompt_logprobs=10**9)
    _, k, _ = parse_completion_request(body, tokenizer, VOCAB, ServerLimits(max_logprobs=-1))
    assert k == VOCAB  # everything there is, and no more


# ---------------------------------------------------------------- cache-teacher --out


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    from tests.conftest import chat_rows

    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in chat_rows(4)))
    return path


def _job(model_dirs, rows_file, out, **overrides):
    from distill.commands.cache_teacher import CacheJob

    values = {"teacher": str(model_dirs["teacher"]), "teacher_url": None, "tokenizer": None, "dataset": str(rows_file),
              "split": "train", "top_k": 4, "out": str(out), "max_new_tokens": 8, "max_prompt_length": 32, "shard_size": 2,
              "batch_size": 2, "progress": False, "device": "cpu"}
    return CacheJob(**{**values, **overrides})


@pytest.fixture(scope="module")
def built_cache(model_dirs, rows_file, tmp_path_factory):
    from distill.commands.cache_teacher import run_cache_teacher

    out = tmp_path_factory.mktemp("built") / "cache"
    run_cache_teacher(_job(model_dirs, rows_file, out))
    return out


def _copy(built_cache, tmp_path):
    import shutil

    return shutil.copytree(built_cache, tmp_path / "cache")


def _manifest_deleted(built_cache, tmp_path):
    out = _copy(built_cache, tmp_path)
    (out / "manifest.json").unlink()
    (out / ".shard-00007.safetensors.tmp").write_bytes(b"half a shard")  # an interrupted write's leftover
    (out / "notes.txt").write_text("mine")
    (out / "shard-notes.safetensors.md").write_text("mine too")  # close to the shard pattern, not in it
    (out / "sub").mkdir()
    (out / "sub" / "shard-00000.safetensors").write_bytes((out / "shard-00000.safetensors").read_bytes())  # not at the top
    return out


USER_FILES = {"notes.txt": "mine", "shard-notes.safetensors.md": "mine too"}


def test_cache_without_manifest_is_refused_with_the_overwrite_hint_and_left_alone(built_cache, model_dirs, rows_file, tmp_path):
    from distill.commands.cache_teacher import run_cache_teacher

    out = _manifest_deleted(built_cache, tmp_path)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ValueError, match=r"not a teacher cache: it holds 3 cache file\(s\) but no manifest.json.*--overwrite.*"
                                         r"deletes only the cache's own files.*never other files"):
        run_cache_teacher(_job(model_dirs, rows_file, out))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_overwrite_deletes_only_cache_files_and_rebuilds(built_cache, model_dirs, rows_file, tmp_path):
    from distill.commands.cache_teacher import run_cache_teacher
    from distill.teachers.cache import TeacherCache

    out = _manifest_deleted(built_cache, tmp_path)
    manifest = run_cache_teacher(_job(model_dirs, rows_file, out, overwrite=True))
    assert manifest["complete"] and TeacherCache(out).get(3).tokens.numel() > 0
    assert {n: (out / n).read_text() for n in USER_FILES} == USER_FILES
    assert (out / "sub" / "shard-00000.safetensors").is_file()  # a subdirectory is never looked into
    assert not (out / ".shard-00007.safetensors.tmp").exists()
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.safetensors", "shard-00001.safetensors",
                                                           "shard-notes.safetensors.md"]


@pytest.mark.parametrize("name, content", [("manifest.json", '{"my": "experiment"}'), ("manifest.json", "not json"),
                                           ("shard-00000.safetensors", "my own file, not a shard")])
def test_overwrite_refuses_a_user_file_named_like_a_cache_file_and_keeps_it(built_cache, model_dirs, rows_file, tmp_path,
                                                                           name, content):
    from distill.commands.cache_teacher import run_cache_teacher

    out = _copy(built_cache, tmp_path)
    (out / name).write_text(content)
    with pytest.raises(ValueError, match=f"holds {name}, named like the cache's files but not written by cache-teacher"):
        run_cache_teacher(_job(model_dirs, rows_file, out, overwrite=True))
    assert (out / name).read_text() == content and (out / "shard-00001.safetensors").is_file()


def test_overwrite_into_a_directory_of_user_files_keeps_them(model_dirs, rows_file, tmp_path):
    from distill.commands.cache_teacher import run_cache_teacher

    out = tmp_path / "mine"
    out.mkdir()
    (out / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="not a teacher cache; choose another directory, or pass --overwrite"):
        run_cache_teacher(_job(model_dirs, rows_file, out))
    run_cache_teacher(_job(model_dirs, rows_file, out, overwrite=True))
    assert (out / "data.csv").read_text() == "a,b\n" and (out / "manifest.json").is_file()


def test_other_settings_name_overwrite_which_then_rebuilds(built_cache, model_dirs, rows_file, tmp_path):
    from distill.commands.cache_teacher import run_cache_teacher

    out = _copy(built_cache, tmp_path)
    (out / "README").write_text("keep")
    with pytest.raises(ValueError, match="other settings.*top_k.*--overwrite"):
        run_cache_teacher(_job(model_dirs, rows_file, out, top_k=5))
    assert run_cache_teacher(_job(model_dirs, rows_file, out, top_k=5, overwrite=True))["top_k"] == 5
    assert (out / "README").read_text() == "keep"


def test_out_that_is_a_file_is_refused_and_kept(model_dirs, rows_file, tmp_path, capsys):
    from distill.cli import main

    out = tmp_path / "cache"
    out.write_text("a file")
    code = main(["cache-teacher", "--teacher", str(model_dirs["teacher"]), "--dataset", str(rows_file), "--top-k", "4",
                 "--out", str(out), "--overwrite", "--no-progress", "--device", "cpu"])
    assert code == 2 and "is a file, not a directory" in capsys.readouterr().err
    assert out.read_text() == "a file"


def test_cli_without_manifest_exits_2_with_the_hint(built_cache, model_dirs, rows_file, tmp_path, capsys):
    from distill.cli import main

    out = _manifest_deleted(built_cache, tmp_path)
    code = main(["cache-teacher", "--teacher", str(model_dirs["teacher"]), "--dataset", str(rows_file), "--top-k", "4",
                 "--out", str(out), "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "pass --overwrite to rebuild it" in err and "never other files" in err


def test_a_damaged_shard_the_manifest_lists_is_the_caches_own(tmp_path):
    from distill.teachers.cache import FORMAT, MANIFEST, VERSION, cache_files

    (tmp_path / MANIFEST).write_text(json.dumps({"format": FORMAT, "version": VERSION, "shards": [{"file": "shard-00000.safetensors"}]}))
    (tmp_path / "shard-00000.safetensors").write_bytes((900).to_bytes(8, "little") + b'{"topk_i')  # cut by a crash
    (tmp_path / "shard-00001.safetensors").write_bytes(b"a user's file, not listed")
    own, foreign = cache_files(tmp_path)
    assert [p.name for p in own] == [MANIFEST, "shard-00000.safetensors"]
    assert [p.name for p in foreign] == ["shard-00001.safetensors"]
