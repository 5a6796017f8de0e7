"""FSDP (`fsdp: true`, torch's fully_shard) on 2 gloo CPU processes: the gradient of a step equals the
1-process gradient, kill + resume from a sharded checkpoint equals an uninterrupted run, the final model is one
save_pretrained directory, and generation/evaluation run on the gathered student."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from distill import DistillConfig
from tests.conftest import chat_rows, train_tiny_tokenizer
from tests.distributed import (
    accelerate_launch_distill,
    assert_same_gradients,
    capture_at_optimizer_step,
    run_in_processes,
)
from tests.helpers.training import make_distiller

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _gradient_of_step_zero(rank, world_size, out, method, fsdp, batch, **overrides):
    """One optimizer step's gradient (full tensors, captured before the update) and logged metrics."""
    torch.manual_seed(0)
    tokenizer = train_tiny_tokenizer()
    rows = chat_rows(8)
    for i, row in enumerate(rows):
        row["completion"] = " ".join(["word"] * (1 + 3 * i))  # unequal lengths across the two processes
    distiller = make_distiller(tokenizer, Path(out), rows=rows, method=method, max_grad_norm=0.0, fsdp=fsdp,
                               per_device_train_batch_size=batch, gradient_accumulation_steps=2, max_new_tokens=12,
                               **overrides)
    distiller.setup()
    captured = {}

    def capture():
        captured.update({n: _full(p.grad).detach().clone() for n, p in distiller.student_model.named_parameters()})

    capture_at_optimizer_step(distiller, capture)
    window = distiller._new_window()
    distiller.train_step(0, window, {}, log_step=True)
    return {"grads": captured, "metrics": window.reduce(), "sharded": type(distiller.state.wrapped).__name__}


@pytest.mark.slow
@pytest.mark.parametrize("method, overrides", [
    ("gkd", dict(lmbda=0.0)),  # dataset completions, forward KL
    # on-policy: the student samples with top_k 1, so the completions do not depend on the processes' RNG streams
    ("on_policy", dict(top_k=1, beta=0.5, seq_kd=DistillConfig.seq_kd, lmbda_schedule=DistillConfig.lmbda_schedule)),
    ("gkd", dict(lmbda=0.0, gradient_checkpointing=True)),  # layers recomputed in backward, inside FSDP units
], ids=["gkd", "on_policy", "gkd_checkpointing"])
def test_fsdp_gradient_equals_single_process(tmp_path, method, overrides):
    single = _gradient_of_step_zero(0, 1, str(tmp_path / "single"), method, False, 4, **overrides)
    ranks = run_in_processes(_gradient_of_step_zero, world_size=2,
                             args=(str(tmp_path / "fsdp"), method, True, 2), kwargs=overrides)
    assert ranks[0]["sharded"].startswith("FSDP")  # fully_shard swaps the class to FSDP<name>
    for rank in ranks:
        assert_same_gradients(rank["grads"], single["grads"])
    for key in ("loss", "completion_length", "grad_norm"):
        assert ranks[0]["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5), key
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


# ------------------------------------------------------------------------------------- kill and resume --
def _fsdp_config(out: str, **overrides) -> dict:
    return dict(output_dir=out, fsdp=True, lmbda=0.5, max_steps=4, save_steps=2, save_total_limit=5, max_grad_norm=1.0,
                per_device_train_batch_size=2, gradient_accumulation_steps=2, max_new_tokens=8, **overrides)


def _final_state(distiller) -> dict:
    """The trained student's full weights and full optimizer state (collective; full on every process)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optimizer = get_state_dict(distiller.state.wrapped, distiller.state.optimizer.optimizer,
                                      options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
    flat = {f"model.{k}": _full(v).clone() for k, v in model.items()}
    for fqn, state in optimizer["state"].items():
        flat.update({f"optimizer.{fqn}.{k}": _full(v).clone() for k, v in state.items()})
    return flat


def _uninterrupted(rank, world_size, out):
    torch.manual_seed(0)
    distiller = make_distiller(train_tiny_tokenizer(), Path(out), rows=chat_rows(16), **_fsdp_config(out))
    distiller.train()
    return _final_state(distiller)


def _killed_after_checkpoint(rank, world_size, out):
    """Steps 0-1 and the step-2 checkpoint, then the process dies: no final model, no lock release."""
    torch.manual_seed(0)
    distiller = make_distiller(train_tiny_tokenizer(), Path(out), rows=chat_rows(16), **_fsdp_config(out))
    distiller.setup()
    for step in range(2):
        distiller._train_step_or_checkpoint(step, distiller._new_window(), {})
    distiller.save_checkpoint(2)
    distiller.train_step(2, distiller._new_window(), {}, log_step=False)  # lost with the process
    import torch.distributed as dist

    dist.barrier()
    os._exit(0)


def _killed_at_step_zero(rank, world_size, out):
    """A step-0 checkpoint (what a first step that fails writes): the optimizer has no state yet."""
    torch.manual_seed(0)
    distiller = make_distiller(train_tiny_tokenizer(), Path(out), rows=chat_rows(16), **_fsdp_config(out))
    distiller.setup()
    distiller.save_checkpoint(0)
    assert not distiller.state.optimizer.optimizer.state  # saving it did not step it
    import torch.distributed as dist

    dist.barrier()
    os._exit(0)


def _resumed(rank, world_size, out):
    import datasets

    from distill.training.trainer import Distiller
    from tests.conftest import tiny_lm

    tokenizer = train_tiny_tokenizer()
    config = DistillConfig.from_dict({**_config_fields(out)})
    distiller = Distiller(config, student=tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id),
                          teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id),
                          tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)), resume=True)
    distiller.train()
    return _final_state(distiller)


def _config_fields(out: str) -> dict:
    from tests.helpers.training import FAST

    return {**FAST, **_fsdp_config(out)}


@pytest.mark.slow
def test_fsdp_kill_and_resume_equals_uninterrupted_run(tmp_path):
    from transformers import AutoModelForCausalLM

    whole = run_in_processes(_uninterrupted, args=(str(tmp_path / "whole"),))
    killed = tmp_path / "killed"
    with pytest.raises(Exception):  # the workers leave with os._exit before writing a result
        run_in_processes(_killed_after_checkpoint, args=(str(killed),))
    step2 = killed / "checkpoints" / "step-000002"
    assert sorted(p.name for p in (step2 / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (step2 / "student").exists() and not (step2 / "optimizer.pt").exists()
    assert (killed / "run.lock").is_file()  # the killed run's lock: resuming takes it over
    tampered = tmp_path / "tampered"
    shutil.copytree(killed, tampered)
    resumed = run_in_processes(_resumed, args=(str(killed),))
    at_zero = tmp_path / "at_zero"
    with pytest.raises(Exception):
        run_in_processes(_killed_at_step_zero, args=(str(at_zero),))
    resumed_from_zero = run_in_processes(_resumed, args=(str(at_zero),))
    assert whole[0].keys() == resumed[0].keys() and any(k.startswith("optimizer.") for k in whole[0])
    for name, value in whole[0].items():
        assert torch.equal(resumed[0][name], value), name
        assert torch.equal(resumed_from_zero[0][name], value), name  # AdamW's step count included
        assert torch.equal(whole[1][name], value), name  # every process holds the same full state
    # The final model: one save_pretrained directory plain transformers loads, equal to the trained weights.
    for run in (tmp_path / "whole", killed):
        model = AutoModelForCausalLM.from_pretrained(run / "model")
        assert not any(type(m).__name__.startswith("FSDP") for m in model.modules())
        for name, value in model.state_dict().items():
            assert torch.equal(value, whole[0][f"model.student.{name}"]), name
    assert (killed / "model" / "README.md").is_file()

    # A non-tensor value of the shards (the optimizer's learning rate) replaced by a pickle that runs a command:
    # DCP itself would unpickle it in full; distill reads it weights-only and refuses.
    marker = tmp_path / "ran"
    _point_entry_at(tampered / "checkpoints" / "step-000002" / "sharded", "optimizer.param_groups.0.lr", _RunsCommand(f"touch {marker}"))
    with pytest.raises(Exception, match="could not be read: it is damaged, or holds objects other than tensors"):
        run_in_processes(_resumed, args=(str(tampered),))
    assert not marker.exists()


class _RunsCommand:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _point_entry_at(sharded: Path, fqn: str, value) -> None:
    """Rewrite a DCP checkpoint so that the bytes entry `fqn` reads `value` (torch.save'd into a new file)."""
    import io

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    buffer = io.BytesIO()
    torch.save(value, buffer)
    (sharded / "extra.distcp").write_bytes(buffer.getvalue())
    metadata = pickle.loads((sharded / ".metadata").read_bytes())  # the test's own file: trusted here
    keys = [index for index in metadata.storage_data if index.fqn == fqn]
    assert keys, sorted({index.fqn for index in metadata.storage_data})[:5]
    for index in keys:
        metadata.storage_data[index] = _StorageInfo("extra.distcp", 0, len(buffer.getvalue()))
    (sharded / ".metadata").write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize("module, name", [("os", "system"), ("torch.distributed.checkpoint.filesystem", "os.system"),
                                          ("torch.distributed.checkpoint.metadata", "torch.load")],
                         ids=["plain", "dotted_through_an_allowed_module", "other_name_of_an_allowed_module"])
def test_fsdp_checkpoint_metadata_that_names_other_objects_is_refused(tmp_path, module, name):
    from distill.models.sharding import check_metadata

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    marker = tmp_path / "ran"
    (sharded / ".metadata").write_bytes(b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"(X" + len(f"touch {marker}").to_bytes(4, "little")
                                        + f"touch {marker}".encode() + b"tR.")
    with pytest.raises(ValueError, match="holds objects other than a checkpoint's metadata"):
        check_metadata(sharded)
    assert not marker.exists()
    with pytest.raises(ValueError, match="no .metadata"):
        check_metadata(tmp_path)


def test_fsdp_refusals(tmp_path):
    with pytest.raises(ValueError, match="fsdp: true with use_peft"):
        DistillConfig(output_dir=str(tmp_path), fsdp=True, use_peft=True).validate()
    with pytest.raises(ValueError, match="fsdp: true with dtype float16 is not supported.*use dtype bfloat16"):
        DistillConfig(output_dir=str(tmp_path), fsdp=True, dtype="float16").validate()
    tokenizer = train_tiny_tokenizer()
    from tests.methods.test_sdft import distiller as sdft_distiller

    with pytest.raises(ValueError, match="self-teacher is not supported"):
        sdft_distiller(tokenizer, tmp_path, fsdp=True)
    with pytest.raises(ValueError, match="fsdp: true shards over several processes"):
        make_distiller(tokenizer, tmp_path, fsdp=True)


def _evaluated(rank, world_size, out, fsdp):
    """A 1-step run with the before/after evaluation (main process only; under FSDP on the gathered student)."""
    torch.manual_seed(0)
    distiller = make_distiller(train_tiny_tokenizer(), Path(out), rows=chat_rows(16), eval_dataset=_eval_dataset(),
                               fsdp=fsdp, max_steps=1, eval_before_after=True, eval_max_new_tokens=6, eval_batch_size=4,
                               lmbda=0.0)
    return distiller.train()["eval"]


def _eval_dataset():
    import datasets

    return datasets.Dataset.from_list(chat_rows(4, seed=3))


def test_fsdp_evaluation_runs_on_the_gathered_student(tmp_path):
    single = _evaluated(0, 1, str(tmp_path / "single"), False)
    ranks = run_in_processes(_evaluated, args=(str(tmp_path / "fsdp"), True))
    assert ranks[1] is None  # the report is the main process's
    before = {k: v for k, v in ranks[0].items() if k.startswith("before")}
    assert before and before == {k: v for k, v in single.items() if k.startswith("before")}
    assert all(torch.isfinite(torch.tensor(v)) for v in ranks[0].values() if isinstance(v, float))


def _all_gathers_per_unit(rank, world_size, out):
    """All-gathers per FSDP unit in one optimizer step of 2 micro-batches whose loss runs in 4+ chunks each."""
    from collections import Counter

    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    counts = Counter()
    unshard = FSDPParamGroup.unshard

    def counted(self, *args, **kwargs):
        if not self.is_unsharded and self._all_gather_result is None:  # this call communicates
            counts[self._module_fqn or "root"] += 1
        return unshard(self, *args, **kwargs)

    FSDPParamGroup.unshard = counted
    torch.manual_seed(0)
    distiller = make_distiller(train_tiny_tokenizer(), Path(out), rows=chat_rows(16), fsdp=True, lmbda=0.0,
                               loss_chunk_size=4, max_new_tokens=12)
    distiller.setup()
    distiller.setup()  # a second setup (allowed before train) reuses the sharded student
    distiller.train_step(0, distiller._new_window(), {}, log_step=False)
    return dict(counts)


def test_fsdp_gathers_the_lm_head_once_per_micro_batch(tmp_path):
    counts = run_in_processes(_all_gathers_per_unit, args=(str(tmp_path / "run"),))[0]
    # The root unit (embeddings, tied lm_head, final norm) is gathered once per micro-batch: in the root's
    # forward, kept through backward and every loss chunk. Each decoder layer: once in forward, once in backward.
    assert counts.pop("root") == 2, counts
    assert sorted(counts) == ["student.model.layers.0", "student.model.layers.1"]
    assert set(counts.values()) == {4}, counts


def test_accelerate_launch_with_fsdp(tmp_path, model_dirs):
    """The command line under `accelerate launch`: sharded checkpoints, the evaluation, one final model."""
    import json

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))
    run = tmp_path / "run"
    result = accelerate_launch_distill([
        "train", "--fsdp", "true", "--teacher", str(model_dirs["teacher"]), "--student", str(model_dirs["student"]),
        "--dataset", str(data), "--eval_dataset", str(data), "--eval_split", "train", "--eval_max_prompts", "4",
        "--eval_max_new_tokens", "6", "--output_dir", str(run), "--max_steps", "2", "--logging_steps", "1",
        "--lmbda", "0.5", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
        "--max_new_tokens", "6", "--progress_bar", "false", "--save_steps", "1",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = run / "checkpoints" / "step-000002"
    assert json.loads((checkpoint / "state.json").read_text())["weights"] == "sharded"
    assert (checkpoint / "sharded" / "__1_0.distcp").is_file() and (checkpoint / "rng_1.pt").is_file()
    assert (run / "model" / "model.safetensors").is_file() and (run / "eval" / "eval.json").is_file()
    assert "Forward KL on teacher completions" in result.stdout


def test_resuming_with_another_fsdp_setting_is_refused(tmp_path):
    import json
    from types import SimpleNamespace

    from distill.rundir import checkpoint as ckpt
    checkpoint = tmp_path / "step-000002"
    checkpoint.mkdir()
    (checkpoint / "state.json").write_text(json.dumps({"step": 2, "num_processes": 2, "weights": ckpt.SHARDED}))
    accelerator = SimpleNamespace(num_processes=2, process_index=0)
    loaded = []
    with pytest.raises(ValueError, match="holds sharded weights \\(fsdp: true\\), this run has fsdp: false"):
        ckpt.load_training_state(accelerator, checkpoint, loaded.append, None, ckpt.REPLICATED)
    assert loaded == []  # refused before anything was read
