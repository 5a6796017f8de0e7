"""Configuration of server and offline teachers: every mistake is caught before anything loads."""

from __future__ import annotations

import pytest

from distill.config import DistillConfig, parse_routes

SERVER = dict(method="server", teacher_url="http://127.0.0.1:8000", student="s", seq_kd=False)
OFFLINE = dict(method="offline", teacher_cache="/c", student="s", seq_kd=False, lmbda=0.0, lmbda_schedule="constant",
               eval_before_after=False)


def test_valid_remote_configs():
    assert DistillConfig(**SERVER).validate().remote_teacher() == "server"
    assert DistillConfig(**OFFLINE).validate().remote_teacher() == "offline"
    assert DistillConfig(method="gkd", teacher_url="http://h:1", student="s", seq_kd=False).validate().remote_teacher() == "server"


@pytest.mark.parametrize("values, message", [
    ({**SERVER, "teacher_url": None}, "method server needs teacher_url"),
    ({**OFFLINE, "teacher_cache": None}, "method offline needs teacher_cache"),
    ({**SERVER, "seq_kd": True}, "seq_kd: true needs a teacher that samples"),
    ({**OFFLINE, "lmbda": 0.5}, "set lmbda: 0 and lmbda_schedule: constant"),
    ({**OFFLINE, "eval_before_after": True}, "offline run has no teacher to score new samples"),
    ({**SERVER, "teacher": "other-model"}, "teacher is only read with a local teacher"),
    ({"method": "gkd", "teacher_cache": "/c"}, "teacher_cache is read by method offline only"),
    ({"teacher_concurrency": 8}, "teacher_concurrency is only read with teacher_url"),
    ({"teacher_logprobs": 5}, "teacher_logprobs is only read with a server or cache teacher"),
    ({**SERVER, "teacher_concurrency": 0}, "teacher_concurrency must be >= 1"),
    ({**SERVER, "teacher_url": "a=http://x:1,a=http://y:2"}, "appears twice"),
])
def test_invalid_remote_configs_name_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        DistillConfig(**values).validate()


def test_routes_parse_single_and_several_targets():
    assert parse_routes("http://h:8000/v1", "teacher_url") == {"": "http://h:8000/v1"}
    assert parse_routes("math=http://a:1, code=http://b:2", "teacher_url") == {"math": "http://a:1", "code": "http://b:2"}
    assert DistillConfig.from_dict({**SERVER, "teacher_url": {"a": "http://x:1", "b": "http://y:2"}}).teacher_url == "a=http://x:1,b=http://y:2"
    with pytest.raises(ValueError, match="expected one target"):
        parse_routes("a=http://x:1,http://y:2", "teacher_url")
