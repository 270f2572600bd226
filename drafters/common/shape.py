"""A drafter layer shaped like its target's: the config fields every learned family copies."""

from __future__ import annotations

from typing import Any


def target_rope(tc) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) of a transformers config, old or new style."""
    params = dict(getattr(tc, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", None) or getattr(tc, "rope_theta", None) or 10000.0
    scaling = getattr(tc, "rope_scaling", None) if not params else params
    if isinstance(scaling, dict) and (scaling.get("rope_type") or scaling.get("type") or "default") == "default":
        scaling = None
    return float(theta), (dict(scaling) if scaling else None)


def target_shape(target) -> dict[str, Any]:
    """The fields a one-layer-of-the-target drafter config takes from ``target``'s model config."""
    tc = target.model.config
    theta, scaling = target_rope(tc)
    heads = int(tc.num_attention_heads)
    return dict(
        hidden_size=target.hidden_size,
        intermediate_size=int(getattr(tc, "intermediate_size", None) or 4 * target.hidden_size),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(tc, "num_key_value_heads", None) or heads),
        vocab_size=target.vocab_size,
        head_dim=getattr(tc, "head_dim", None),
        rms_norm_eps=float(getattr(tc, "rms_norm_eps", None) or 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(getattr(tc, "max_position_embeddings", None) or 8192),
    )


class TargetShaped:
    """The derived sizes of a target-shaped head config (a dataclass with these four fields)."""

    hidden_size: int
    num_attention_heads: int
    head_dim: int | None
    target_hidden_size: int | None

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def feature_size(self) -> int:
        """Width of one tapped target hidden state (None in the config = the head's own width)."""
        return self.target_hidden_size or self.hidden_size


def rope_from_config_dict(d: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from a checkpoint's config.json (either style)."""
    scaling = d.get("rope_scaling")
    params = d.get("rope_parameters")
    theta = d.get("rope_theta")
    if isinstance(params, dict):
        theta = theta or params.get("rope_theta")
        if scaling is None and (params.get("rope_type") or "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and (scaling.get("rope_type") or scaling.get("type") or "default") == "default":
        scaling = None
    return float(theta or 10000.0), scaling


__all__ = ["TargetShaped", "target_shape", "target_rope", "rope_from_config_dict"]
