"""The autoregressive baseline: proposes only the root, so each step commits exactly one token.

It runs through the same decoding loop and the same target code as every drafter (a same-stack
baseline), which makes it the denominator of every speedup. tau = 1 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.drafter import DraftContext, Drafter, Sampling
from specbench.tree import DraftTree, root_only


@dataclass(frozen=True)
class ARConfig:
    pass


class ARDrafter(Drafter):
    description = "autoregressive baseline: no drafts, one token per target forward (tau = 1)"
    Config = ARConfig
    feature_layers: tuple[int, ...] = ()

    def __init__(self, target, config: ARConfig | None = None):
        self.config = config or ARConfig()

    def reset(self, sampling: Sampling) -> None:
        pass

    def propose(self, ctx: DraftContext) -> DraftTree:
        return root_only(int(ctx.tokens[-1]), device=ctx.tokens.device)
