"""Config fields of method gold's ULD loss across tokenizers (read by `distill.methods.gold`)."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting


@dataclass
class GoldFields(PartFields):
    uld_use_hybrid_loss: bool = setting(False, "method gold: compare tokens whose strings exist in both vocabularies "
                                        "exactly (generalized JSD with `beta`) and only the rest by ULD (sorted probabilities). "
                                        "False: plain ULD on everything.")
    uld_hybrid_matched_weight: float | None = setting(None, "method gold, hybrid: weight of the matched-token JSD. None (with "
                                                      "uld_hybrid_unmatched_weight None): adaptive, the share of the teacher "
                                                      "vocabulary that is matched.")
    uld_hybrid_unmatched_weight: float | None = setting(None, "method gold, hybrid: weight of the ULD on unmatched tokens "
                                                        "(set both weights or neither).")
    uld_crossentropy_weight: float = setting(0.0, "method gold: weight of a cross-entropy term on the completion tokens "
                                             "(0 = off).")
