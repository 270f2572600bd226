"""Small layers shared by the learned drafter families (Llama/Qwen conventions)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Llama RMSNorm: normalise in fp32, scale by ``weight`` in the input dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` [..., n, head_dim] by cos/sin broadcastable to it (HF convention: halves rotated)."""
    return x * cos + rotate_half(x) * sin


class GatedMLP(nn.Module):
    """The Llama/Qwen MLP: ``down(act(gate(x)) * up(x))``, no biases (upstream parameter names)."""

    def __init__(self, hidden: int, inter: int, act: str = "silu"):
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act = ACT2FN[act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


@torch.no_grad()
def init_normal_(module: nn.Module, generator: torch.Generator, std: float,
                 zero: Callable[[str], bool] = lambda name: False) -> None:
    """Seeded init of every parameter: norm weights 1, biases and ``zero(name)`` 0, the rest N(0, std).

    Parameters are visited in ``named_parameters`` order, so the same module, generator state and
    std give the same weights.
    """
    for name, param in module.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias") or zero(name):
            param.zero_()
        else:
            param.copy_(torch.randn(param.shape, generator=generator) * std)


__all__ = ["RMSNorm", "rotate_half", "apply_rope", "GatedMLP", "init_normal_"]
