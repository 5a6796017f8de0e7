"""gold with the teacher behind a hidden-state server (`teacher_payload: hidden`, `teacher_head`): the alignment,
the group prefixes and the head are computed on the trainer from the teacher's tokenizer and head, so ULD and
hybrid ULD, values and gradients, equal the local cross-tokenizer teacher's."""

from __future__ import annotations

import datasets
import pytest
import torch

from distill.batch import Completion, collate
from distill.data import Example
from distill.losses import LogitHead
from distill.losses.uld import ULDSettings, VocabularyMatch
from distill.objectives import LossSettings, StudentTokens, divergence
from distill.serving.app import build_app
from distill.serving.scoring import ScoringEngine
from distill.teachers.cross_tokenizer import CrossTokenizerTeacher
from distill.teachers.hidden_client import HiddenStateServerTeacher
from distill.teachers.topk_client import ServerSettings
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import make_config
from tests.methods.gold.conftest import TEXT
from tests.teachers.servers import serve_app


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory, smol_teacher, smol_tokenizer):
    """The tiny teacher with SmolLM2's tokenizer, as files: what the server serves and `teacher_head` names."""
    directory = tmp_path_factory.mktemp("smol-teacher")
    smol_teacher.save_pretrained(directory)
    smol_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def server(smol_dir, smol_teacher, smol_tokenizer):
    with serve_app(build_app(ScoringEngine(smol_teacher, smol_tokenizer, torch.device("cpu")), "smol")) as url:
        yield url


def _batch(tokenizer):
    completions = []
    for i, row in enumerate(chat_rows(3)):
        prompt = tokenizer(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False)["input_ids"]
        answer = tokenizer(f"{TEXT} {row['completion']}", add_special_tokens=False)["input_ids"][: 12 + 5 * i]
        ended = answer + [tokenizer.eos_token_id] if i != 1 else answer  # one completion cut without its EOS
        completions.append(Completion(prompt, ended, "dataset", example=Example(i, row["prompt"], None)))
    return collate(completions, "dataset", tokenizer.pad_token_id)


@pytest.mark.parametrize("hybrid", [False, True])
def test_gold_through_the_server_is_the_local_cross_tokenizer_teachers_loss(server, smol_dir, smol_teacher, smol_tokenizer,
                                                                               tokenizer, hybrid):
    settings = ULDSettings(VocabularyMatch.from_tokenizers(tokenizer, smol_tokenizer, len(tokenizer), len(smol_tokenizer)),
                           0.5, 0.5, 0.3) if hybrid else ULDSettings(None, 0.0, 1.0, 0.3)
    remote = HiddenStateServerTeacher(ServerSettings(server, 20, None, 2, 2, 30.0, 0, 0.01), len(smol_tokenizer))
    remote.check(smol_tokenizer, str(smol_dir))
    teachers = [CrossTokenizerTeacher(smol_teacher, smol_tokenizer, tokenizer, [tokenizer.eos_token_id], 256, settings,
                                      torch.device("cpu")),
                CrossTokenizerTeacher(None, smol_tokenizer, tokenizer, [tokenizer.eos_token_id], 256, settings,
                                      torch.device("cpu"), remote=remote)]
    assert not teachers[1].can_generate
    batch = _batch(tokenizer)
    torch.manual_seed(0)
    student_hidden = torch.randn(batch.num_completion_tokens, 32)
    head = LogitHead(torch.randn(len(tokenizer), 32))
    targets = batch.input_ids[:, 1:][batch.completion_mask[:, 1:]]
    results = []
    for teacher in teachers:
        for temperature in (1.0, 0.7):
            signal = teacher.score(batch, temperature)
            hidden = student_hidden.clone().requires_grad_(True)
            out = divergence(StudentTokens(hidden, head, targets), signal,
                             LossSettings(beta=0.5, temperature=temperature, chunk_size=8))
            out.loss_sum.backward()
            results.append((out.loss_sum.detach().double(), hidden.grad.double()))
    for (local_loss, local_grad), (remote_loss, remote_grad) in zip(results[:2], results[2:]):
        assert local_loss > 0
        assert float((remote_loss - local_loss).abs() / local_loss) < 1e-6
        assert float((remote_grad - local_grad).abs().max() / local_grad.abs().max()) < 1e-6


def test_gold_trains_against_the_hidden_state_server(server, smol_dir, tokenizer, tmp_path):
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    config = make_config(tmp_path, method="gold", teacher_url=server, teacher_payload="hidden", teacher_head=str(smol_dir),
                         lmbda=0.5, uld_crossentropy_weight=0.5, teacher_concurrency=2, teacher_retries=0)
    distiller = Distiller(config, student=student, tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)))
    before = {k: v.clone() for k, v in distiller.student_model.state_dict().items()}
    result = distiller.train()
    assert result["steps"] == 2 and result["train"]["loss"] > 0
    after = distiller.parts.with_student.current().state_dict()
    assert not all(torch.equal(before[k], after[k]) for k in before)


def test_gold_with_a_hidden_state_server_needs_the_teachers_directory(tmp_path):
    config = make_config(tmp_path, method="gold", teacher_url="http://127.0.0.1:1", teacher_payload="hidden",
                         student="byte-llama:2x32")
    with pytest.raises(ValueError, match="teacher_head: method gold with a hidden-state server aligns"):
        config.validate()
    config = make_config(tmp_path, method="gold", teacher_url="http://127.0.0.1:1", teacher_payload="hidden",
                         teacher_head="somewhere", student="byte-llama:2x32", seq_kd=True)
    with pytest.raises(ValueError, match="seq_kd: true needs a teacher that samples"):
        config.validate()
