"""Losses computed from hidden states, a block of tokens at a time, with gradients computed block by block.

The student's [tokens x vocab] logits are the largest tensors of a distillation step (4096 completion tokens
x 49152 vocabulary entries is 805 MB in fp32, and autograd keeps several of them). Here they never exist
at once: `ChunkedHeadLoss` projects `chunk_size` tokens at a time, asks an objective for the per-token loss
and its gradient with respect to those logits, immediately turns that gradient into gradients for the
hidden states, the lm_head weight and bias (fp32 accumulators), and drops the block. Backward then only
scales the stored gradients by the incoming scalar. Peak extra memory is a few [chunk x vocab] buffers.

Objectives (the generalized JSD here, the sparse top-k one in `sparse.py`) see one block of student logits
at the loss temperature and return `(per_token_loss (C,), grad wrt those logits (C, V) or None,
per_token_stats (C, S) or None)`. They may overwrite the logits buffer in place.

Logits may be scaled and soft-capped, as some model families do:

    z = softcap * tanh(scale * (h W^T + b) / softcap)      (z = scale * (h W^T + b) without a softcap)

and the loss sees z / temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from distill.losses.blocks import Workspace, log_softmax_, rowwise_dot
from distill.losses.checks import (
    check_beta,
    check_chunk_size,
    check_mask,
    check_matrix,
    check_same_vocab,
    check_temperature,
)
from distill.losses.diagnostics import (
    DEFAULT_OVERLAP_K,
    STAT_NAMES,
    TokenStats,
    token_statistics,
)

DEFAULT_CHUNK_SIZE = 256
_TINY = torch.finfo(torch.float32).tiny

# (rows, student logits (C, V) at the loss temperature, need_grad) -> (loss (C,), grad (C, V) | None, stats | None)
ChunkObjective = Callable[[slice, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]


@dataclass(frozen=True)
class LogitHead:
    """How hidden states (N, H) become logits (N, V): weight (V, H), optional bias (V,), scale, softcap."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    scale: float = 1.0
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"softcap must be > 0 or None, got {self.softcap!r}")
        if self.bias is not None and self.bias.shape != (self.weight.shape[0],):
            raise ValueError(f"lm_head bias must have shape ({self.weight.shape[0]},), got {tuple(self.bias.shape)}")

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def project(self, hidden: torch.Tensor, temperature: float, out: torch.Tensor) -> torch.Tensor | None:
        """Write logits / temperature of `hidden` (C, H) into `out` (C, V) float32.

        Returns tanh(scale (h W^T + b) / softcap) when soft-capped (the backward pass needs it), else None.
        Scalars are folded into the small (C, H) operand so the projection is a single pass over (C, V).
        """
        pre = self.scale / temperature if self.softcap is None else self.scale / self.softcap
        dtype = self.weight.dtype
        target = out if dtype == torch.float32 else None
        hidden = (hidden * pre).to(dtype)
        if self.bias is None:
            logits = torch.mm(hidden, self.weight.t(), out=target)
        else:
            logits = torch.addmm((self.bias * pre).to(dtype), hidden, self.weight.t(), out=target)
        if target is None:
            logits = out.copy_(logits)
        if self.softcap is None:
            return None
        tanh = logits.tanh()
        torch.mul(tanh, self.softcap / temperature, out=out)
        return tanh

    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Plain autograd logits z (N, V) float32: for references, evaluation and small inputs."""
        logits = hidden.float() @ self.weight.float().t()
        if self.bias is not None:
            logits = logits + self.bias.float()
        logits = logits * self.scale
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits


class ChunkedHeadLoss(torch.autograd.Function):
    """sum over tokens of objective(hidden @ W^T ...), gradients computed chunk by chunk during forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, head: LogitHead, objective: ChunkObjective, temperature, chunk_size, num_stats):
        n, hidden_size = hidden.shape
        vocab = weight.shape[0]
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        need_grad = need_hidden or need_weight or need_bias
        grad_hidden = torch.zeros(n, hidden_size, dtype=torch.float32, device=hidden.device) if need_hidden else None
        grad_weight = torch.zeros(vocab, hidden_size, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(vocab, dtype=torch.float32, device=weight.device) if need_bias else None
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        stats = torch.zeros(n, num_stats, dtype=torch.float32, device=hidden.device)
        buffer = torch.empty(min(chunk_size, n), vocab, dtype=torch.float32, device=hidden.device)
        coefficient = head.scale / temperature

        for start in range(0, n, chunk_size):
            rows = slice(start, min(start + chunk_size, n))
            block = hidden[rows]
            logits = buffer[: block.shape[0]]
            tanh = head.project(block, temperature, out=logits)
            token_loss, grad_logits, token_stats = objective(rows, logits, need_grad)
            loss_sum += token_loss.sum()
            if token_stats is not None:
                stats[rows] = token_stats
            if not need_grad:
                continue
            assert grad_logits is not None  # the objective gives them when asked (need_grad)
            if tanh is not None:
                grad_logits.mul_(tanh.square_().neg_().add_(1.0))
            grad = grad_logits if weight.dtype == torch.float32 else grad_logits.to(weight.dtype)
            if grad_hidden is not None:  # need_hidden
                grad_hidden[rows] = torch.mm(grad, weight).float().mul_(coefficient)
            if grad_weight is not None:  # need_weight
                if weight.dtype == torch.float32:
                    grad_weight.addmm_(grad.t(), block.float(), alpha=coefficient)
                else:
                    grad_weight.add_(torch.mm(grad.t(), block.to(weight.dtype)).float(), alpha=coefficient)
            if grad_bias is not None:  # need_bias
                grad_bias.add_(grad_logits.sum(0), alpha=coefficient)

        ctx.save_for_backward(*(t if t is not None else torch.empty(0) for t in (grad_hidden, grad_weight, grad_bias)))
        ctx.has_grad = (need_hidden, need_weight, need_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(stats)
        return loss_sum, stats

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        grads = []
        for stored, has, dtype in zip(ctx.saved_tensors, ctx.has_grad, ctx.dtypes):
            grads.append(stored.mul(grad_loss).to(dtype) if has else None)
        return (*grads, None, None, None, None, None)


class DistillLoss(NamedTuple):
    """What a distillation objective returns: sums, never means (the trainer owns the denominator)."""

    loss_sum: torch.Tensor  # () float32, differentiable w.r.t. the student
    num_tokens: torch.Tensor  # () int64, tokens that entered the sum
    stats: TokenStats | None  # per-token diagnostics, (N,) each, zero at masked positions
    groups: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # per teacher id: (loss_sum, num_tokens)
    # a method's own token-weighted metrics: name -> (numerator, denominator), names declared by the method
    metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
    # a method's own extremes of the micro-batch: name -> () tensor, names declared in Method.maxima / minima
    extrema: dict[str, torch.Tensor] | None = None
    # the tokens `stats` cover when they are a subset's (sdpo: the rows with a demonstration); None: num_tokens
    stats_tokens: int | None = None


def run_chunked(
    student_hidden: torch.Tensor,
    student_head: LogitHead,
    mask: torch.Tensor | None,
    make_objective: Callable[[torch.Tensor], ChunkObjective],
    temperature: float,
    chunk_size: int,
    return_stats: bool,
    token_weights: torch.Tensor | None = None,
) -> DistillLoss:
    """Select the unmasked rows, run `ChunkedHeadLoss` over them and scatter the statistics back.

    `make_objective(valid_rows)` builds the objective over the compacted rows (it indexes its own
    teacher-side inputs with `valid_rows`), so masked positions are never projected at all.
    `token_weights` (N,): constants multiplying each token's loss and gradient (importance weights); the
    statistics stay unweighted.
    """
    n = student_hidden.shape[0]
    valid_rows = torch.arange(n, device=student_hidden.device) if mask is None else mask.nonzero().squeeze(1)
    if token_weights is not None:
        make_objective = weighted(make_objective, check_weights(token_weights, n))
    hidden = student_hidden.index_select(0, valid_rows)
    weight, bias = student_head.weight, student_head.bias
    if not torch.is_grad_enabled():  # needs_input_grad ignores no_grad: detach so no gradient buffers are built
        hidden, weight, bias = hidden.detach(), weight.detach(), None if bias is None else bias.detach()
    num_stats = len(STAT_NAMES) if return_stats else 0
    loss_sum, compact_stats = ChunkedHeadLoss.apply(
        hidden,
        weight,
        bias,
        student_head,
        make_objective(valid_rows),
        temperature,
        chunk_size,
        num_stats,
    )
    stats = None
    if return_stats:
        full = torch.zeros(n, num_stats, dtype=torch.float32, device=student_hidden.device)
        full[valid_rows] = compact_stats
        stats = TokenStats.from_columns(full)
    return DistillLoss(loss_sum, torch.tensor(valid_rows.numel(), dtype=torch.long), stats)


def check_weights(token_weights: torch.Tensor, n: int) -> torch.Tensor:
    if not isinstance(token_weights, torch.Tensor) or token_weights.shape != (n,):
        shape = tuple(token_weights.shape) if isinstance(token_weights, torch.Tensor) else type(token_weights).__name__
        raise ValueError(f"token_weights must have shape ({n},), got {shape}")
    return token_weights.detach().float()


def weighted(make_objective: Callable[[torch.Tensor], ChunkObjective], weights: torch.Tensor) -> Callable[[torch.Tensor], ChunkObjective]:
    """`make_objective` with each token's loss and gradient multiplied by its weight (N,)."""

    def make_weighted(valid_rows: torch.Tensor) -> ChunkObjective:
        inner, row_weights = make_objective(valid_rows), weights.index_select(0, valid_rows)

        def objective(rows: slice, student_logits: torch.Tensor, need_grad: bool):
            loss, grad, stats = inner(rows, student_logits, need_grad)
            w = row_weights[rows].to(loss.device)
            return loss * w, None if grad is None else grad.mul_(w.unsqueeze(1)), stats

        return objective

    return make_weighted


def jsd_block(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float,
    need_grad: bool,
    overlap_k: int | None,
    workspace: Workspace,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Generalized JSD of one block and its gradient w.r.t. the student logits; both inputs are overwritten.

    Args:
        student_logits, teacher_logits: (C, V) float32, already divided by the temperature.
        beta: in [0, 1]; the ends are forward KL (0) and reverse KL (1) exactly.
        need_grad: also return dJSD/d(student_logits) (C, V) (a view of a workspace buffer).
        overlap_k: when not None, also return per-token diagnostics (C, len(STAT_NAMES)).
        workspace: buffers "student_p", "teacher_p", "mixture" are used.

    Gradients, with g the derivative w.r.t. p_s and dL/dz = p_s * (g - <p_s, g>):
        forward KL:  dL/dz = p_s - p_t
        reverse KL:  g = log p_s - log p_t
        mixture:     g = (1 - beta) (log p_s - log m)      (the p_t / m terms cancel)
    """
    rows = student_logits.shape[0]
    student_lp, student_p = log_softmax_(student_logits, workspace.get("student_p", rows))
    teacher_lp, teacher_p = log_softmax_(teacher_logits, workspace.get("teacher_p", rows))
    stats = token_statistics(student_lp, teacher_lp, overlap_k) if overlap_k is not None else None
    grad = None
    if beta == 0.0:
        loss = rowwise_dot(teacher_p, teacher_lp.sub_(student_lp))
        if need_grad:
            grad = student_p.sub_(teacher_p)
    elif beta == 1.0:
        log_ratio = student_lp.sub_(teacher_lp)
        loss = rowwise_dot(student_p, log_ratio)
        if need_grad:
            grad = log_ratio.sub_(loss.unsqueeze(1)).mul_(student_p)
    else:
        # The mixture in probability space; the clamp keeps log m finite where both underflow (their weight is 0).
        log_mixture = torch.lerp(student_p, teacher_p, beta, out=workspace.get("mixture", rows))
        log_mixture.clamp_min_(_TINY).log_()
        kl_teacher = rowwise_dot(teacher_p, teacher_lp.sub_(log_mixture))
        student_vs_mixture = student_lp.sub_(log_mixture)
        kl_student = rowwise_dot(student_p, student_vs_mixture)
        loss = beta * kl_teacher + (1.0 - beta) * kl_student
        if need_grad:
            grad = student_vs_mixture.sub_(kl_student.unsqueeze(1)).mul_(student_p).mul_(1.0 - beta)
    return loss, grad, stats


def chunked_generalized_jsd(
    student_hidden: torch.Tensor,
    student_lm_head: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_lm_head: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    student_logit_scale: float = 1.0,
    teacher_logit_scale: float = 1.0,
    student_softcap: float | None = None,
    teacher_softcap: float | None = None,
    return_stats: bool = False,
    overlap_k: int = DEFAULT_OVERLAP_K,
    token_weights: torch.Tensor | None = None,
) -> DistillLoss:
    """Masked SUM over tokens of the generalized JSD, from hidden states, never holding all the logits.

    Args:
        student_hidden: (N, H_s), differentiable.
        student_lm_head: (V, H_s) weight, differentiable (tied or not); `student_bias` (V,) optional.
        teacher_hidden: (N, H_t); teacher_lm_head: (V, H_t); `teacher_bias` (V,). The teacher gets no gradients.
        mask: (N,) bool, True where the token is trained on; None = all tokens.
        beta, temperature: as in `generalized_jsd_loss` (same values, to fp32 tolerance).
        chunk_size: tokens per block; peak extra memory is about 4 x chunk_size x V x 4 bytes.
        *_logit_scale, *_softcap: logit transforms of the model families that use them.
        return_stats: also compute the per-token diagnostics (costs a few extra passes per block; the
            trainer asks for them on logging steps only).
        token_weights: (N,) constants weighting each token's loss (importance weights), or None.

    Returns:
        DistillLoss(loss_sum, num_tokens, stats). Divide loss_sum by the token count of the whole optimizer
        step (all micro-batches, all ranks), not by num_tokens, to keep the loss split-invariant.
    """
    beta = check_beta(beta)
    temperature = check_temperature(temperature)
    chunk_size = check_chunk_size(chunk_size)
    check_matrix("student_hidden", student_hidden)
    n = student_hidden.shape[0]
    check_matrix("teacher_hidden", teacher_hidden, rows=n)
    check_matrix("student_lm_head", student_lm_head, cols=student_hidden.shape[1])
    check_matrix("teacher_lm_head", teacher_lm_head, cols=teacher_hidden.shape[1])
    check_same_vocab(student_lm_head.shape[0], teacher_lm_head.shape[0], "chunked_generalized_jsd")
    mask = check_mask(mask, n)
    student_head = LogitHead(student_lm_head, student_bias, student_logit_scale, student_softcap)
    teacher_head = LogitHead(
        teacher_lm_head.detach(), None if teacher_bias is None else teacher_bias.detach(), teacher_logit_scale, teacher_softcap
    )
    overlap = overlap_k if return_stats else None

    def make_objective(valid_rows: torch.Tensor) -> ChunkObjective:
        teacher_rows = teacher_hidden.detach().index_select(0, valid_rows)
        workspace = Workspace(min(chunk_size, valid_rows.numel()), teacher_head.vocab_size, teacher_rows.device)

        def objective(rows: slice, student_logits: torch.Tensor, need_grad: bool):
            teacher_logits = workspace.get("teacher_logits", student_logits.shape[0])
            teacher_head.project(teacher_rows[rows], temperature, out=teacher_logits)
            return jsd_block(student_logits, teacher_logits, beta, need_grad, overlap, workspace)

        return objective

    return run_chunked(student_hidden, student_head, mask, make_objective, temperature, chunk_size, return_stats,
                       token_weights)
