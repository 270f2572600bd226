"""Rotary position embeddings computed by transformers' own RoPE initialisation.

A drafter's RoPE must match its target's, including any ``rope_scaling`` (Llama-3's ``llama3``,
``yarn``, ``linear``, ``longrope``, ...). Instead of restating those formulas, :class:`Rotary` builds
an equivalent ``LlamaConfig`` and asks transformers' ``LlamaRotaryEmbedding`` for the inverse
frequencies and the attention scaling, exactly as the target's own rotary module does. (Dynamic
NTK scaling, which changes the frequencies with the sequence length at run time, uses the
frequencies of the configured length.)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def rope_parameters(theta: float, scaling: dict | None) -> dict:
    """transformers >= 5 ``rope_parameters`` from a theta and an HF ``rope_scaling`` dict (or None)."""
    params = dict(scaling or {})
    params["rope_type"] = params.pop("type", None) or params.get("rope_type") or "default"
    params["rope_theta"] = float(theta)
    return params


def inv_freq_and_scale(head_dim: int, theta: float, scaling: dict | None, max_position_embeddings: int,
                       hidden_size: int | None = None, num_attention_heads: int = 1) -> tuple[Tensor, float]:
    """[head_dim // 2] float32 inverse frequencies and the cos/sin scaling, by transformers."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = rope_parameters(theta, scaling)
    original = int(params.get("original_max_position_embeddings") or 0)
    config = LlamaConfig(
        hidden_size=hidden_size or head_dim * num_attention_heads, num_attention_heads=num_attention_heads,
        head_dim=head_dim, max_position_embeddings=max(max_position_embeddings, original + 1),
        rope_parameters=params,
    )
    rotary = LlamaRotaryEmbedding(config)
    return rotary.inv_freq.float().clone(), float(rotary.attention_scaling)


class Rotary(nn.Module):
    """cos/sin tables for integer positions; no trainable state (the buffer is not saved)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None, max_position_embeddings: int = 8192):
        super().__init__()
        inv_freq, self.scale = inv_freq_and_scale(head_dim, theta, scaling, max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin [..., head_dim] for positions [...]."""
        freqs = positions.float()[..., None] * self.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.scale).to(dtype), (emb.sin() * self.scale).to(dtype)


__all__ = ["Rotary", "inv_freq_and_scale", "rope_parameters"]
