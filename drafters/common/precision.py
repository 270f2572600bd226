"""Training precision, shared by the learned families' recipes (EAGLE-3 and the block family).

``fp32`` runs everything in float32. ``bf16`` runs the head's forward under ``torch.autocast`` in
bfloat16, with float32 weights, optimizer, norms, softmax and loss, as upstream trains (SpecForge).
The block family adds ``bf16-head``: only its lm_head matmul in bfloat16.
"""

from __future__ import annotations

import torch


def check_precision(precision: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError naming the choices when ``precision`` is not one of them."""
    if precision not in choices:
        raise ValueError(f"precision must be one of {', '.join(choices)}, got '{precision}'")


def bf16_autocast(device: torch.device | str, enabled: bool) -> torch.autocast:
    """bfloat16 autocast on ``device``'s type when ``enabled``, else a no-op context."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)
