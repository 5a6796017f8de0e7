"""Per-row sampling seeds: their formulas live with every other seed stream of a run in `distill.seeds` (a leaf
every layer imports without reaching up); this name stays for the callers that import them from here."""

from distill.seeds import SEED_BITS, row_seed, row_seeds, teacher_window_seed

__all__ = ["SEED_BITS", "row_seed", "row_seeds", "teacher_window_seed"]
