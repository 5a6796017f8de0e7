"""`torch.no_grad` and `torch.inference_mode` as decorators that keep the decorated function's signature.

The type checker does not read torch (its names are Any, so that the checked result does not move with the installed
torch), and a function decorated with `@torch.no_grad()` becomes Any too: every call of it, in this package and in the
benchmarks, goes unchecked. These wrappers run the same torch decorator and declare that the signature is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast

import torch

Params = ParamSpec("Params")
Result = TypeVar("Result")


def no_grad(function: Callable[Params, Result]) -> Callable[Params, Result]:
    """`function` run under `torch.no_grad()`: no autograd graph is recorded for what it computes."""
    return cast("Callable[Params, Result]", torch.no_grad()(function))


def inference_mode(function: Callable[Params, Result]) -> Callable[Params, Result]:
    """`function` run under `torch.inference_mode()`: as `no_grad`, and its tensors can never enter autograd later."""
    return cast("Callable[Params, Result]", torch.inference_mode()(function))
