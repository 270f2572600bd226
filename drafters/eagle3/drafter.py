"""The EAGLE-3 drafter: a one-layer head over the target's fused low/mid/high features.

Feature taps (``feature_layers``): HF ``hidden_states`` indices, i.e. the hidden states ENTERING
layers (2, N//2, N-3) of an N-layer target (the upstream default, what SGLang and vLLM capture),
unless the checkpoint's config.json names others.

Rows and positions. ``DraftContext.features[i]`` is the target hidden state at the position before
``tokens[i]``. The head's row for the token at absolute position p is
(target embedding of x[p], fc(features of position p-1)); its output predicts x[p+1]. As upstream
(which drops ``input_ids[0]``), the first token of the sequence has no predecessor and gets no row,
so head cache slot j holds the row of token j+1, at RoPE position j (upstream's numbering; RoPE is
relative, so only the consistency matters).

One ``propose`` (one head forward per depth, ``DraftTree.n_forwards == depth``):

1. roll the head's KV cache back to the committed rows (the previous round's tree rows go);
2. forward 1: append the rows of the newly committed tokens with their TARGET features (accepted
   tokens are re-run with the target's features, replacing their self-fed draft rows); the last of
   them is the root's row, whose output gives the depth-1 candidates;
3. forwards 2..depth: the ``top_k`` frontier nodes, each fed (embedding of its token, the head's
   own pre-norm output at its parent), attend to every committed row plus their tree ancestors;
   the dynamic tree (tree.py) expands and re-selects the frontier;
4. keep the root + the ``total_tokens - 1`` best candidates by cumulative log-prob.

Budget: ``total_tokens`` COUNTS THE ROOT (the verified tree has at most ``total_tokens`` nodes), as
upstream's ``total_token`` does (``cnets.py`` keeps ``total_tokens - 1`` drafts plus the root).
Depth: ``depth`` is the deepest draft (= head forwards per round). Upstream's ``depth`` counts the
self-feeding forwards after the first one, so upstream ``depth=D`` reaches depth D+1: its default
(depth 7) corresponds to our ``depth=8``; the brief's default here is 7.

Sampling: the children are chosen deterministically (top-k), so ``draft_probs`` is None and the
verifier's point-mass rule keeps temperature > 0 lossless.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from drafters.common.loading import checkpoint_dir, random_identity, shipped_checkpoint
from drafters.eagle3.checkpoint import read_eagle3
from drafters.eagle3.model import Eagle3Head, default_feature_layers, new_cache, random_head
from drafters.eagle3.train import Eagle3Training
from drafters.eagle3.tree import DynamicTreeBuilder
from specbench.drafter import DraftContext, Drafter, Sampling
from specbench.tree import DraftTree, root_only


@dataclass(frozen=True)
class Eagle3Config:
    # "auto" = the head shipped for this target (drafters/checkpoints/eagle3-<target>); "random" = a
    # seeded random-init head (tests); anything else = a checkpoint directory (config.json + weights)
    path: str = "auto"
    depth: int = 7  # deepest draft = head forwards per round
    top_k: int = 10  # children per frontier node, and frontier width
    total_tokens: int = 60  # tree budget INCLUDING the root (upstream total_token convention)
    seed: int = 0  # random init only
    draft_vocab_size: int = 0  # random init only: reduced draft vocab (0 = the target's vocab)

    def __post_init__(self) -> None:
        if self.depth < 1 or self.top_k < 1 or self.total_tokens < 1:
            raise ValueError("depth, top_k and total_tokens must be at least 1")
        if self.draft_vocab_size < 0:
            raise ValueError("draft_vocab_size must be >= 0")


def shipped_head(target_name: str) -> Path:
    """The trained head that ships for ``target_name`` (package data), or a one-line UserError."""
    return shipped_checkpoint("eagle3", target_name)


class Eagle3Drafter(Drafter):
    description = "EAGLE-3: one-layer head on fused target features, dynamic top-k tree (--drafter-path CKPT)"
    Config = Eagle3Config
    test_options = (("depth=4", "top_k=3", "total_tokens=12"), ("depth=3", "top_k=1", "total_tokens=4"))

    def __init__(self, target, config: Eagle3Config | None = None):
        self.config = config or Eagle3Config()
        if self.config.path == "random":
            self.head: Eagle3Head = random_head(target, draft_vocab_size=self.config.draft_vocab_size, seed=self.config.seed)
            self.checkpoint = random_identity(self.head, self.config.seed)
        else:
            src = shipped_head(target.name) if self.config.path == "auto" else checkpoint_dir(self.config.path)
            self.head, self.checkpoint = read_eagle3(src, target)
        self.feature_layers: tuple[int, ...] = tuple(
            self.head.config.feature_layers or default_feature_layers(target.num_layers)
        )
        self.embed = target.model.get_input_embeddings()  # the target's, shared (never copied or saved)
        self.reset(Sampling())

    @classmethod
    def training(cls):
        """The trainable for `specbench train`."""
        return Eagle3Training

    def reset(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.cache = new_cache(self.head)
        self.n_committed = 0  # head cache slots holding committed rows (slot j = token j+1)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        cfg = self.config
        head = self.head
        device = ctx.tokens.device
        root = int(ctx.tokens[-1])
        # 1. drop last round's tree rows
        self.cache.crop(self.n_committed)

        # 2. forward 1: the newly committed tokens with their target features (root row last)
        rows = ctx.new_rows()  # the first token of a sequence has no predecessor: no row
        if rows.count == 0:
            return root_only(root, device=device)  # a one-token prompt: nothing to condition on yet
        positions = rows.positions - 1  # a row sits at its feature's position
        if int(positions[0]) != self.n_committed:
            raise RuntimeError(f"EAGLE-3 head cache holds {self.n_committed} rows but the context starts at row {int(positions[0])}")
        hidden = head.fuse(rows.features.to(head.fc.weight.dtype))
        out = head(self.embed(rows.tokens), hidden, positions, self.cache)
        self.n_committed = self.cache.length
        root_hidden = out[-1:]  # [1, H]

        builder = DynamicTreeBuilder(cfg.top_k)
        builder.start(torch.log_softmax(head.draft_logits(root_hidden[0]).float(), dim=-1))

        # 3. forwards 2..depth over the frontier, self-fed
        frontier_hidden = root_hidden.expand(builder.frontier.numel(), -1)  # each node's parent output
        tree_visible = torch.zeros(builder.frontier.numel(), 0, dtype=torch.bool, device=device)  # [k, tree rows]
        for depth in range(1, cfg.depth):
            k = builder.frontier.numel()
            own = torch.cat([tree_visible, torch.eye(k, dtype=torch.bool, device=device)], dim=1)  # ancestors + self
            mask = torch.cat([torch.ones(k, self.n_committed, dtype=torch.bool, device=device), own], dim=1)
            node_positions = torch.full((k,), ctx.pos + depth - 1, dtype=torch.long, device=device)
            node_tokens = head.to_target_ids(builder.frontier_tokens)
            out = head(self.embed(node_tokens), frontier_hidden, node_positions, self.cache, mask)
            parent_rows = builder.step(torch.log_softmax(head.draft_logits(out).float(), dim=-1))
            frontier_hidden = out[parent_rows]
            tree_visible = own[parent_rows]

        # 4. the root + the best total_tokens - 1 candidates
        return builder.to_tree(root, cfg.total_tokens - 1, token_map=head.to_target_ids, n_forwards=cfg.depth)
