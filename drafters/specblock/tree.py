"""SpecBlock's rank-driven tree, grown from block outputs (no model calls here).

One block output is K slots: slot k's distribution is the token k+1 places below the block's parent
node. From it :func:`grow` adds to a :class:`~specbench.tree.TreeBuilder` (scores = cumulative
log-probs):

* the greedy chain g(0) .. g(K-1) below the parent;
* alternatives per slot: slot k gets ``topk - 1`` siblings of g(k) (the next best tokens of slot
  k), ``topk`` chosen by the rank head's class of slot k (``slot_topk``, upstream ``RANK_SLOT_TOPK``
  "slim_r2" = (2, 4, 6, 4)); in block 1, slot 0 always gets ``slot0_topk`` (upstream: beam_width).
  A give-up class with topk 0 stops branching at that slot;
* pending leaves for the next block: g(k) and the alternatives of every slot that branched (topk > 1),
  plus the chain end g(K-1) ("hitchhike") unless the rank walk gave up (the first slot the rank head
  does not call rank 1 is predicted give-up, class 3). A pending leaf at slot k continues from slot
  k's draft hidden state and sees that block's slots 0..k.

Duplicates merge (``TreeBuilder.child``): a later block predicting a token already in the tree
continues from the existing node. :func:`beam` keeps the pending leaves with the best cumulative
log-probs, at most ``min(beam_width, remaining budget // K)`` of them (upstream's adaptive beam).
With ``adaptive`` (the drafter's ``adaptive_topk``, on by default as in upstream's production settings),
confident slots get fewer candidates (:func:`adaptive_topk`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from specbench.tree import TreeBuilder

GIVE_UP = 3  # rank class "> 10": the draft has lost the target


@dataclass(frozen=True)
class Leaf:
    """A pending leaf: a tree node that the next block expands."""

    node: int
    score: float
    source: int  # the row of the block output it continues from (0 for block 1)
    slot: int  # the slot whose hidden state conditions the next block


def adaptive_topk(base: int, p: float, slot0: bool) -> int:
    """Upstream's confidence cuts (its production defaults ADAPTIVE_SLOT0=1, ADAPTIVE_ALL=1): block 1's slot 0
    keeps 3 / 5 / 8 candidates when its greedy probability is >= 0.9 / 0.8 / 0.6; any other slot keeps at most
    2 / 3 when it is >= 0.95 / 0.85."""
    if slot0:
        return min(3, base) if p >= 0.9 else min(5, base) if p >= 0.8 else min(8, base) if p >= 0.6 else base
    return min(2, base) if p >= 0.95 else min(3, base) if p >= 0.85 else base


def grow(builder: TreeBuilder, parent: int, logp: Tensor, ranks: list[int], slot_topk: tuple[int, ...],
         to_target, slot0_topk: int | None = None, source: int = 0,
         node_outputs: dict[int, tuple[int, int]] | None = None, call: int = 0, adaptive: bool = False) -> list[Leaf]:
    """Add one block output's chain and alternatives below ``parent``; return the pending leaves.

    logp [K, Vd] log-probs (float, CPU), ranks [K] rank classes; ``to_target`` maps draft ids to
    target ids. ``node_outputs`` (optional) records for every new node which (call, row * K + slot)
    output predicts ITS children, for the adaptation's labels.
    """
    k_slots = logp.shape[0]
    widest = max(max(slot_topk), slot0_topk or 1, 1)
    top = torch.topk(logp, min(widest, logp.shape[-1]), dim=-1)
    top_ids = to_target(top.indices).tolist()
    top_lp = top.values.tolist()
    # the rank walk (upstream _walk_rank_slots): give up when the first non-rank-1 slot says "> 10"
    first = next((k for k, r in enumerate(ranks) if r != 0), None)
    give_up = first is not None and ranks[first] == GIVE_UP
    chain: list[int] = []
    prev, prev_score = parent, builder.scores[parent]
    for k in range(k_slots):
        node = builder.child(prev, top_ids[k][0], prev_score + top_lp[k][0])
        chain.append(node)
        if node_outputs is not None and k > 0:
            node_outputs.setdefault(prev, (call, source * k_slots + k))
        prev, prev_score = node, builder.scores[node]
    if node_outputs is not None:
        node_outputs.setdefault(parent, (call, source * k_slots))
    leaves: list[Leaf] = []
    branched = set()
    for k in range(k_slots):
        first_slot = k == 0 and slot0_topk is not None
        topk = slot0_topk if first_slot else slot_topk[ranks[k]]
        if topk == 0 and ranks[k] == GIVE_UP:
            break
        if adaptive:
            topk = adaptive_topk(topk, math.exp(top_lp[k][0]), first_slot)
        if topk <= 1:
            continue
        branched.add(k)
        above = parent if k == 0 else chain[k - 1]
        base = builder.scores[above]
        leaves.append(Leaf(chain[k], builder.scores[chain[k]], source, k))
        for j in range(1, min(topk, len(top_ids[k]))):
            alt = builder.child(above, top_ids[k][j], base + top_lp[k][j])
            leaves.append(Leaf(alt, builder.scores[alt], source, k))
    if not give_up and (k_slots - 1) not in branched:
        leaves.append(Leaf(chain[-1], builder.scores[chain[-1]], source, k_slots - 1))
    return leaves


def beam(leaves: list[Leaf], width: int) -> list[Leaf]:
    """The ``width`` best distinct leaves by cumulative log-prob (ties: first pending first)."""
    seen: set[int] = set()
    unique = []
    for leaf in leaves:
        if leaf.node not in seen:
            seen.add(leaf.node)
            unique.append(leaf)
    order = sorted(range(len(unique)), key=lambda i: (-unique[i].score, i))
    return [unique[i] for i in order[: max(width, 0)]]


__all__ = ["Leaf", "grow", "beam", "adaptive_topk", "GIVE_UP"]
