"""distill: knowledge distillation for language models.

    from distill import DistillConfig, Distiller
    Distiller(DistillConfig(teacher=..., dataset=...)).train()
"""

from distill.config import DistillConfig

__version__ = "0.1.0"
__all__ = ["DistillConfig", "Distiller"]


def __getattr__(name):
    # The trainer pulls in accelerate and transformers; import it only when asked for.
    if name == "Distiller":
        from distill.trainer import Distiller

        return Distiller
    raise AttributeError(name)
