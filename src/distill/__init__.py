"""distill: knowledge distillation for language models.

    from distill import DistillConfig, Distiller
    Distiller(DistillConfig(teacher=..., dataset=...)).train()
"""

from distill.config import DistillConfig
from distill.version import __version__

__all__ = ["DistillConfig", "Distiller", "__version__"]


def __getattr__(name):
    # The trainer pulls in accelerate and transformers; import it only when asked for.
    if name == "Distiller":
        from distill.training.trainer import Distiller

        return Distiller
    raise AttributeError(name)
