"""Correcting a full-distribution loss for student samples drawn by an older policy (`max_staleness` > 0).

With asynchronous rollouts a micro-batch of student samples was drawn by the weights of `staleness` optimizer
steps ago, pi_b, while the loss trains pi_theta. GKD's divergences are full-distribution losses: at position t,
D_t(theta) = D(pi_T(. | s_t), pi_theta(. | s_t)) sums over the whole vocabulary at the state s_t = (x, y_<t), so the
token drawn at t plays no part in it; only the states come from the wrong policy. The on-policy objective
E_{y ~ pi_theta} sum_t D_t equals E_{y ~ pi_b} sum_t rho_<t D_t, where rho_<t = prod_{i<t} pi_theta(y_i|s_i) / pi_b(y_i|s_i)
is the ratio of the prefix. Which ratio weighs token t (`staleness_ratio`):

    prefix    w_t = rho_<t: the exact weight for a full-distribution loss (the default)
    sequence  w_t = rho_<T, one weight for every token of a sample: unbiased too (the ratios after t have
              expectation 1 under pi_b), with more variance
    token     w_t = pi_theta(y_t|s_t) / pi_b(y_t|s_t), the sampled token's own ratio (verl's TIS, prime-rl): the weight of
              a sampled-token policy gradient; under a full-distribution loss its expectation over y_t is 1, so it
              corrects nothing in expectation and adds variance (offered to compare with those libraries)

and what bounds it (`staleness_correction`, with c = `staleness_ratio_cap`):

    tis       w_t <- min(w_t, c): truncated importance sampling, variance bounded, biased toward pi_b
    icepop    w_t <- w_t if 1/c <= w_t <= c, else 0: tokens whose two policies disagree more get no loss (IcePop)
    none      w_t <- 1: the stale samples taken as if they were the current policy's (the reference library's
              asynchronous trainer)

The ratios are log-prob differences summed in float64 over a sample's trained tokens (tokens the loss skips and an
environment's tokens count as ratio 1), then exponentiated; the weights are constants (no gradient flows through
them), and a fresh micro-batch (staleness 0) gets none. pi_theta(y_t|s_t) is the student's softmax at the loss
temperature, which the sampling rule makes the sampling distribution (`distill.methods.sampling_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RATIO_LEVELS = ("prefix", "sequence", "token")
CORRECTIONS = ("tis", "icepop", "none")
STALENESS_METRICS = ("staleness/ratio", "staleness/corrected_fraction")
STALENESS_MAXIMA = ("staleness/ratio_max",)
STALENESS_MINIMA = ("staleness/ratio_min",)


@dataclass(frozen=True)
class StalenessCorrection:
    """How a full-distribution loss weighs the tokens of a stale student sample (module docstring)."""

    correction: str = "tis"
    level: str = "prefix"
    cap: float = 2.0

    def weights(self, log_ratios: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, dict, dict]:
        """(N,) float32 weights from (N,) log(pi_theta / pi_b) of each token in row-major order (`rows`: (N,) long, each
        token's sample, a sample's tokens contiguous), with the metrics: the raw ratio's mean and the fraction of tokens
        the bound changed (name -> (numerator, denominator)), and the raw ratio's extremes."""
        ratio = raw_ratios(log_ratios.detach().double(), rows, self.level)
        if self.correction == "tis":
            corrected = ratio > self.cap
            weights = ratio.clamp(max=self.cap)
        elif self.correction == "icepop":
            corrected = (ratio > self.cap) | (ratio < 1.0 / self.cap)
            weights = torch.where(corrected, torch.zeros_like(ratio), ratio)
        elif self.correction == "none":
            corrected = torch.zeros_like(ratio, dtype=torch.bool)
            weights = torch.ones_like(ratio)
        else:
            raise ValueError(f"staleness_correction must be one of {CORRECTIONS}, got {self.correction!r}")
        n = torch.tensor(float(ratio.numel()))
        metrics = {"staleness/ratio": (ratio.sum().float(), n), "staleness/corrected_fraction": (corrected.sum().float(), n)}
        extrema = {"staleness/ratio_max": ratio.max().float(), "staleness/ratio_min": ratio.min().float()} if ratio.numel() else {}
        return weights.float(), metrics, extrema


MAX_LOG_RATIO = 50.0  # a product over a long sample can leave float64's range; e^50 is far past any bound


def raw_ratios(log_ratios: torch.Tensor, rows: torch.Tensor, level: str) -> torch.Tensor:
    """(N,) float64 pi_theta / pi_b per token at `level` (module docstring) from (N,) float64 log-ratios, each
    log-ratio of the result clamped to [-50, 50] so that the logged means stay finite."""
    return _summed_log_ratios(log_ratios, rows, level).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()


def _summed_log_ratios(log_ratios: torch.Tensor, rows: torch.Tensor, level: str) -> torch.Tensor:
    if level == "token":
        return log_ratios
    if log_ratios.numel() == 0:
        return log_ratios.clone()
    number = int(rows.max()) + 1
    totals = torch.zeros(number, dtype=torch.float64, device=log_ratios.device).index_add_(0, rows, log_ratios)
    if level == "sequence":
        return totals[rows]
    if level == "prefix":
        before_row = totals.cumsum(0) - totals  # the log-ratios of every earlier sample
        return log_ratios.cumsum(0) - log_ratios - before_row[rows]
    raise ValueError(f"staleness_ratio must be one of {RATIO_LEVELS}, got {level!r}")
