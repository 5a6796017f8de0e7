"""Configuration of server and cache teachers: every mistake is caught before anything loads."""

from __future__ import annotations

import pytest

from distill.config import DistillConfig
from distill.locations import location_of, parse_routes
from distill.methods import get_method

SERVER = dict(method="gkd", teacher_url="http://127.0.0.1:8000", student="s", seq_kd=False)
OFFLINE = dict(method="gkd", teacher_cache="/c", student="s", seq_kd=False, lmbda=0.0, lmbda_schedule="constant",
               eval_before_after=False)


def teacher_location(config: DistillConfig) -> str:
    return location_of(config, get_method(config.method)).name


def test_valid_remote_configs():
    assert teacher_location(DistillConfig(**SERVER).validate()) == "server"
    assert teacher_location(DistillConfig(**OFFLINE).validate()) == "cache"
    assert teacher_location(DistillConfig(method="on_policy", teacher_url="http://h:1", student="s").validate()) == "server"
    assert teacher_location(DistillConfig().validate()) == "model"


@pytest.mark.parametrize("retired, says", [("server", "teacher_url: URL"), ("offline", "teacher_cache: DIR")])
def test_retired_methods_say_what_to_write(retired, says):
    with pytest.raises(ValueError, match=f"method '{retired}' is gone.*{says}"):
        DistillConfig(method=retired).validate()


@pytest.mark.parametrize("values, message", [
    ({**SERVER, "seq_kd": True}, "seq_kd: true needs a teacher that samples"),
    ({**OFFLINE, "lmbda": 0.5}, "set lmbda: 0, lmbda_schedule: constant"),
    ({"method": "on_policy", "teacher_cache": "/c", "student": "s", "eval_before_after": False}, "teacher_cache scores only the completions it holds"),
    ({**OFFLINE, "eval_before_after": True}, "a teacher cache cannot score new samples"),
    ({**SERVER, "teacher": "other-model"}, "teacher is only read with a teacher model"),
    ({**SERVER, "teacher_cache": "/c"}, "a run has one teacher location"),
    ({**SERVER, "method": "gold"}, "method gold's objective takes \\['aligned'\\] teacher signals"),
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
