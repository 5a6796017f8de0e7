"""The student's top-k support with the teacher's log-probs on it: a dense teacher made sparse.

SDFT's top-k loss compares the two distributions on the student's k most likely tokens plus one tail
bucket holding each distribution's remaining mass. Given that support, it is exactly the sparse loss
(`sparse_generalized_jsd`) with the teacher's tail known exactly, so this module only builds the support:
per block of tokens, the student's top-k ids (no gradient: the choice of support is not differentiated)
and the teacher's log-probs on them and off them. Nothing of size [tokens x vocab] is kept.
"""

from __future__ import annotations

import torch

from distill.losses.checks import check_chunk_size, check_matrix, check_temperature
from distill.losses.chunked import LogitHead
from distill.no_grad import no_grad


@no_grad
def student_topk_support(student_hidden: torch.Tensor, student_head: LogitHead, teacher_hidden: torch.Tensor,
                         teacher_head: LogitHead, k: int, temperature: float, chunk_size: int,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (N, k) long, teacher_log_probs (N, k) float32, teacher_tail_log_probs (N,) float32).

    student_hidden: (N, H_s); teacher_hidden: (N, H_t); both heads over the same V >= k. The ids are the
    student's top-k of softmax(z_s / T); the teacher's log-probs are of softmax(z_t / T); the tail is
    log(1 - sum of the teacher's probabilities on the ids) (log of the smallest float when that is 0).
    """
    check_matrix("student_hidden", student_hidden)
    n = student_hidden.shape[0]
    check_matrix("teacher_hidden", teacher_hidden, rows=n)
    if not 1 <= k <= student_head.vocab_size:
        raise ValueError(f"k must be between 1 and the vocabulary size {student_head.vocab_size}, got {k}")
    temperature, chunk_size = check_temperature(temperature), check_chunk_size(chunk_size)
    device = student_hidden.device
    ids = torch.zeros(n, k, dtype=torch.long, device=device)
    teacher_lp = torch.zeros(n, k, dtype=torch.float32, device=device)
    tail = torch.zeros(n, dtype=torch.float32, device=device)
    tiny = torch.finfo(torch.float32).tiny
    for start in range(0, n, chunk_size):
        rows = slice(start, min(start + chunk_size, n))
        student_logits = student_head.full_logits(student_hidden[rows].detach()) / temperature
        ids[rows] = student_logits.topk(k, dim=-1).indices
        del student_logits
        log_probs = torch.log_softmax(teacher_head.full_logits(teacher_hidden[rows].detach()) / temperature, dim=-1)
        picked = log_probs.gather(1, ids[rows])
        teacher_lp[rows] = picked
        outside = log_probs.scatter(1, ids[rows], -torch.inf).logsumexp(dim=-1)  # the mass off the support, directly
        tail[rows] = outside.clamp_min(torch.log(torch.tensor(tiny)).item())
    return ids, teacher_lp, tail
