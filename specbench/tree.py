"""Draft trees and the pure helpers that read them.

Vocabulary (used everywhere in specbench; see also decode.py):

* The committed sequence is ``x[0..L)``. The target's KV cache holds positions ``[0, L-1)``.
* The *root* is the last committed token ``x[L-1]``: it was sampled from the previous logits but
  has not yet been run through the target. Its position ``L-1`` is called ``pos``.
* A :class:`DraftTree` has node 0 = root, ``parents[0] == -1`` and ``parents[i] < i`` (nodes are
  topologically ordered). A chain is the tree with parents ``[-1, 0, 1, ...]``.
* Node ``i`` sits at position ``pos + depth[i]``. The verify attention mask lets node ``i`` see
  the whole committed prefix plus its ancestors and itself.
* The target's logits at node ``i`` are the distribution of ``i``'s child.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class DraftTree:
    """A tree of draft tokens rooted at the last committed token."""

    tokens: Tensor  # [N] int64, node 0 = root
    parents: Tensor  # [N] int64, parents[0] == -1, parents[i] < i
    # [N, V] float: the distribution node i's children were sampled from (temperature > 0 only).
    # None means the children were chosen deterministically (top-k, argmax, lookup).
    draft_probs: Tensor | None = None
    n_forwards: int = 0  # drafter forward passes spent building this tree (a cost, reported per step)

    def __post_init__(self) -> None:
        check_tree(self.tokens, self.parents)
        if self.draft_probs is not None and self.draft_probs.shape[0] != self.tokens.shape[0]:
            raise ValueError("draft_probs must have one row per node")

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


def check_tree(tokens: Tensor, parents: Tensor) -> None:
    """Raise ValueError unless (tokens, parents) is a well-formed, topologically ordered tree."""
    if tokens.dim() != 1 or parents.dim() != 1 or tokens.shape != parents.shape:
        raise ValueError(f"tokens and parents must be 1-D of equal length, got {tuple(tokens.shape)} and {tuple(parents.shape)}")
    if tokens.numel() == 0:
        raise ValueError("a draft tree needs at least the root")
    if int(parents[0]) != -1:
        raise ValueError("parents[0] must be -1 (node 0 is the root)")
    idx = torch.arange(parents.numel(), device=parents.device)
    if parents.numel() > 1 and not bool(((parents[1:] >= 0) & (parents[1:] < idx[1:])).all()):
        raise ValueError("every non-root node needs a parent with a smaller index")


def root_only(root_token: int, device: torch.device | str = "cpu") -> DraftTree:
    """The tree with no drafts (what the AR baseline proposes)."""
    return DraftTree(
        tokens=torch.tensor([root_token], dtype=torch.long, device=device),
        parents=torch.tensor([-1], dtype=torch.long, device=device),
    )


def chain(tokens: Tensor | list[int]) -> DraftTree:
    """A chain: tokens[0] is the root, each later token is the child of the one before it."""
    t = torch.as_tensor(tokens, dtype=torch.long)
    parents = torch.arange(-1, t.numel() - 1, dtype=torch.long, device=t.device)
    return DraftTree(tokens=t, parents=parents)


def from_paths(root_token: int, paths: list[list[int]]) -> DraftTree:
    """A tree holding every path (a list of draft tokens below the root); shared prefixes merge.

    Node order is breadth-first by insertion, so parents always precede children.
    """
    tokens = [int(root_token)]
    parents = [-1]
    children: dict[tuple[int, int], int] = {}
    for path in paths:
        node = 0
        for tok in path:
            key = (node, int(tok))
            if key not in children:
                children[key] = len(tokens)
                tokens.append(int(tok))
                parents.append(node)
            node = children[key]
    return DraftTree(tokens=torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long))


def is_chain(parents: Tensor) -> bool:
    """True when node i's parent is i - 1 for every i (the root alone is a chain)."""
    expected = torch.arange(-1, parents.numel() - 1, device=parents.device)
    return bool(torch.equal(parents, expected))


def depths(parents: Tensor) -> Tensor:
    """[N] depth of every node (root 0). Parents precede children, so one pass suffices."""
    p = parents.tolist()
    d = [0] * len(p)
    for i in range(1, len(p)):
        d[i] = d[p[i]] + 1
    return torch.tensor(d, dtype=torch.long, device=parents.device)


def ancestor_mask(parents: Tensor) -> Tensor:
    """[N, N] bool: mask[i, j] is True when j is i itself or one of i's ancestors."""
    n = parents.numel()
    p = parents.tolist()
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        mask[i, i] = True
        if i > 0:
            mask[i] |= mask[p[i]]
    return mask.to(parents.device)


def path_to(parents: Tensor, node: int) -> list[int]:
    """Node ids from the root down to ``node`` (both included)."""
    out = []
    p = parents.tolist()
    while node != -1:
        out.append(node)
        node = p[node]
    return out[::-1]


def children_lists(parents: Tensor) -> list[list[int]]:
    """children_lists(parents)[i] = the children of node i, in node order."""
    kids: list[list[int]] = [[] for _ in range(parents.numel())]
    for i, par in enumerate(parents.tolist()):
        if par >= 0:
            kids[par].append(i)
    return kids
