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

Building trees. :class:`TreeBuilder` is the one way drafters grow a tree: ``add(parent, token,
score)`` returns the node id (node 0 is the root, score 0), :meth:`TreeBuilder.prune` keeps the
``budget`` best nodes by score with every kept node's ancestors (ancestor closure), and
:meth:`TreeBuilder.build` returns the :class:`DraftTree`. :class:`BestFirst` is the heap that
best-first expansion pops from (ties: first pushed, first popped). A :class:`DraftTree` computes its
node depths and ancestor mask once, vectorised (binary lifting: no per-node Python loop and no
host synchronisation, so they stay on the GPU).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

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
    # Facts known on the host when the tree was built (TreeBuilder, chain, root_only): whether it is a
    # chain, and that it is well formed. Given, they save the device round trips of checking them.
    chain: bool | None = field(default=None, compare=False, repr=False)
    checked: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.checked:
            chain = check_tree(self.tokens, self.parents)  # one host round trip for both facts
            if self.chain is None:
                object.__setattr__(self, "chain", chain)
        if self.draft_probs is not None and self.draft_probs.shape[0] != self.tokens.shape[0]:
            raise ValueError("draft_probs must have one row per node")

    @property
    def is_chain(self) -> bool:
        """True when node i's parent is i - 1 for every i (known without a device round trip when
        the tree was built on the host)."""
        if self.chain is None:
            object.__setattr__(self, "chain", is_chain(self.parents))
        return bool(self.chain)

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @cached_property
    def depth(self) -> Tensor:
        """[N] int64 depth of every node (root 0), computed once."""
        return depths(self.parents)

    @cached_property
    def ancestors(self) -> Tensor:
        """[N, N] bool verify mask: [i, j] is True when j is i or one of i's ancestors; computed once."""
        return ancestor_mask(self.parents, self.depth)


def check_tree(tokens: Tensor, parents: Tensor) -> bool:
    """Raise ValueError unless (tokens, parents) is a well-formed, topologically ordered tree; return
    whether it is a chain. The facts come to the host in one transfer (one sync on a GPU)."""
    if tokens.dim() != 1 or parents.dim() != 1 or tokens.shape != parents.shape:
        raise ValueError(f"tokens and parents must be 1-D of equal length, got {tuple(tokens.shape)} and {tuple(parents.shape)}")
    if tokens.numel() == 0:
        raise ValueError("a draft tree needs at least the root")
    idx = torch.arange(parents.numel(), device=parents.device)
    rest_ok = ((parents[1:] >= 0) & (parents[1:] < idx[1:])).all()
    chain = (parents == idx - 1).all()
    root_ok, rest_ok, chain = torch.stack([parents[0] == -1, rest_ok, chain]).tolist()
    if not root_ok:
        raise ValueError("parents[0] must be -1 (node 0 is the root)")
    if not rest_ok:
        raise ValueError("every non-root node needs a parent with a smaller index")
    return bool(chain)


def root_only(root_token: int, device: torch.device | str = "cpu") -> DraftTree:
    """The tree with no drafts (what the AR baseline proposes)."""
    return DraftTree(
        tokens=torch.tensor([root_token], dtype=torch.long, device=device),
        parents=torch.tensor([-1], dtype=torch.long, device=device),
        chain=True, checked=True,
    )


def chain(tokens: Tensor | list[int]) -> DraftTree:
    """A chain: tokens[0] is the root, each later token is the child of the one before it."""
    t = torch.as_tensor(tokens, dtype=torch.long)
    parents = torch.arange(-1, t.numel() - 1, dtype=torch.long, device=t.device)
    return DraftTree(tokens=t, parents=parents, chain=True, checked=t.dim() == 1 and t.numel() > 0)


def from_paths(root_token: int, paths: list[list[int]]) -> DraftTree:
    """A tree holding every path (a list of draft tokens below the root); shared prefixes merge.

    Node order is breadth-first by insertion, so parents always precede children.
    """
    builder = TreeBuilder(root_token)
    for path in paths:
        node = 0
        for tok in path:
            node = builder.child(node, int(tok))
    return builder.build()


def is_chain(parents: Tensor) -> bool:
    """True when node i's parent is i - 1 for every i (the root alone is a chain)."""
    expected = torch.arange(-1, parents.numel() - 1, device=parents.device)
    return bool(torch.equal(parents, expected))


def depths(parents: Tensor) -> Tensor:
    """[N] depth of every node (root 0), by pointer jumping: ceil(log2 N) vectorised steps."""
    up = parents.clamp(min=0)
    dist = (parents >= 0).long()  # distance from i to up[i]
    for _ in range(max(1, math.ceil(math.log2(max(parents.numel(), 2))))):
        dist = dist + dist[up]
        up = up[up]
    return dist


def ancestor_mask(parents: Tensor, depth: Tensor | None = None) -> Tensor:
    """[N, N] bool: mask[i, j] is True when j is i itself or one of i's ancestors.

    Pointer jumping on rows: with M_k[i] = i's ancestors-or-self at distance < 2**k and up_k[i] its
    2**k-th ancestor (the root maps to itself), M_{k+1}[i] = M_k[i] | M_k[up_k[i]]; ceil(log2 N)
    steps of one row gather each, no per-node loop and no host synchronisation. (``depth`` is
    accepted for callers that have it; it is not needed.)
    """
    n = parents.numel()
    mask = torch.eye(n, dtype=torch.bool, device=parents.device)
    up = parents.clamp(min=0)
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        mask = mask | mask[up]
        up = up[up]
    return mask


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


# --------------------------------------------------------------------------- building trees


class TreeBuilder:
    """Grows a draft tree node by node; node 0 is the root (score 0).

    ``score`` is whatever the drafter ranks nodes by (usually the cumulative log-prob of the
    path). Nodes get ids in the order they are added, so a parent always precedes its children.
    """

    def __init__(self, root_token: int):
        self.tokens: list[int] = [int(root_token)]
        self.parents: list[int] = [-1]
        self.scores: list[float] = [0.0]
        self.depth: list[int] = [0]
        self._children: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, score: float = 0.0) -> int:
        """Add a child of ``parent``; returns its node id."""
        if not 0 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} is not a node of this tree ({len(self.tokens)} nodes)")
        node = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.scores.append(float(score))
        self.depth.append(self.depth[parent] + 1)
        self._children.setdefault((int(parent), int(token)), node)
        return node

    def child(self, parent: int, token: int, score: float = 0.0) -> int:
        """The child of ``parent`` holding ``token``, added if there is none (merges duplicates)."""
        found = self._children.get((int(parent), int(token)))
        return self.add(parent, token, score) if found is None else found

    def prune(self, budget: int) -> Tensor:
        """Ids (ascending) of the ``budget`` best nodes, the root included, ancestor-closed (:func:`best_closed`)."""
        return best_closed(torch.tensor(self.scores, dtype=torch.float64), torch.tensor(self.parents), budget)

    def build(self, budget: int | None = None, n_forwards: int = 0, device: torch.device | str = "cpu",
              draft_probs: Tensor | None = None) -> DraftTree:
        """The DraftTree of every node, or of :meth:`prune` (``budget``) when given."""
        tokens, parents = torch.tensor(self.tokens, dtype=torch.long), torch.tensor(self.parents, dtype=torch.long)
        if budget is not None:
            tokens, parents = subtree(tokens, parents, self.prune(budget))
        # well formed by construction (add() checks every parent); the chain test runs on the host copy
        return DraftTree(tokens=tokens.to(device), parents=parents.to(device), draft_probs=draft_probs,
                         n_forwards=n_forwards, chain=is_chain(parents), checked=True)


def best_closed(scores: Tensor, parents: Tensor, budget: int) -> Tensor:
    """Ids (ascending) of the ``budget`` best nodes of a tree, the root included, ancestor-closed.

    A node ranks by the lowest score on its path from the root (computed by pointer jumping), so
    it never outranks an ancestor; ties go to the smaller id, which an ancestor always has. The
    ``budget`` best are therefore closed under ancestors. With cumulative log-probs (a child never
    scores above its parent) this is simply the ``budget`` best scores.
    """
    n = parents.numel()
    if budget >= n:
        return torch.arange(n, device=parents.device)
    eff = scores.clone()
    up = parents.clamp(min=0)
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        eff = torch.minimum(eff, eff[up])
        up = up[up]
    eff[0] = math.inf  # the root is always kept
    order = torch.sort(eff, descending=True, stable=True).indices
    return order[: max(budget, 1)].sort().values


def subtree(tokens: Tensor, parents: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Tokens and re-numbered parents of the ancestor-closed node set ``keep`` (ascending, root first)."""
    new_id = torch.full((parents.numel(),), -1, dtype=torch.long, device=parents.device)
    new_id[keep] = torch.arange(keep.numel(), device=parents.device)
    kept_parents = parents[keep]
    remapped = torch.where(kept_parents >= 0, new_id[kept_parents.clamp(min=0)], kept_parents)
    if bool((remapped[1:] < 0).any()):
        raise ValueError("the kept nodes are not closed under ancestors")
    return tokens[keep], remapped


@dataclass
class BestFirst:
    """A max-heap of (score, item) for best-first expansion; ties pop in push order."""

    _heap: list[tuple[float, int, Any]] = field(default_factory=list)
    _count: int = 0

    def push(self, score: float, item: Any) -> None:
        heapq.heappush(self._heap, (-float(score), self._count, item))
        self._count += 1

    def pop(self) -> tuple[float, Any]:
        neg, _, item = heapq.heappop(self._heap)
        return -neg, item

    def __bool__(self) -> bool:
        return bool(self._heap)
