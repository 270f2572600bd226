"""Prompt-lookup (n-gram) drafting: training-free, no model.

Match the last n committed tokens (n from ``max_n`` down to ``min_n``) against everything
committed so far (prompt + output, as transformers' prompt lookup does) and propose what followed
the match, at most ``num_draft`` tokens and never past a stop token (upstream cuts at eos too). The
longest n with any earlier occurrence wins; among its occurrences, ``match`` picks:

* ``first``: the earliest occurrence (transformers' ``PromptLookupCandidateGenerator``);
* ``recent``: the most recent occurrence (recent context tends to repeat);
* ``longest``: the occurrence whose preceding context agrees with the current suffix furthest back
  (beyond n, up to ``context`` tokens; the last ``candidates`` occurrences are compared), ties to
  the one with the longer available continuation, then the most recent. A cheap stand-in for a
  suffix-tree lookup of the longest matching context.

With ``branches = 1`` (the default) the proposal is one chain; with ``branches > 1`` up to that
many distinct continuations (in the order above, longer n-grams first) are merged into a tree.
An n-gram index is kept up to date incrementally, so a proposal never scans the whole history.
The defaults were chosen by ``python -m specbench.replay ngram`` (reports/training-free.md).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from specbench.drafter import DraftContext, Drafter, Sampling
from specbench.tree import DraftTree, from_paths

MATCH_RULES = ("first", "recent", "longest")


@dataclass(frozen=True)
class NGramConfig:
    max_n: int = 3  # longest suffix to match
    min_n: int = 2  # shortest suffix to match (1-token matches cost more verify time than they earn on CPU)
    num_draft: int = 7  # draft tokens per branch (chain length below the root)
    branches: int = 1  # 1 = chain; >1 = a tree of that many distinct continuations
    match: str = "longest"  # which occurrence of the n-gram: first | recent | longest
    context: int = 32  # longest rule: compare at most this many tokens of preceding context
    candidates: int = 64  # longest rule: compare at most this many (most recent) occurrences

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")
        if self.num_draft < 1 or self.branches < 1:
            raise ValueError("num_draft and branches must be at least 1")
        if self.match not in MATCH_RULES:
            raise ValueError(f"match must be one of {', '.join(MATCH_RULES)}, got '{self.match}'")
        if self.context < 1 or self.candidates < 1:
            raise ValueError("context and candidates must be at least 1")


class NGramDrafter(Drafter):
    description = "prompt lookup: propose what followed the last n-gram earlier in prompt + output (chain or tree)"
    Config = NGramConfig
    test_options = ((), ("branches=3",), ("match=first", "max_n=2", "num_draft=4"), ("match=recent", "branches=2"))
    feature_layers: tuple[int, ...] = ()

    def __init__(self, target, config: NGramConfig | None = None):
        self.config = config or NGramConfig()
        self.stop = frozenset(int(t) for t in getattr(target, "stop_token_ids", ()) or ())
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

    def _continuation(self, end: int) -> list[int]:
        cont = self.history[end : end + self.config.num_draft]
        for i, tok in enumerate(cont):
            if tok in self.stop:  # a stop token ends the draft (drafting past it is wasted)
                return cont[: i + 1]
        return cont

    def _agreement(self, end: int, n: int) -> int:
        """How many tokens before the occurrence ending at ``end`` agree with the current suffix."""
        hist, cap = self.history, self.config.context
        length = len(hist)
        k = n
        while k < cap and end - k - 1 >= 0 and hist[end - k - 1] == hist[length - k - 1]:
            k += 1
        return k

    def _ordered(self, ends: list[int], n: int) -> list[int]:
        """The occurrences (end positions, the suffix itself excluded) in the order of the match rule."""
        length = len(self.history)
        rule = self.config.match
        if rule == "first":
            return [e for e in ends if e < length]
        recent = [e for e in reversed(ends) if e < length]
        if rule == "recent":
            return recent
        cands = recent[: self.config.candidates]
        # stable sort of most-recent-first: ties keep recency
        return sorted(cands, key=lambda e: (-self._agreement(e, n), -min(length - e, self.config.num_draft)))

    def continuations(self) -> list[list[int]]:
        """Distinct continuations, best first (longest n-gram, then the match rule)."""
        cfg = self.config
        hist = self.history
        found: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(cfg.max_n, cfg.min_n - 1, -1):
            if len(hist) < n:
                continue
            ends = self.index[n].get(tuple(hist[-n:]))
            if not ends:
                continue
            for end in self._ordered(ends, n):
                cont = self._continuation(end)
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
