"""The settings of the teacher locations outside the process (`distill.locations.server`, `.cache`), composed into
`DistillConfig` while the locations are registered and read back typed (`ServerFields.of(config)`). A leaf, so that
the teachers these locations build (`distill.teachers.build`) read them without importing a location."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting


@dataclass
class RemoteTeacherFields(PartFields):
    """What a teacher outside the process gives per completion token (a server's or a cache's settings both)."""

    teacher_logprobs: int = setting(20, "K: top log-probs per position asked from the teacher server (vLLM's "
                                     "--max-logprobs must allow it). The loss uses these, the completion token, and a "
                                     "tail bucket for the rest of the mass.")
    teacher_payload: str = setting("topk", "What a teacher server or cache gives per completion token: 'topk' (K "
                                   "log-probs, the completion token's and a tail bucket: a lower bound of the divergence; "
                                   "any vLLM server) or 'hidden' (the teacher's final hidden states, H numbers, made into the "
                                   "exact full distribution by the teacher's lm_head held on the trainer: `distill "
                                   "serve-teacher`, or a cache written with `cache-teacher --payload hidden`).")


@dataclass
class ServerFields(PartFields):
    """The server location's own settings."""

    teacher_url: str | None = setting(None, "Teacher server speaking vLLM's OpenAI-compatible /v1/completions (a stock "
                                      "`vllm serve` or `distill serve-teacher`), e.g. http://127.0.0.1:8000. Several "
                                      "teachers: 'id=url,id=url', routed by the dataset's `teacher_id` column. Any method whose objective "
                                      "takes sparse log-probs (listed below); no teacher model is loaded here.")
    teacher_model_name: str | None = setting(None, "The `model` name to send to the teacher server (None: the first model "
                                             "the server lists at /v1/models).")
    teacher_concurrency: int = setting(4, "Requests in flight to the teacher server at once.")
    teacher_request_size: int = setting(8, "Completions per request to the teacher server.")
    teacher_timeout: float = setting(60.0, "Seconds to wait for one teacher-server answer before retrying.")
    teacher_retries: int = setting(3, "Retries of a failed teacher-server request (connection errors, timeouts, 5xx, "
                                   "malformed answers), with exponential backoff from 0.5 s; then the run checkpoints "
                                   "and stops with the error.")
    teacher_head: str | None = setting(None, "teacher_payload hidden, a server: a directory of the served teacher's files "
                                       "whose safetensors hold its lm_head (read without loading the model). None: the server "
                                       "sends its head once at start. Either is checked against the server's fingerprint.")
    teacher_hidden_dtype: str = setting("float32", "teacher_payload hidden, a server: the hidden states' dtype on the wire, "
                                        "'float32' (exact) or 'bfloat16' (half the bytes).")


@dataclass
class CacheFields(PartFields):
    """The cache location's own settings."""

    teacher_cache: str | None = setting(None, "Directory written by `distill cache-teacher`: the run trains on its completions and "
                                        "sparse log-probs (so it needs lmbda 0, lmbda_schedule constant, seq_kd false); several: "
                                        "'id=dir,id=dir', routed by the dataset's `teacher_id` column.")
