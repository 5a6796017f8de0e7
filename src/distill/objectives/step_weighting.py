"""SOD's step-wise reweighting of a divergence objective (arXiv 2605.07725; the rule: `distill.losses.step_weights`):
each trained model turn of a student's conversation weighs its tokens' loss by the student-teacher gap there,
relative to the conversation's first turn.

The gap of a token is |log pi_theta(y_t) - log pi_T(y_t)| of the sampled token at the loss temperature: the student's
log-prob from its current weights (detached: the weights are constants), the teacher's from its signal (a model's
hidden states, a server's log-prob of the completion token; a top-k-only teacher cannot say it and is refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distill.losses.step_weights import step_divergence_weights
from distill.losses.token_log_probs import token_log_probs
from distill.objectives.base import StudentTokens
from distill.objectives.sampled import teacher_token_log_probs

STEP_WEIGHT_METRICS = ("step_divergence/weight", "step_divergence/gap")


@dataclass(frozen=True)
class StepDivergenceWeighting:
    """SOD's weights: `epsilon` keeps the ratio finite, `delta` bounds a weight by 1 + delta."""

    epsilon: float = 1e-6
    delta: float = 0.2

    def weights(self, tokens: StudentTokens, signal, temperature: float,
                chunk_size: int) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """((N,) float32 weights of the micro-batch's tokens, the metrics: the tokens' mean weight and mean step gap
        d_k, name -> (numerator, denominator))."""
        if tokens.rows is None or tokens.turns is None:
            raise ValueError("step_divergence_weighting needs each token's row and model turn (a collated micro-batch)")
        student = token_log_probs(tokens.hidden.detach(), tokens.head, tokens.targets, temperature, chunk_size)
        teacher = teacher_token_log_probs(tokens, signal, temperature, chunk_size)
        weights, gaps = step_divergence_weights((student - teacher).abs(), tokens.rows, tokens.turns, self.epsilon,
                                                self.delta)
        n = torch.tensor(float(weights.numel()))
        return weights, {"step_divergence/weight": (weights.sum(), n), "step_divergence/gap": (gaps.sum(), n)}
