"""Shared test helper: find a prompt whose greedy continuation stops early on a tiny target."""

from __future__ import annotations

import torch


@torch.inference_mode()
def early_stop_prompt(target) -> torch.Tensor:
    """A raw token prompt whose greedy continuation hits a stop token after a few tokens (batched
    plain greedy search over random prompts), so every drafter must stop at the same place."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (256, 8), generator=g)
    for _ in range(12):
        nxt = target.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1].argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    stop = torch.tensor(target.stop_token_ids)
    for row in ids:
        hit = torch.isin(row[8:], stop).nonzero().flatten().tolist()
        if hit and hit[0] >= 2:
            return row[:8]
    raise AssertionError("no early-stop prompt found; widen the search")
