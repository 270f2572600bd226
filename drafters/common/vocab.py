"""The reduced draft vocabulary of the EAGLE-3 lineage (EAGLE-3, the block families, SpecBlock): d2t / t2d.

A head whose lm_head covers ``Vd`` draft ids maps them to target ids with two buffers, as upstream
(SafeAILab/EAGLE, SpecForge) and the serving engines store them:

* ``d2t`` [Vd] int64: ``target_id = draft_id + d2t[draft_id]``;
* ``t2d`` [V] bool: which target ids the draft vocabulary holds.

* :func:`vocab_maps`: the (d2t, t2d) of a list of distinct target ids; :func:`target_ids_of` inverts it;
* :func:`check_vocab_maps`: a one-line refusal of maps that do not describe one set of distinct ids;
* :func:`draft_vocabulary`: the draft ids chosen from training data (the most frequent answer tokens);
* :func:`random_vocabulary`: a seeded random subset (random-init heads for tests).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor

from specbench.errors import UserError


def vocab_maps(target_ids: Tensor, vocab_size: int) -> tuple[Tensor, Tensor]:
    """(d2t [Vd] int64, t2d [V] bool) of the draft vocabulary ``target_ids`` ([Vd] distinct ids, order kept)."""
    target_ids = torch.as_tensor(target_ids, dtype=torch.long)
    if target_ids.dim() != 1 or target_ids.unique().numel() != target_ids.numel():
        raise ValueError("the draft vocabulary needs distinct target ids")
    if target_ids.numel() and (int(target_ids.min()) < 0 or int(target_ids.max()) >= vocab_size):
        raise ValueError(f"draft vocabulary ids must lie in [0, {vocab_size})")
    d2t = target_ids - torch.arange(target_ids.numel(), device=target_ids.device)
    t2d = torch.zeros(vocab_size, dtype=torch.bool, device=target_ids.device)
    t2d[target_ids] = True
    return d2t, t2d


def target_ids_of(d2t: Tensor) -> Tensor:
    """[Vd] the target id of every draft id (the inverse of :func:`vocab_maps`)."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t.long()


def check_vocab_maps(d2t: Tensor, t2d: Tensor, where: str) -> None:
    """d2t and t2d must describe the same set of distinct target ids (else a one-line UserError)."""
    draft_vocab, vocab = d2t.numel(), t2d.numel()
    target_ids = target_ids_of(d2t.cpu())
    if bool(((target_ids < 0) | (target_ids >= vocab)).any()):
        raise UserError(f"{where}: d2t maps draft ids outside the target vocabulary (size {vocab})")
    if target_ids.unique().numel() != draft_vocab:
        raise UserError(f"{where}: d2t maps two draft ids to the same target id")
    if int(t2d.bool().sum()) != draft_vocab or not bool(t2d.bool().cpu()[target_ids].all()):
        raise UserError(f"{where}: t2d and d2t disagree about which target ids the draft vocabulary holds")


def draft_vocabulary(input_ids: list[list[int]], loss_mask: list[list[int]], size: int, vocab_size: int) -> Tensor:
    """The ``size`` most frequent assistant tokens (ties by id), sorted; padded with the lowest unused
    ids when the data holds fewer distinct tokens."""
    counts: Counter[int] = Counter()
    for ids, mask in zip(input_ids, loss_mask):
        counts.update(t for t, m in zip(ids, mask) if m)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    if len(ranked) < size:
        seen = set(ranked)
        ranked += [t for t in range(vocab_size) if t not in seen][: size - len(ranked)]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def random_vocabulary(size: int, vocab_size: int, generator: torch.Generator) -> Tensor:
    """A seeded random draft vocabulary: ``size`` distinct target ids, sorted."""
    return torch.randperm(vocab_size, generator=generator)[:size].sort().values


__all__ = ["vocab_maps", "target_ids_of", "check_vocab_maps", "draft_vocabulary", "random_vocabulary"]
