"""Model sources, layer selection for the student, vocabulary and EOS helpers."""

import pytest
import torch

from distill.models import (
    eos_token_ids,
    logit_head,
    make_student,
    resolve_model_source,
    select_layer_indices,
    shared_vocab_size,
)
from tests.conftest import tiny_lm


def test_student_init_layer_selection():
    assert select_layer_indices(30, "drop_every:3") == [i for i in range(30) if i % 3 != 2]
    assert len(select_layer_indices(30, "drop_every:3")) == 20
    assert select_layer_indices(30, "keep_every:3") == list(range(0, 30, 3))
    assert select_layer_indices(30, "first:4") == [0, 1, 2, 3]
    assert select_layer_indices(6, "layers:5,0,2") == [0, 2, 5]
    assert select_layer_indices(4, "all") == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="does not exist"):
        select_layer_indices(4, "layers:0,9")


def test_make_student_copies_the_kept_layers_and_fixes_indices(tokenizer):
    teacher = tiny_lm(len(tokenizer), layers=6, seed=7, eos_token_id=tokenizer.eos_token_id)
    student = make_student(teacher, "layers:1,4")
    assert student.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 6
    layers = student.get_decoder().layers
    assert [layer.self_attn.layer_idx for layer in layers] == [0, 1]
    assert torch.equal(layers[1].mlp.up_proj.weight, teacher.get_decoder().layers[4].mlp.up_proj.weight)
    assert layers[1].mlp.up_proj.weight.data_ptr() != teacher.get_decoder().layers[4].mlp.up_proj.weight.data_ptr()
    # Generation with the KV cache works on the renumbered layers: each step's logits are those of a full forward
    # pass without a cache over the sequence so far.
    ids = torch.tensor([[5, 6, 7]])
    out = student.generate(input_ids=ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=tokenizer.eos_token_id,
                           use_cache=True, output_logits=True, return_dict_in_generate=True)
    assert out.sequences.shape == (1, 7) and len(out.logits) == 4
    with torch.no_grad():
        full = student(out.sequences, use_cache=False).logits[0, 2:-1]
    torch.testing.assert_close(torch.stack(out.logits, 1)[0], full, rtol=1e-4, atol=1e-5)
    assert torch.equal(out.sequences[0, 3:], full.argmax(-1))


def test_model_sources_fail_early_on_missing_paths(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_source(str(tmp_path / "missing.gguf"), "teacher")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_source("./no/such/dir", "student")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        resolve_model_source(str(tmp_path / "empty"), "teacher")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    source = resolve_model_source(str(gguf), "teacher")
    assert source.path == str(tmp_path) and source.gguf_file == "m.gguf"


def test_a_hub_id_resolves_when_cached_and_fails_at_once_when_not(monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="'no-org/no-model' is not a local path and is not in the hub cache, and HF_HUB_OFFLINE"):
        resolve_model_source("no-org/no-model", "teacher")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *args, **kwargs: "/cache/snapshot")
    assert resolve_model_source("org/model", "teacher").path == "org/model"


def test_packaged_default_teacher_is_found():
    source = resolve_model_source("smollm2-135m-instruct", "teacher")
    assert source.gguf_file.endswith(".gguf")


def test_eos_ids_merge_tokenizer_and_generation_config(tokenizer):
    model = tiny_lm(len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, 0]
    assert eos_token_ids(tokenizer, model) == [tokenizer.eos_token_id, 0]


def test_logit_head_reads_scale_and_softcap(tokenizer):
    model = tiny_lm(len(tokenizer), pad_rows=5)
    model.config.final_logit_softcapping = 30.0
    model.config.logits_scaling = 4.0
    head = logit_head(model, len(tokenizer))
    assert head.weight.shape[0] == len(tokenizer) and head.softcap == 30.0 and head.scale == 0.25
    teacher = tiny_lm(len(tokenizer), pad_rows=64)
    assert shared_vocab_size(tokenizer, tokenizer, model, teacher) == len(tokenizer)


def test_logit_head_slices_only_padded_rows(tokenizer):
    """An unpadded head is used as it is: slicing all rows would cost backward a zero-filled full-size copy."""
    model = tiny_lm(len(tokenizer))
    assert logit_head(model, len(tokenizer)).weight is model.lm_head.weight
    padded = tiny_lm(len(tokenizer), pad_rows=3)
    weight = logit_head(padded, len(tokenizer)).weight
    assert weight.shape[0] == len(tokenizer) and weight.data_ptr() == padded.lm_head.weight.data_ptr()
