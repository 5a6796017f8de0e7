"""`distill.no_grad`: the typed decorators do what torch's do (the type checker is the only reader that differs)."""

import torch

from distill.no_grad import inference_mode, no_grad


def test_no_grad_records_no_graph_and_keeps_the_function():
    @no_grad
    def doubled(x: torch.Tensor) -> torch.Tensor:
        """Twice x."""
        return 2 * x

    x = torch.ones(3, requires_grad=True)
    y = doubled(x)
    assert not y.requires_grad and not y.is_inference()
    assert torch.equal(y, torch.full((3,), 2.0))
    assert doubled.__name__ == "doubled" and doubled.__doc__ == "Twice x."
    assert (2 * x).requires_grad  # outside the function, autograd records again


def test_inference_mode_makes_inference_tensors():
    @inference_mode
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    y = doubled(torch.ones(3, requires_grad=True))
    assert y.is_inference() and not y.requires_grad
    assert doubled.__name__ == "doubled"
