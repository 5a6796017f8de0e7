"""Offline teacher caches (`distill cache-teacher`, `teacher_cache`): the teacher's signal over a dataset's
completions, on disk. Three modules, one job each: `format` (what the files hold and which are the cache's),
`writer` (shards, head and manifest written atomically) and `reader` (`TeacherCache`: verified, served by id).
The names below are the cache's interface."""

from distill.teachers.cache.format import (
    FORMAT,
    HEAD_FILE,
    HIDDEN_ARRAYS,
    MANIFEST,
    ONLY_CACHE_FILES,
    SETTING_KEYS,
    SHARD_ARRAYS,
    VERSION,
    cache_files,
    dequantize_hidden,
    id_bytes_for,
    is_cache_head,
    is_cache_manifest,
    is_cache_shard,
    missing_manifest_advice,
    pack_ids,
    prompt_crc,
    quantize_hidden,
    sha256_file,
    shard_name,
    tokenizer_hash,
    unpack_ids,
)
from distill.teachers.cache.reader import CachedExample, CachedHidden, TeacherCache, read_manifest
from distill.teachers.cache.writer import HiddenShardRecords, ShardRecords, write_head, write_manifest, write_shard

__all__ = [
    "FORMAT", "HEAD_FILE", "HIDDEN_ARRAYS", "MANIFEST", "ONLY_CACHE_FILES", "SETTING_KEYS", "SHARD_ARRAYS", "VERSION",
    "CachedExample", "CachedHidden", "HiddenShardRecords", "ShardRecords", "TeacherCache", "cache_files",
    "dequantize_hidden", "id_bytes_for", "is_cache_head", "is_cache_manifest", "is_cache_shard", "missing_manifest_advice",
    "pack_ids", "prompt_crc", "quantize_hidden", "read_manifest", "sha256_file", "shard_name", "tokenizer_hash",
    "unpack_ids", "write_head", "write_manifest", "write_shard",
]
