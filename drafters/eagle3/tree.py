"""EAGLE-3's dynamic draft tree (EAGLE-2's context-aware tree), built one depth at a time.

Vocabulary: a *candidate* is a (parent, token) pair the head proposed, scored by its cumulative
log-probability (the sum of the head's log-probs along its path from the root). Candidates get
global ids in the order they are created, so a parent's id is always smaller than its children's.

* depth 1: the root's ``top_k`` tokens are the candidates, and all of them are the frontier;
* depth d > 1: every frontier node gets its ``top_k`` tokens (``top_k ** 2`` candidates); the
  ``top_k`` best of them by cumulative log-prob are the next frontier;
* finally the ``budget`` best candidates over all depths are kept (upstream ``total_tokens - 1``),
  by :func:`specbench.tree.best_closed`.

The kept set is ancestor-closed: log-probs are <= 0, so a child never outscores its parent, and
ties are broken towards the smaller id (stable sort), which is the parent's. Nodes are emitted in
candidate-id order, so parents precede children and siblings come best first.

The builder is a plain local object of one ``propose`` call (no model calls, no module state): the
drafter runs the head on :attr:`frontier` between :meth:`start` / :meth:`step` calls.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.tree import DraftTree, best_closed, root_only, subtree


class DynamicTreeBuilder:
    def __init__(self, top_k: int):
        if top_k < 1:
            raise ValueError("top_k must be at least 1")
        self.top_k = top_k
        self._scores: list[Tensor] = []  # per depth: [c] cumulative log-probs (float32)
        self._tokens: list[Tensor] = []  # per depth: [c] token ids (draft vocabulary)
        self._parents: list[Tensor] = []  # per depth: [c] candidate id of the parent, -1 = the root
        self.count = 0  # candidates so far
        self.frontier = torch.empty(0, dtype=torch.long)  # [k] candidate ids of the frontier, best first
        self.frontier_scores = torch.empty(0)  # [k] their cumulative log-probs
        self.frontier_tokens = torch.empty(0, dtype=torch.long)  # [k] their tokens

    # ------------------------------------------------------------ growing
    def start(self, root_logprobs: Tensor) -> None:
        """Depth 1 from the root's log-probs [V]."""
        k = min(self.top_k, root_logprobs.shape[-1])
        top = torch.topk(root_logprobs.float(), k)
        ids = self._add(top.values.clamp(max=0.0), top.indices, torch.full((k,), -1, dtype=torch.long, device=top.indices.device))
        self.frontier, self.frontier_scores, self.frontier_tokens = ids, self._scores[-1], top.indices

    def step(self, logprobs: Tensor) -> Tensor:
        """One depth deeper from the frontier's log-probs [k, V] (row i = frontier node i's children).

        Returns [k'] the row (index into the old frontier) of each new frontier node's parent, which
        the drafter uses to pick the hidden states and tree-mask rows to carry forward.
        """
        kf, vocab = logprobs.shape
        if kf != self.frontier.numel():
            raise ValueError(f"expected {self.frontier.numel()} rows of log-probs, got {kf}")
        k = min(self.top_k, vocab)
        top = torch.topk(logprobs.float(), k, dim=-1)  # [kf, k], each row best first
        cumulative = (self.frontier_scores[:, None] + top.values.clamp(max=0.0)).flatten()  # [kf * k]
        parents = self.frontier.repeat_interleave(k)
        tokens = top.indices.flatten()
        ids = self._add(cumulative, tokens, parents)
        order = torch.sort(cumulative, descending=True, stable=True).indices[: self.top_k]
        self.frontier, self.frontier_scores, self.frontier_tokens = ids[order], cumulative[order], tokens[order]
        return order // k

    def _add(self, scores: Tensor, tokens: Tensor, parents: Tensor) -> Tensor:
        ids = torch.arange(self.count, self.count + scores.numel(), device=scores.device)
        self._scores.append(scores)
        self._tokens.append(tokens)
        self._parents.append(parents.to(scores.device))
        self.count += scores.numel()
        return ids

    # ------------------------------------------------------------ reading
    @property
    def scores(self) -> Tensor:
        """[C] cumulative log-prob of every candidate, by id."""
        return torch.cat(self._scores)

    @property
    def tokens(self) -> Tensor:
        """[C] token (draft vocabulary) of every candidate, by id."""
        return torch.cat(self._tokens)

    @property
    def parents(self) -> Tensor:
        """[C] parent candidate id of every candidate (-1 = the root)."""
        return torch.cat(self._parents)

    def to_tree(self, root_token: int, budget: int, token_map=None, n_forwards: int = 0) -> DraftTree:
        """The DraftTree of the root plus the ``budget`` best candidates (by cumulative log-prob,
        ties to the older candidate: :func:`specbench.tree.best_closed`).

        ``token_map`` turns candidate tokens into target ids (e.g. the head's d2t map).
        """
        if self.count == 0:
            return root_only(root_token, device=self.frontier.device)
        tokens = self.tokens if token_map is None else token_map(self.tokens)
        root = torch.tensor([int(root_token)], dtype=torch.long, device=tokens.device)
        # node 0 is the root, candidate c is node c + 1
        all_tokens = torch.cat([root, tokens.long()])
        parents = torch.cat([torch.full_like(root, -1), self.parents + 1])
        scores = torch.cat([torch.zeros(1, device=tokens.device), self.scores])
        keep = best_closed(scores, parents, budget + 1)
        kept_tokens, kept_parents = subtree(all_tokens, parents, keep)
        return DraftTree(tokens=kept_tokens, parents=kept_parents, n_forwards=n_forwards)
