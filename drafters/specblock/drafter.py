"""The SpecBlock drafter: block 1 fused with the draft-cache update, one batched block 2, rank-driven tree.

Rows. The row of the committed token at position p is (the target's three features at p - 1, the
token x_p); its K slots sit at RoPE positions p .. p + K - 1 and predict x_{p+1} .. x_{p+K}. The
draft KV cache holds all K slots of every committed row (upstream's "cross cache").

One ``propose`` = two drafter calls (``max_blocks`` in general):

1. block 1, fused with the cache update: the newly committed rows (accepted drafts + bonus, with the
   TARGET's features) run in one call; each slot (i, k) attends to all K slots of every earlier row
   and to slots <= k of its own row, and their K/V are appended for good. The last row is the root's:
   its K slots give the greedy chain, the rank classes and the alternatives (tree.py);
2. block 2: the pending leaves (greedy nodes, alternatives, the chain end; at most ``beam_width`` by
   cumulative log-prob) run in ONE call, each as one row conditioned on the draft hidden state of
   the block-1 slot it came from and fed its own token, at the root row's positions; a leaf from slot
   s attends to every committed row before the root's, to the root row's slots 0..s, and to its own
   slots <= k (the mask of upstream's ``ttt_mask``). Their K/V are appended after a mark and rolled
   back (``KVCache.crop``) once the tree is built: only committed rows stay.
3. the tree is pruned to ``budget`` nodes by cumulative log-prob with ancestor closure.

Budget. ``budget`` COUNTS THE ROOT, like every specbench family. Upstream's ``total_tokens`` counts
the drafts only (its tree buffers add the root, ``sample_token``, as an extra node 0), so upstream
``total_tokens = T`` is ``budget = T + 1`` here; the default ``budget=90`` is upstream
``total_tokens=89`` (its default is 90, i.e. our 91).

Sampling: children are chosen deterministically (top-k), so ``draft_probs`` is None and the
verifier's point-mass rule keeps temperature > 0 lossless. The optional online adaptation
(``adapt``, adapt.py) only changes the rank head, i.e. the tree's shape: losslessness never
depends on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from drafters.common.kv_cache import LayerCaches
from drafters.common.loading import checkpoint_dir, random_identity, shipped_checkpoint
from drafters.specblock.model import SpecBlockModel, random_model, sdpa
from drafters.specblock.tree import Leaf, beam, grow
from specbench.drafter import DraftContext, Drafter, Sampling
from specbench.tree import DraftTree, TreeBuilder, root_only, subtree

ADAPT_MODES = ("off", "always", "bandit")


@dataclass(frozen=True)
class SpecBlockOptions:
    # "auto" = the checkpoint shipped for this target; "random" = seeded random init (tests); or a directory
    path: str = "auto"
    budget: int = 90  # tree nodes INCLUDING the root (upstream total_tokens + 1)
    beam_width: int = 10  # pending leaves per later block, and block 1's slot-0 candidates
    max_blocks: int = 2  # drafter calls per step (block 1 + batched later blocks)
    slots: int = 0  # slots used for the tree (0 = all the model's K); with path=random: the model's K (0 = 4)
    slot_topk: tuple[int, ...] = (2, 4, 6, 4)  # candidates per slot by rank class (upstream "slim_r2")
    adaptive_topk: bool = True  # fewer candidates on confident slots (upstream ADAPTIVE_SLOT0=1, ADAPTIVE_ALL=1)
    adapt: str = "off"  # online adaptation of the rank head: off | always | bandit (adapt.py)
    adapt_every: int = 16  # steps between adaptation decisions (and the tau window before/after)
    adapt_horizon: int = 2048  # tokens ahead over which a decision's gain is counted
    adapt_buffer: int = 512  # labelled examples kept (newest)
    adapt_lr: float = 1e-3
    seed: int = 0  # random init and the adaptation's minibatches
    draft_vocab_size: int = 0  # random init only (0 = the target's vocabulary)

    def __post_init__(self) -> None:
        if self.budget < 1 or self.beam_width < 1 or self.max_blocks < 1 or self.slots < 0:
            raise ValueError("budget, beam_width and max_blocks must be at least 1, slots at least 0")
        if len(self.slot_topk) != 4 or any(t < 0 for t in self.slot_topk):
            raise ValueError("slot_topk needs 4 non-negative counts (rank classes 1 / 2-4 / 5-10 / >10)")
        if self.adapt not in ADAPT_MODES:
            raise ValueError(f"adapt must be one of {', '.join(ADAPT_MODES)}")
        if self.adapt_every < 1 or self.adapt_horizon < 1 or self.adapt_buffer < 1 or self.adapt_lr <= 0:
            raise ValueError("adapt_every, adapt_horizon, adapt_buffer and adapt_lr must be positive")


def shipped(target_name: str) -> Path:
    return shipped_checkpoint("specblock", target_name)


class SpecBlockDrafter(Drafter):
    description = "SpecBlock: K-slot blocks with shift injection and a rank head, 2 drafter calls per step (--drafter-path CKPT)"
    Config = SpecBlockOptions
    test_options = (("budget=24", "beam_width=4"), ("budget=8", "beam_width=2", "max_blocks=3", "slots=2"),
                    ("budget=16", "max_blocks=1", "adaptive_topk=false"))

    def __init__(self, target, config: SpecBlockOptions | None = None):
        from drafters.specblock.checkpoint import read_specblock

        self.config = config or SpecBlockOptions()
        if self.config.path == "random":
            self.model: SpecBlockModel = random_model(target, slots=self.config.slots or 4,
                                                      draft_vocab_size=self.config.draft_vocab_size, seed=self.config.seed)
            self.checkpoint = random_identity(self.model, self.config.seed)
        else:
            src = shipped(target.name) if self.config.path == "auto" else checkpoint_dir(self.config.path)
            self.model, self.checkpoint = read_specblock(src, target)
        from drafters.eagle3.model import default_feature_layers

        self.feature_layers = tuple(self.model.config.feature_layers or default_feature_layers(target.num_layers))
        self.device = target.device
        self.k_model = self.model.config.slots
        self.k_tree = min(self.config.slots or self.k_model, self.k_model)
        self.adapter = None
        if self.config.adapt != "off":
            from drafters.specblock.adapt import Adapter

            self.adapter = Adapter(self.model, self.config)  # persists across the run's prompts
        self.generation = -1
        self.reset(Sampling())
        self.generation = -1

    @classmethod
    def training(cls):
        from drafters.specblock.train import SpecBlockTraining

        return SpecBlockTraining

    def reset(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.cache = LayerCaches(len(self.model.layers))
        self.n_rows = 0  # committed rows in the draft cache (row i = the token at position i + 1)
        self.last_outputs = None  # for the adaptation: what predicted the children of each node of the last tree
        self.last_step_end = None
        self.generation += 1

    def take_log(self) -> list[dict] | None:
        """The adaptation's decisions and outcomes since the last call (None with adapt=off)."""
        return None if self.adapter is None else self.adapter.take_log()

    # ------------------------------------------------------------ one call of the model
    def _call(self, cond: Tensor, tokens: Tensor, positions: Tensor, mask: Tensor, draft_condition: bool):
        """Run R rows ([R, ...]) against the cache with ``mask`` [R*K, cache + R*K]; appends their K/V."""
        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            keys, values = self.cache.append(layer, k[0], v[0])
            return sdpa(q, keys[None], values[None], mask)

        return self.model.run(cond[None], tokens[None], positions, attend, draft_condition)

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> DraftTree:
        cfg, model, dev = self.config, self.model, ctx.tokens.device
        kk = self.k_model
        root = int(ctx.tokens[-1])
        if self.adapter is not None:
            self._feed_adapter(ctx)
        rows = ctx.new_rows()
        if rows.count == 0:
            return root_only(root, device=dev)
        if int(rows.positions[0]) - 1 != self.n_rows:
            raise RuntimeError(f"SpecBlock cache holds {self.n_rows} rows but the context starts at row {int(rows.positions[0]) - 1}")

        # 1. block 1 fused with the cache update: the new committed rows, all K slots each
        r = rows.count
        committed = self.n_rows * kk
        row_of = torch.arange(r * kk, device=dev) // kk
        slot_of = torch.arange(r * kk, device=dev) % kk
        own = (row_of[None, :] < row_of[:, None]) | ((row_of[None, :] == row_of[:, None]) & (slot_of[None, :] <= slot_of[:, None]))
        mask = torch.cat([torch.ones(r * kk, committed, dtype=torch.bool, device=dev), own], dim=1)
        out = self._call(rows.features, rows.tokens, rows.positions, mask, draft_condition=False)
        self.n_rows += r
        committed = self.n_rows * kk
        root_pos = rows.positions[-1:]

        builder = TreeBuilder(root)
        node_outputs: dict[int, tuple[int, int]] = {}
        outputs = [(out.rank_input[0, -1, : self.k_tree], out.logits[0, -1, : self.k_tree])]
        logp = torch.log_softmax(out.logits[0, -1, : self.k_tree].float(), dim=-1).cpu()
        ranks = out.rank_logits[0, -1, : self.k_tree].argmax(-1).tolist()
        leaves = grow(builder, 0, logp, ranks, cfg.slot_topk, model.to_target_ids, slot0_topk=cfg.beam_width,
                      node_outputs=node_outputs, call=0, adaptive=cfg.adaptive_topk)
        hidden = out.hidden[0, -1:]  # [1, K, H]: the conditions of the pending leaves ([row, slot])
        # visibility of each leaf over the speculative region [committed - K, cache length): the root row's slots first
        vis = [torch.arange(kk, device=dev) <= leaf.slot for leaf in leaves]
        calls = 1

        # 2. later blocks: all pending leaves in one call each
        for _ in range(1, cfg.max_blocks):
            drafts = len(builder) - 1
            width = min(cfg.beam_width, max(1, (cfg.budget - 1 - drafts) // self.k_tree))
            keep = beam(leaves, width)
            if not keep:
                break
            index = {id(lf): i for i, lf in enumerate(leaves)}
            keep_vis = [vis[index[id(lf)]] for lf in keep]
            n = len(keep)
            spec_len = self.cache.length(0) - (committed - kk)
            cond = hidden[[lf.source for lf in keep], [lf.slot for lf in keep]]  # [n, H]
            tokens = torch.tensor([builder.tokens[lf.node] for lf in keep], dtype=torch.long, device=dev)
            leaf_vis = torch.stack(keep_vis).repeat_interleave(kk, dim=0)  # [n*K, spec_len]
            row_of = torch.arange(n * kk, device=dev) // kk
            slot_of = torch.arange(n * kk, device=dev) % kk
            mine = (row_of[None, :] == row_of[:, None]) & (slot_of[None, :] <= slot_of[:, None])
            mask = torch.cat([torch.ones(n * kk, committed - kk, dtype=torch.bool, device=dev), leaf_vis, mine], dim=1)
            out = self._call(cond, tokens, root_pos.expand(n), mask, draft_condition=True)
            calls += 1
            outputs.append((out.rank_input[0, :, : self.k_tree].reshape(-1, out.rank_input.shape[-1]),
                            out.logits[0, :, : self.k_tree].reshape(-1, out.logits.shape[-1])))
            logps = torch.log_softmax(out.logits[0, :, : self.k_tree].float(), dim=-1).cpu()
            all_ranks = out.rank_logits[0, :, : self.k_tree].argmax(-1).tolist()
            new_leaves: list[Leaf] = []
            new_vis: list[Tensor] = []
            for i, lf in enumerate(keep):
                grown = grow(builder, lf.node, logps[i], all_ranks[i], cfg.slot_topk, model.to_target_ids, source=i,
                             node_outputs=node_outputs, call=calls - 1, adaptive=cfg.adaptive_topk)
                for g in grown:
                    block_rows = torch.zeros(n * kk, dtype=torch.bool, device=dev)
                    block_rows[i * kk : i * kk + g.slot + 1] = True
                    new_vis.append(torch.cat([keep_vis[i], block_rows]))
                new_leaves += grown
            assert all(v.numel() == spec_len + n * kk for v in new_vis)
            leaves, vis, hidden = new_leaves, new_vis, out.hidden[0]
        # roll the speculative blocks back: only committed rows stay in the draft cache
        for layer in self.cache.layers:
            if layer is not None:
                layer.crop(committed)

        # 3. prune to the budget by cumulative log-prob, ancestors kept
        keep_ids = builder.prune(cfg.budget)
        tokens, parents = subtree(torch.tensor(builder.tokens, dtype=torch.long), torch.tensor(builder.parents), keep_ids)
        if self.adapter is not None:
            self._remember(keep_ids, node_outputs, outputs)
        return DraftTree(tokens=tokens.to(dev), parents=parents.to(dev), n_forwards=calls)

    # ------------------------------------------------------------ adaptation hooks
    def _remember(self, keep_ids: Tensor, node_outputs: dict, outputs: list) -> None:
        """For each node of the returned tree: the (rank input, draft logits) that predicted its children."""
        new_of_old = {int(old): new for new, old in enumerate(keep_ids.tolist())}
        src = {new_of_old[node]: where for node, where in node_outputs.items() if node in new_of_old}
        self.last_outputs = (src, outputs)

    def _feed_adapter(self, ctx: DraftContext) -> None:
        now = time.perf_counter()
        if ctx.accepted_nodes is not None and self.last_outputs is not None:
            src, outputs = self.last_outputs
            path = ctx.accepted_nodes.tolist()
            targets = ctx.tokens.tolist()  # targets[i]: the target's token after path node i
            xs, logits, labels = [], [], []
            for node, tok in zip(path, targets):
                where = src.get(node)
                if where is None:
                    continue
                call, idx = where
                xs.append(outputs[call][0][idx])
                logits.append(outputs[call][1][idx])
                labels.append(tok)
            step_s = None if self.last_step_end is None else now - self.last_step_end
            self.adapter.observe(xs, logits, labels, accepted=len(path) - 1, step_s=step_s,
                                 generation=self.generation)
            self.adapter.maybe_update()
        self.last_step_end = time.perf_counter()
        self.last_outputs = None


__all__ = ["SpecBlockDrafter", "SpecBlockOptions"]
