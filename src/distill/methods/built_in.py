"""The built-in methods: importing this module registers them (`distill.methods.registry` does, when its
table is first used)."""

from distill.methods import gkd, gold, iw_opd, on_policy, sdft, sft  # noqa: F401  (each registers itself)
from distill.methods.sdpo import method  # noqa: F401
