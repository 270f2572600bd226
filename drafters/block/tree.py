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
  :func:`kbest_rows` is the same search reading one row at a time, for tables computed on demand.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.tree import BestFirst, DraftTree, TreeBuilder


def chain_tree(root: int, tokens: Tensor, budget: int, n_forwards: int = 1) -> DraftTree:
    """Every depth's argmax token ([D] target ids) as a chain, at most ``budget`` nodes."""
    n = max(0, min(budget - 1, tokens.shape[0]))
    tree = TreeBuilder(root)
    node = 0
    for tok in tokens[:n].tolist():
        node = tree.add(node, tok)
    return tree.build(n_forwards=n_forwards)


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
    tree = TreeBuilder(root)
    frontier = BestFirst()
    frontier.push(0.0, 0)  # (score, node); ties pop the older node first
    while frontier and len(tree) < budget:
        score, node = frontier.pop()
        d = tree.depth[node]
        if d >= d_max:
            continue
        fan = min(width, caps[d] if caps is not None else width, budget - len(tree))
        for j in range(fan):  # ALL children of the popped node at once (the last expansion cut to fit)
            child = tree.add(node, toks[d][j], score + lps[d][j])
            frontier.push(tree.scores[child], child)
    return tree.build(n_forwards=n_forwards)


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
    tk, lp, nx = tokens.tolist(), logp.float().tolist(), next_row.tolist()
    return kbest_rows(root, lambda d, i: (tk[d][i], lp[d][i], nx[d][i]), len(tk), budget, n_forwards)


def kbest_rows(root: int, row, n_depths: int, budget: int, n_forwards: int = 1) -> DraftTree:
    """:func:`kbest_tree` reading its tables one row at a time: ``row(d, i)`` returns row (d, i)'s
    (tokens, log-probs, next rows) as lists, best first, all of one length k. Rows are asked for only
    when the search first needs them (row (0, 0), then a row when a node whose children it lists
    enters the tree), at most ``budget`` of them, so a caller may compute them on demand."""
    tree = TreeBuilder(root)
    pending = BestFirst()  # candidates (parent node, depth, table row, rank) not yet in the tree
    if budget > 1 and n_depths > 0:
        first = row(0, 0)
        if first[0]:
            pending.push(first[1][0], (0, 0, 0, 0))
    while pending and len(tree) < budget:
        score, (parent, d, r, rank) = pending.pop()  # a child at depth d + 1 from table row (d, r)
        tk, lp, nx = row(d, r)
        node = tree.add(parent, tk[rank], score)
        if rank + 1 < len(tk):  # its next sibling
            pending.push(score - lp[rank] + lp[rank + 1], (parent, d, r, rank + 1))
        if d + 1 < n_depths and nx[rank] >= 0 and len(tree) < budget:  # its first child
            pending.push(score + row(d + 1, nx[rank])[1][0], (node, d + 1, nx[rank], 0))
    return tree.build(n_forwards=n_forwards)


__all__ = ["chain_tree", "accum_logp_tree", "gap_caps", "marginal_tables", "kbest_tree", "kbest_rows"]
