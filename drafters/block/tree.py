"""Draft trees from one block forward: chain, per-depth best-first (JetSpec), lazy k-best (marginal / TreeFlash).

All builders are pure functions of the drafter's scores (no model calls), on the CPU, and count the
ROOT in ``budget``: the returned tree has at most ``budget`` nodes. Depth d (1..D) is block
position d; a node's score is the sum of the log-probs along its path from the root.

* :func:`chain_tree`: the argmax at every depth (DFlash's default), cut to ``budget`` nodes.
* :func:`accum_logp_tree`: JetSpec's ``accum_logp`` (hao-ai-lab/JetSpec
  ``jetflow/tree/baselines/accum_logp.py``): every parent at depth d gets the same top-W tokens
  of depth d+1; a heap pops the best node by cumulative log-prob and adds ALL its children at once
  (the last expansion is cut to fit the budget), until the budget is spent. ``caps`` bounds the
  fan-out per depth (:func:`gap_caps`).
* :func:`kbest_tree`: TreeFlash's lazy best-first over transition tables (ETH-DISCO/TreeFlash
  ``tree_flash.py``): one node per pop; popping a node pushes its next sibling and its first child.
  With one table row per depth (:func:`marginal_tables`) it is the marginal best-first tree, the
  DDTree baseline: exactly the ``budget - 1`` best paths of the per-depth marginals.
"""

from __future__ import annotations

import heapq

import torch
from torch import Tensor

from specbench.tree import DraftTree


def _tree(root: int, tokens: list[int], parents: list[int], n_forwards: int) -> DraftTree:
    return DraftTree(tokens=torch.tensor([root] + tokens, dtype=torch.long),
                     parents=torch.tensor([-1] + parents, dtype=torch.long), n_forwards=n_forwards)


def chain_tree(root: int, logits: Tensor, budget: int, n_forwards: int = 1) -> DraftTree:
    """The argmax of every depth's logits [D, V] as a chain, at most ``budget`` nodes."""
    n = max(0, min(budget - 1, logits.shape[0]))
    drafts = logits[:n].argmax(-1).tolist()
    return _tree(root, drafts, list(range(n)), n_forwards)


def gap_caps(top_logp: Tensor, threshold: float, width: int) -> list[int]:
    """Per-depth fan-out: 1 where the top-1 / top-2 log-prob gap exceeds ``threshold`` (the drafter
    is confident: the siblings are unlikely to be the target's token), else ``width``.
    ``threshold`` <= 0 turns the cap off. Our rule: JetSpec's code has the per-depth cap hook
    (``build_with_per_depth_cap``) but the released rule is not specified."""
    d = top_logp.shape[0]
    if threshold <= 0 or top_logp.shape[1] < 2:
        return [width] * d
    gap = (top_logp[:, 0] - top_logp[:, 1]).tolist()
    return [1 if g > threshold else width for g in gap]


def accum_logp_tree(root: int, top_tokens: Tensor, top_logp: Tensor, budget: int, caps: list[int] | None = None,
                    n_forwards: int = 1) -> DraftTree:
    """JetSpec's tree from per-depth top-W tokens and log-probs ([D, W] each, best first)."""
    toks = top_tokens.tolist()
    lps = top_logp.float().tolist()
    d_max, width = len(toks), (len(toks[0]) if toks else 0)
    tokens: list[int] = []
    parents: list[int] = []
    depth = [0]
    score = [0.0]
    heap: list[tuple[float, int]] = [(0.0, 0)]  # (-score, node); node ids break ties (older first)
    n = 1
    while heap and n < budget:
        neg, node = heapq.heappop(heap)
        d = depth[node]
        if d >= d_max:
            continue
        fan = min(width, caps[d] if caps is not None else width, budget - n)
        for j in range(fan):
            tokens.append(toks[d][j])
            parents.append(node)
            depth.append(d + 1)
            score.append(-neg + lps[d][j])
            heapq.heappush(heap, (-score[-1], n))
            n += 1
    return _tree(root, tokens, parents, n_forwards)


def marginal_tables(top_tokens: Tensor, top_logp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Transition tables with one row per depth (every parent shares its depth's marginals).

    [D, k] -> tokens, log-probs [D, 1, k] and next-row indices [D, 1, k] (0: the child's own
    row; -1 at the last depth).
    """
    nxt = torch.zeros(top_tokens.shape[0], 1, top_tokens.shape[1], dtype=torch.long)
    nxt[-1] = -1
    return top_tokens[:, None].cpu(), top_logp[:, None].float().cpu(), nxt


def kbest_tree(root: int, tokens: Tensor, logp: Tensor, next_row: Tensor, budget: int, n_forwards: int = 1) -> DraftTree:
    """Lazy best-first tree over transition tables.

    tokens, logp, next_row: [D, m, k]. Row (d, i) lists, best first, the k children of a depth-d
    node (depth 0 = the root, which uses row (0, 0)) whose token is candidate i of depth d;
    ``next_row[d, i, j]`` is the row (at depth d+1) of child j, or -1 when it cannot be expanded.
    Popping a node adds it and pushes its next sibling and its first child; the heap is keyed by
    cumulative log-prob, ties broken by push order.
    """
    tk = tokens.tolist()
    lp = logp.float().tolist()
    nx = next_row.tolist()
    d_max, k = len(tk), (len(tk[0][0]) if tk else 0)
    out_tokens: list[int] = []
    out_parents: list[int] = []
    heap: list[tuple[float, int, int, int, int, int, float]] = []  # (-score, order, parent, d, row, rank, score)
    order = 0
    if budget > 1 and d_max > 0 and k > 0:
        heap.append((-lp[0][0][0], order, 0, 0, 0, 0, lp[0][0][0]))
    n = 1
    while heap and n < budget:
        _, _, parent, d, row, rank, sc = heapq.heappop(heap)  # a child at depth d + 1 from table row (d, row)
        out_tokens.append(tk[d][row][rank])
        out_parents.append(parent)
        node = n
        n += 1
        if rank + 1 < k:
            s2 = sc - lp[d][row][rank] + lp[d][row][rank + 1]
            order += 1
            heapq.heappush(heap, (-s2, order, parent, d, row, rank + 1, s2))
        child_row = nx[d][row][rank]
        if d + 1 < d_max and child_row >= 0:
            s3 = sc + lp[d + 1][child_row][0]
            order += 1
            heapq.heappush(heap, (-s3, order, node, d + 1, child_row, 0, s3))
    return _tree(root, out_tokens, out_parents, n_forwards)


__all__ = ["chain_tree", "accum_logp_tree", "gap_caps", "marginal_tables", "kbest_tree"]
