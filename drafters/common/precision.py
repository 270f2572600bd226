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


def bf16_matmul_ratio(repeats: int = 3) -> float:
    """How many times longer a bfloat16 matmul takes than a float32 one on this CPU (best of ``repeats``
    each, at a drafter layer's shape: 1,024 rows of width 576 through a 2,048 x 576 weight). Below 1 where
    the CPU multiplies bfloat16 natively (AVX512-BF16, AMX); several times 1 where torch emulates it."""
    import time

    gen = torch.Generator().manual_seed(0)
    a, w = torch.randn(1024, 576, generator=gen), torch.randn(2048, 576, generator=gen)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), w.to(dtype)
        torch.nn.functional.linear(x, y)  # warm-up: the first call picks kernels
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.nn.functional.linear(x, y)
            times.append(time.perf_counter() - start)
        best[dtype] = min(times)
    return best[torch.bfloat16] / max(best[torch.float32], 1e-9)


def slow_bf16_note(precision: str, device: torch.device | str, threshold: float = 1.5) -> str | None:
    """A one-line warning when ``precision`` asks for bfloat16 on a CPU that runs it slower than float32
    (measured, :func:`bf16_matmul_ratio`); None for ``fp32``, for GPUs, and where bfloat16 pays."""
    if precision == "fp32" or torch.device(device).type != "cpu":
        return None
    ratio = bf16_matmul_ratio()
    if ratio < threshold:
        return None
    return (f"precision={precision}: a bfloat16 matmul takes {ratio:.1f}x a float32 one on this CPU (no native "
            "bfloat16), so this run trains slower than in float32; --set precision=fp32 is faster here")
