"""The three block drafters: ``dflash``, ``jetspec`` and ``treeflash``.

They share the backbone (model.py) and this ``propose``; they differ only in the attention mask
inside the block (the checkpoint's ``causal`` flag) and in the tree they build from the one
forward's scores (:meth:`_BlockDrafter.build_tree`).

One ``propose``, one backbone forward (``DraftTree.n_forwards`` = 1; TreeFlash's correction pass,
batched or lazy, counts as a second):

1. the newly committed tokens' target features become context rows (the row of token x[p] is the
   target's state at position p-1: DraftContext.features), appended to every layer's context cache
   at their own positions; the first token of a sequence has no row. Rows of rejected drafts were
   never added (the tree's features are not the drafter's), so nothing is rolled back;
2. the block [root, MASK x (B-1)] at positions pos..pos+B-1 runs through the layers;
3. position d's logits (the target's lm_head on the final-normed state) score depth d.

Budgets COUNT THE ROOT everywhere (a tree of ``budget`` nodes is verified), as JetSpec's
``budget`` and TreeFlash's ``tree_size`` do. Children are chosen deterministically (argmax, top-k,
best-first), so ``draft_probs`` is None and the verifier's point-mass rule keeps sampling lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from drafters.block.checkpoint import read_block
from drafters.block.model import (
    BIDIRECTIONAL, BIDIRECTIONAL_WITH_CORRECTION, CAUSAL, Backbone, BlockModel, ContextCache, random_block_model,
)
from drafters.block.train import DFlashTraining, JetSpecTraining, TreeFlashTraining
from drafters.block.tree import accum_logp_tree, chain_tree, gap_caps, kbest_rows, kbest_tree, marginal_tables
from drafters.common.loading import checkpoint_dir, random_identity, shipped_checkpoint
from specbench.drafter import DraftContext, Drafter, Sampling
from specbench.tree import DraftTree


@dataclass(frozen=True)
class _Common:
    # "auto" = the drafter shipped for this target; "random" = seeded random init (tests); else a directory
    path: str = "auto"
    seed: int = 0  # random init only
    num_layers: int = 2  # random init only: drafter layers (= tapped target layers)
    block_size: int = 16  # random init only
    # random init only: a reduced draft vocabulary of this many (seeded random) ids, the variant's
    # shape (0 = the target's vocabulary); a checkpoint brings its own size and d2t/t2d maps
    draft_vocab_size: int = 0

    def __post_init__(self) -> None:
        if self.draft_vocab_size < 0:
            raise ValueError("draft_vocab_size must be >= 0 (0 = the target's vocabulary)")


class _BlockDrafter(Drafter):
    """A block family = a name, a :class:`Backbone`, a tree rule (:meth:`build_tree`) and a
    training recipe (:meth:`training`), each set by the family class below."""

    family: str  # the name in messages and in the shipped-checkpoint folder
    backbone: Backbone

    def __init__(self, target, config):
        self.config = config
        if config.path == "random":
            self.model: BlockModel = random_block_model(
                target, seed=config.seed, num_hidden_layers=config.num_layers, block_size=config.block_size,
                causal=self.backbone.causal, ar_approximation=self.backbone.ar_approximation,
                draft_vocab_size=config.draft_vocab_size or None, **self.random_extra())
            self.checkpoint = random_identity(self.model, config.seed)
        else:
            src = shipped_checkpoint(self.family, target.name) if config.path == "auto" else checkpoint_dir(config.path)
            self.model, self.checkpoint = read_block(src, target, self.family)
        self.backbone.check(self.model, self.family)
        self.feature_layers: tuple[int, ...] = self.model.config.feature_layers
        self.embed = target.model.get_input_embeddings().weight  # the target's, never copied
        # the rows of the target's lm_head the head scores (the target's own tensor when the vocabulary is full)
        self.lm_head = self.model.draft_lm_head(target.model.get_output_embeddings().weight)
        self.reset(Sampling())

    def random_extra(self) -> dict:
        """Family-specific BlockConfig fields of a random init."""
        return {}

    def reset(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.cache = ContextCache(self.model.config.num_hidden_layers)
        self.n_context = 0  # context rows cached (row p = the target's state at position p)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        model = self.model
        device = ctx.tokens.device
        root = int(ctx.tokens[-1])
        rows = ctx.new_rows()  # the first token of a sequence has no predecessor state: no row
        ctx_pos = rows.positions - 1  # context row p is the target's state at position p
        if rows.count and int(ctx_pos[0]) != self.n_context:
            raise RuntimeError(f"{self.family}: context cache holds {self.n_context} rows but new rows start at {int(ctx_pos[0])}")
        dtype = model.fc.weight.dtype
        context = model.context(rows.features.to(dtype))  # [r, H]
        block = model.block_embeds(self.embed[root].to(dtype), self.embed)
        b = model.config.block_size
        hidden = model.forward_block(block, torch.arange(ctx.pos, ctx.pos + b, device=device), context, ctx_pos, self.cache)
        self.n_context += context.shape[0]
        return self.build_tree(root, hidden)

    def build_tree(self, root: int, hidden: Tensor) -> DraftTree:
        raise NotImplementedError

    def depth_logits(self, hidden: Tensor) -> Tensor:
        """[B-1, Vd] float32 logits of depths 1..B-1 (over the draft vocabulary: :meth:`top` maps ids)."""
        return self.model.logits(hidden[1:], self.lm_head).float()

    def top(self, logp: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The top-``k`` (target ids, scores) of every row of ``logp`` [..., Vd]."""
        top = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
        return self.model.to_target_ids(top.indices), top.values


# --------------------------------------------------------------------------- DFlash


@dataclass(frozen=True)
class DFlashConfig(_Common):
    tree: str = "chain"  # chain (DFlash) or marginal (best-first over the per-depth marginals: DDTree)
    budget: int = 16  # nodes including the root (chain: at most block_size)
    top_k: int = 16  # marginal tree: candidates per depth

    def __post_init__(self) -> None:
        if self.tree not in ("chain", "marginal"):
            raise ValueError(f"tree must be 'chain' or 'marginal', got '{self.tree}'")
        if self.budget < 1 or self.top_k < 1:
            raise ValueError("budget and top_k must be at least 1")


class DFlashDrafter(_BlockDrafter):
    description = "DFlash: bidirectional block diffusion head, argmax chain or marginal best-first tree (tree=marginal)"
    Config = DFlashConfig
    family = "dflash"
    backbone = BIDIRECTIONAL
    test_options = (("block_size=8",), ("block_size=8", "tree=marginal", "budget=20", "top_k=4"),
                    ("block_size=8", "tree=marginal", "budget=20", "top_k=4", "draft_vocab_size=64"))

    @classmethod
    def training(cls):
        return DFlashTraining

    def build_tree(self, root: int, hidden: Tensor) -> DraftTree:
        logits = self.depth_logits(hidden)
        if self.config.tree == "chain":
            return chain_tree(root, self.model.to_target_ids(logits.argmax(-1)).cpu(), self.config.budget)
        return kbest_tree(root, *marginal_tables(*self.top(torch.log_softmax(logits, dim=-1), self.config.top_k)),
                          self.config.budget)


# --------------------------------------------------------------------------- JetSpec


@dataclass(frozen=True)
class JetSpecConfig(_Common):
    budget: int = 64  # nodes including the root (upstream: 64 / 128 / 256)
    width: int = 7  # top-W tokens per depth, shared by every parent at that depth
    gap_cap: float = 0.0  # fan-out 1 at depths whose top-1/top-2 log-prob gap exceeds this (0 = off)
    # accum: JetSpec's accum_logp (all children of a popped node at once); kbest: the lazy best-first
    # marginal tree over the same top-W per depth (one node per pop), to separate head from tree rule
    tree: str = "accum"

    def __post_init__(self) -> None:
        if self.budget < 1 or self.width < 1 or self.gap_cap < 0:
            raise ValueError("budget and width must be at least 1, gap_cap non-negative")
        if self.tree not in ("accum", "kbest"):
            raise ValueError(f"tree must be 'accum' or 'kbest', got '{self.tree}'")


class JetSpecDrafter(_BlockDrafter):
    description = "JetSpec: causal parallel block head, cumulative-log-prob best-first tree (budget, width)"
    Config = JetSpecConfig
    family = "jetspec"
    backbone = CAUSAL
    test_options = (("block_size=8", "budget=20", "width=4"), ("block_size=8", "budget=20", "width=4", "tree=kbest"),
                    ("block_size=8", "budget=20", "width=4", "gap_cap=2.0"),
                    ("block_size=8", "budget=20", "width=4", "draft_vocab_size=64"))

    @classmethod
    def training(cls):
        return JetSpecTraining

    def build_tree(self, root: int, hidden: Tensor) -> DraftTree:
        cfg = self.config
        logp = torch.log_softmax(self.depth_logits(hidden), dim=-1)
        tokens, values = self.top(logp, cfg.width)
        if cfg.tree == "kbest":
            return kbest_tree(root, *marginal_tables(tokens, values), cfg.budget)
        caps = gap_caps(values, cfg.gap_cap, cfg.width) if cfg.gap_cap > 0 else None
        return accum_logp_tree(root, tokens.cpu(), values.cpu(), cfg.budget, caps)


# --------------------------------------------------------------------------- TreeFlash


@dataclass(frozen=True)
class TreeFlashConfig(_Common):
    budget: int = 64  # tree_size: nodes including the root
    top_m: int = 16  # candidate previous tokens per depth (stage 2 rows)
    top_k: int = 16  # transitions kept per row
    ar_approximation: bool = True  # False = ignore the correction: the marginal best-first tree
    temperature: float = 1.0  # drafter temperature of the tree scores (upstream drafter_temperature)
    ar_intermediate_size: int = 0  # random init only: correction width (0 = the drafter's intermediate_size)
    # how stage 2 computes its (B-1) x top_m corrected rows: "batched" = all of them in one pass (upstream,
    # one wide matmul); "lazy" = only the rows the best-first search reaches (at most ``budget``), one at
    # a time: the same tree, a fraction of the lm_head work when budget << (B-1) * top_m (a CPU's case)
    stage2: str = "batched"

    def __post_init__(self) -> None:
        if self.budget < 1 or self.top_m < 1 or self.top_k < 1 or self.temperature <= 0:
            raise ValueError("budget, top_m and top_k must be at least 1, temperature positive")
        if self.stage2 not in ("batched", "lazy"):
            raise ValueError(f"stage2 must be 'batched' or 'lazy', got '{self.stage2}'")


class TreeFlashStage2:
    """TreeFlash stage 2 on one block forward: the top-m marginal candidates of every depth and, for a
    depth d = 1..B-1 and a previous token (the root at depth 1, else one of depth d-1's candidates), the
    top-k next tokens under the corrected logits. :meth:`rows` computes any set of table rows at once,
    so the batched tables and the on-demand rows are the same code."""

    def __init__(self, model: BlockModel, hidden: Tensor, root_embed: Tensor, embed: Tensor, lm_head: Tensor,
                 top_m: int, top_k: int, temperature: float = 1.0):
        self.model, self.hidden, self.embed, self.lm_head = model, hidden, embed, lm_head
        self.root_embed = root_embed.to(hidden.dtype)
        self.k, self.temperature = top_k, temperature
        marg = model.logits(hidden[:-1], lm_head)  # [B-1, Vd]: positions 0..B-2 (row 0's are replaced by the root)
        self.m = min(top_m, marg.shape[-1])
        self.cand = marg.topk(self.m, dim=-1).indices  # [B-1, m] draft ids
        self.n_depths = hidden.shape[0] - 1
        self.computed: dict[tuple[int, int], tuple[list, list, list]] = {}  # :meth:`row`'s, computed so far

    def rows(self, d: Tensor, i: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Table rows (d[n], i[n]) -> target-id tokens, log-probs and next-row indices, each [n, k] on
        the CPU (next row: the token's index among depth d+1's candidates, -1 if it is not one or at the
        last depth)."""
        prev = self.embed[self.model.to_target_ids(self.cand[d, i])].to(self.hidden.dtype)  # [n, H]
        prev[d == 0] = self.root_embed
        h = self.model.corrected(self.hidden[d + 1], prev)
        logp = torch.log_softmax(self.model.logits(h, self.lm_head).float() / self.temperature, dim=-1)
        top = logp.topk(min(self.k, logp.shape[-1]), dim=-1)
        nxt_cand = self.cand[torch.clamp(d + 1, max=self.n_depths - 1)]  # [n, m]
        match = top.indices[:, :, None] == nxt_cand[:, None, :]  # [n, k, m]
        nxt = torch.where(match.any(-1), match.float().argmax(-1), -1)
        nxt[d == self.n_depths - 1] = -1
        return self.model.to_target_ids(top.indices).cpu(), top.values.cpu(), nxt.cpu()

    def tables(self) -> tuple[Tensor, Tensor, Tensor]:
        """Every row at once: tokens, log-probs and next rows, each [B-1, m, k]."""
        d, i = torch.meshgrid(torch.arange(self.n_depths), torch.arange(self.m), indexing="ij")
        shape = (self.n_depths, self.m, -1)
        return tuple(t.reshape(shape) for t in self.rows(d.reshape(-1).to(self.cand.device), i.reshape(-1).to(self.cand.device)))

    def row(self, d: int, i: int) -> tuple[list, list, list]:
        """One row as lists (:func:`~drafters.block.tree.kbest_rows`' reader), computed when first asked for."""
        if (d, i) not in self.computed:
            at = torch.tensor([d], device=self.cand.device), torch.tensor([i], device=self.cand.device)
            self.computed[(d, i)] = tuple(t[0].tolist() for t in self.rows(*at))
        return self.computed[(d, i)]


def transition_tables(model: BlockModel, hidden: Tensor, root_embed: Tensor, embed: Tensor, lm_head: Tensor,
                      top_m: int, top_k: int, temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """TreeFlash stage 2, batched: for every depth d = 1..B-1 and each of the top-m marginal tokens of
    depth d-1 (the root at depth 1) as the previous token, the top-k next tokens under the corrected
    logits. Returns tokens, log-probs and next-row indices, each [B-1, m, k] (next row: the index of
    the token among depth d's top-m candidates, -1 if it is not one, always -1 at the last depth)."""
    return TreeFlashStage2(model, hidden, root_embed, embed, lm_head, top_m, top_k, temperature).tables()


class TreeFlashDrafter(_BlockDrafter):
    description = "TreeFlash: bidirectional block head + previous-token MLP, two-stage lazy k-best tree"
    Config = TreeFlashConfig
    family = "treeflash"
    backbone = BIDIRECTIONAL_WITH_CORRECTION
    test_options = (("block_size=8", "budget=20", "top_m=4", "top_k=4"),
                    ("block_size=8", "budget=12", "top_m=2", "top_k=3"),
                    ("block_size=8", "budget=20", "top_m=4", "top_k=4", "draft_vocab_size=64"),
                    ("block_size=8", "budget=20", "top_m=4", "top_k=4", "stage2=lazy"),
                    ("block_size=8", "budget=12", "top_m=2", "top_k=3", "stage2=lazy", "draft_vocab_size=64"))

    @classmethod
    def training(cls):
        return TreeFlashTraining

    def random_extra(self) -> dict:
        return {"ar_intermediate_size": self.config.ar_intermediate_size or None}

    def build_tree(self, root: int, hidden: Tensor) -> DraftTree:
        cfg = self.config
        model = self.model
        if cfg.ar_approximation and model.ar_approximation is not None:
            stage2 = TreeFlashStage2(model, hidden, self.embed[root], self.embed, self.lm_head, cfg.top_m, cfg.top_k, cfg.temperature)
            if cfg.stage2 == "lazy":
                return kbest_rows(root, stage2.row, stage2.n_depths, cfg.budget, n_forwards=2)
            return kbest_tree(root, *stage2.tables(), cfg.budget, n_forwards=2)
        logits = self.depth_logits(hidden)
        return kbest_tree(root, *marginal_tables(*self.top(torch.log_softmax(logits / cfg.temperature, dim=-1), cfg.top_k)),
                          cfg.budget)


__all__ = ["DFlashDrafter", "DFlashConfig", "JetSpecDrafter", "JetSpecConfig", "TreeFlashDrafter", "TreeFlashConfig",
           "transition_tables", "TreeFlashStage2", "Backbone", "BIDIRECTIONAL", "CAUSAL", "BIDIRECTIONAL_WITH_CORRECTION"]
