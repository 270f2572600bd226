"""Prompt-lookup (n-gram) drafting: training-free, no model.

Match the last n committed tokens (n from ``max_n`` down to ``min_n``) against everything
committed so far (prompt + output) and propose what followed the match. With ``branches = 1``
(the default) the proposal is one chain from the most recent match of the longest n-gram; with
``branches > 1`` up to that many distinct continuations (most recent first, longer n-grams first)
are merged into a tree.

Choices of our own: the most recent match wins (upstream prompt lookup decoding takes the first),
since recent context tends to repeat; an n-gram index is kept up to date incrementally, so each
proposal costs O(branches * num_draft) instead of a scan of the history.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from specbench.drafter import DraftContext, Drafter, Sampling
from specbench.tree import DraftTree, from_paths


@dataclass(frozen=True)
class NGramConfig:
    max_n: int = 3  # longest suffix to match
    min_n: int = 1  # shortest suffix to match
    num_draft: int = 7  # draft tokens per branch (chain length below the root)
    branches: int = 1  # 1 = chain; >1 = a tree of that many distinct continuations

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")
        if self.num_draft < 1 or self.branches < 1:
            raise ValueError("num_draft and branches must be at least 1")


class NGramDrafter(Drafter):
    description = "prompt lookup: propose what followed the last n-gram earlier in prompt + output (chain or tree)"
    Config = NGramConfig
    test_options = ((), ("branches=3",))
    feature_layers: tuple[int, ...] = ()

    def __init__(self, target, config: NGramConfig | None = None):
        self.config = config or NGramConfig()
        self.reset(Sampling())

    def reset(self, sampling: Sampling) -> None:
        self.history: list[int] = []
        # index[n][ngram] = end positions (exclusive) of earlier occurrences, oldest first
        self.index: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: defaultdict(list) for n in range(self.config.min_n, self.config.max_n + 1)
        }

    def _extend(self, tokens: list[int]) -> None:
        for tok in tokens:
            self.history.append(tok)
            end = len(self.history)
            for n, table in self.index.items():
                if end >= n:
                    table[tuple(self.history[end - n : end])].append(end)

    def continuations(self) -> list[list[int]]:
        """Distinct continuations, best first (longest n-gram, then most recent match)."""
        cfg = self.config
        hist = self.history
        found: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(cfg.max_n, cfg.min_n - 1, -1):
            if len(hist) < n:
                continue
            ends = self.index[n].get(tuple(hist[-n:]), [])
            for end in reversed(ends):
                if end >= len(hist):  # the suffix itself
                    continue
                cont = hist[end : end + cfg.num_draft]
                if cont and tuple(cont) not in seen:
                    seen.add(tuple(cont))
                    found.append(cont)
                    if len(found) == cfg.branches:
                        return found
        return found

    def propose(self, ctx: DraftContext) -> DraftTree:
        self._extend(ctx.tokens.tolist())
        tree = from_paths(self.history[-1], self.continuations())
        return DraftTree(tokens=tree.tokens.to(ctx.tokens.device), parents=tree.parents.to(ctx.tokens.device))
