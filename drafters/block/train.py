"""Training the block drafters over cached target features: anchor blocks (SpecForge's DFlash recipe).

Anchors. In a batch, every position a whose token and next token are both assistant (loss) tokens
may be an anchor; ``anchors_per_batch`` of them are drawn without replacement (the draw is seeded
by the recipe seed, the batch and the current weights, so a resumed run draws what an
uninterrupted one would). Upstream draws up to 512 anchors per sequence of a few thousand tokens;
on this CPU a batch of 2,048 tokens gets 128 by default, about one anchor in ten per epoch.

Block. Anchor a gives the block [x[a], MASK x (B-1)] at positions a..a+B-1. It sees the context
rows (the target's states) at positions < a and its own block, nothing of other blocks: exactly
what :meth:`BlockModel.forward_block` sees at inference with a committed prefix of length a.
Block position k (1..B-1) predicts x[a+k]; the anchor itself has no loss; rows past the sequence
or on non-assistant tokens are not scored.

Losses (weights exp(-(k-1)/gamma), gamma 7 for B = 16, 4 for B = 8, as DFlash):

* ``dflash``: hard-label cross-entropy on x[a+k], bidirectional block;
* ``jetspec``: soft-label forward KL(target || drafter) to the target's distribution at
  position a+k-1 (computed from the cached final state and the target's lm_head), causal block.
  JetSpec reports insensitivity to the decay weight; we keep DFlash's so the two differ only in
  mask and loss;
* ``treeflash`` (upstream training is unreleased; our design): the backbone is a trained DFlash
  head, FROZEN, and only the zero-initialised SwiGLU correction trains, teacher-forced on the true
  previous token x[a+k-1] (the root at k = 1), with DFlash's hard-label CE on the corrected
  logits. Frozen, so that ``ar_approximation=false`` is exactly the DFlash marginal tree and the
  comparison isolates the correction.

Metrics (held-out, per depth d = k): ``acc_{d-1}``, the share of scored rows where the drafter's
top-1 equals the target's top-1 after the true prefix (the greedy acceptance test), and
``loss_{d-1}``; ``chain_tau``, 1 + the run of leading top-1 agreements of an anchor's block: the
block efficiency a greedy chain would get with teacher-forced context.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from drafters.block.checkpoint import load_block, save_block
from drafters.block.model import (
    BIDIRECTIONAL, BIDIRECTIONAL_WITH_CORRECTION, CAUSAL, Backbone, BlockConfig, BlockModel, random_block_model,
)
from specbench.errors import UserError
from drafters.common.loading import shipped_checkpoint
from specbench.train.trainer import Batch, Trainable, TrainRecipe


@dataclass(frozen=True)
class BlockRecipe(TrainRecipe):
    lr: float = 1e-3
    batch_tokens: int = 2048
    num_layers: int = 2  # drafter layers = tapped target layers (spread from layer 1 to N-3)
    block_size: int = 16
    anchors_per_batch: int = 128
    gamma: float = 0.0  # loss decay exp(-(k-1)/gamma); 0 = DFlash's default (7 for B=16, 4 for B=8)
    regenerate: bool = True  # DFlash trains on target-regenerated answers

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_layers < 1 or self.block_size < 2 or self.anchors_per_batch < 1 or self.gamma < 0:
            raise ValueError("num_layers and anchors_per_batch must be at least 1, block_size at least 2, gamma >= 0")

    @property
    def decay(self) -> float:
        return self.gamma or (7.0 if self.block_size >= 16 else 4.0)


@dataclass(frozen=True)
class TreeFlashRecipe(BlockRecipe):
    lr: float = 1e-3
    # the trained DFlash backbone: "auto" = the one shipped for the target, else a checkpoint directory;
    # "random" (tests) = a seeded random backbone trained jointly with the correction, not frozen
    backbone: str = "auto"
    ar_intermediate_size: int = 0  # 0 = the backbone's intermediate_size (upstream)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backbone not in ("auto", "random") and not (Path(self.backbone).expanduser() / "config.json").is_file():
            raise ValueError(f"backbone '{self.backbone}' is not a DFlash checkpoint directory (no config.json); "
                             "train one with `specbench train --drafter dflash` or leave backbone=auto")


def _draw_seed(seed: int, batch: Batch, module: torch.nn.Module) -> int:
    """A seed from the recipe seed, the batch and the weights (deterministic under resume)."""
    h = hashlib.sha256(f"{seed}/{tuple(batch.tokens.shape)}/{int(batch.tokens.sum())}".encode())
    first = next(module.parameters())
    h.update(first.detach().flatten()[:16].float().cpu().numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 62) - 1)


def draw_anchors(batch: Batch, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """anchors [S, A] (positions) and their validity [S, A]: ``n`` random anchors over the batch."""
    ok = batch.loss_mask[:, :-1] & batch.loss_mask[:, 1:] & batch.valid[:, 1:]  # [S, T-1]
    where = ok.nonzero()  # [c, 2] (sequence, position), row-major
    g = torch.Generator().manual_seed(seed)
    if where.shape[0] > n:
        pick = torch.randperm(where.shape[0], generator=g)[:n].sort().values
        where = where[pick.to(where.device)]
    s = batch.tokens.shape[0]
    counts = torch.bincount(where[:, 0], minlength=s)
    a = max(int(counts.max()) if counts.numel() else 0, 1)
    anchors = torch.zeros(s, a, dtype=torch.long, device=batch.tokens.device)
    valid = torch.zeros(s, a, dtype=torch.bool, device=batch.tokens.device)
    slot = torch.arange(where.shape[0], device=where.device) - torch.cumsum(counts, 0).sub(counts)[where[:, 0]]
    anchors[where[:, 0], slot] = where[:, 1]
    valid[where[:, 0], slot] = True
    return anchors, valid


def hard_label_ce(logp: Tensor, labels: Tensor, target_logp: Callable[[], Tensor]) -> Tensor:
    """DFlash: cross-entropy on the true next tokens (per row)."""
    return -logp.gather(1, labels[:, None])[:, 0]


def forward_kl(logp: Tensor, labels: Tensor, target_logp: Callable[[], Tensor]) -> Tensor:
    """JetSpec: KL(target || drafter) to the target's own distribution (per row)."""
    with torch.no_grad():
        tl = target_logp()
    return (tl.exp() * (tl - logp)).sum(-1)


class BlockTraining(Trainable):
    """The shared trainable; a family is its backbone, its objective and its checkpoint layout."""

    Recipe = BlockRecipe
    test_recipe = ("block_size=8", "anchors_per_batch=256")
    backbone: Backbone = BIDIRECTIONAL
    objective: Callable[[Tensor, Tensor, Callable[[], Tensor]], Tensor] = staticmethod(hard_label_ce)
    layout = "dflash"  # released checkpoint layout (checkpoint.LAYOUTS)

    def __init__(self, target, recipe: BlockRecipe, input_ids: list[list[int]], loss_mask: list[list[int]]):
        self.recipe = recipe
        torch.manual_seed(recipe.seed)
        self.module = self.build_module(target, recipe).float()
        self.embed = target.model.get_input_embeddings().weight.detach().float().cpu()  # frozen, not saved
        self.lm_head = target.model.get_output_embeddings().weight.detach().float().cpu()
        cfg = self.module.config
        self.feature_layers = cfg.feature_layers
        self.final_layer = target.num_layers  # HF hidden_states[N]: the final normed state
        self.weights = torch.exp(-torch.arange(cfg.block_size - 1, dtype=torch.float) / recipe.decay)  # depth 1..B-1

    def build_module(self, target, recipe: BlockRecipe) -> BlockModel:
        cfg = BlockConfig.for_target(target, num_hidden_layers=recipe.num_layers, block_size=recipe.block_size,
                                     causal=self.backbone.causal)
        model = BlockModel(cfg)  # PyTorch's default init under the recipe seed
        if model.mask_embedding is not None:
            with torch.no_grad():
                model.mask_embedding.normal_(0.0, 0.02)
        return model

    @property
    def cache_layers(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.feature_layers) | {self.final_layer}))

    # ------------------------------------------------------------ the loss
    def block_hidden(self, batch: Batch, anchors: Tensor) -> Tensor:
        """Pre-norm block hidden states [S, A, B, H]."""
        model = self.module
        layers = self.cache_layers
        s, t = batch.tokens.shape
        fidx = [layers.index(i) for i in self.feature_layers]
        context = model.context(batch.hidden[:, :, fidx].reshape(s, t, -1))
        roots = F.embedding(batch.tokens.gather(1, anchors), self.embed)  # [S, A, H]
        return model.forward_anchors(model.block_embeds(roots, self.embed), anchors, context)

    def head(self, hidden: Tensor, batch: Batch, rows: tuple[Tensor, Tensor, Tensor], anchors: Tensor) -> Tensor:
        """Logits [n, V] of the scored rows (s, a, k-1) from the block hidden states."""
        s_i, a_i, k_i = rows
        return self.module.logits(hidden[s_i, a_i, k_i + 1], self.lm_head)

    def loss(self, batch: Batch) -> tuple[Tensor, dict[str, tuple[float, float]]]:
        r = self.recipe
        device = batch.tokens.device
        if self.embed.device != device:
            self.embed, self.lm_head = self.embed.to(device), self.lm_head.to(device)
        s, t = batch.tokens.shape
        b = self.module.config.block_size
        anchors, anchor_ok = draw_anchors(batch, r.anchors_per_batch, _draw_seed(r.seed, batch, self.module))
        pos = anchors[..., None] + torch.arange(1, b, device=device)  # [S, A, B-1]: the predicted positions
        inside = pos < t
        pos_c = pos.clamp(max=t - 1)
        gather = lambda x: x.gather(1, pos_c.flatten(1)).view_as(pos)  # noqa: E731
        scored = anchor_ok[..., None] & inside & gather(batch.valid) & gather(batch.loss_mask)
        rows = scored.nonzero(as_tuple=True)  # (s, a, k-1)
        hidden = self.block_hidden(batch, anchors)
        logp = torch.log_softmax(self.head(hidden, batch, rows, anchors).float(), dim=-1)  # [n, V]
        at = pos_c[rows]  # predicted position of each row
        labels = batch.tokens[rows[0], at]
        target_top = batch.argmax[rows[0], at - 1]  # the target's greedy choice after the true prefix
        final_idx = self.cache_layers.index(self.final_layer)
        per_row = self.objective(logp, labels, lambda: torch.log_softmax(
            batch.hidden[rows[0], at - 1, final_idx] @ self.lm_head.T, dim=-1))  # the target's own log-probs
        w = self.weights.to(device)[rows[2]]
        total = (w * per_row).sum() / w.sum().clamp(min=1e-9)
        hits = logp.argmax(-1) == target_top
        metrics: dict[str, tuple[float, float]] = {"loss": (float(total.detach()), 1.0)}
        for k in range(b - 1):
            sel = rows[2] == k
            n = float(sel.sum())
            metrics[f"loss_{k}"] = (float(per_row.detach()[sel].sum()), n)
            metrics[f"acc_{k}"] = (float(hits[sel].sum()), n)
        match = torch.zeros_like(scored)
        match[rows] = hits
        run = match.long().cumprod(-1).sum(-1)  # [S, A] leading agreements
        metrics["chain_tau"] = (float((1 + run)[anchor_ok].sum()), float(anchor_ok.sum()))
        return total, metrics

    def save(self, out: Path, dtype: torch.dtype = torch.float16) -> Path:
        model = BlockModel(self.module.config)
        model.load_state_dict(self.module.state_dict())
        return save_block(model.to(dtype), out, self.layout)


class DFlashTraining(BlockTraining):
    backbone = BIDIRECTIONAL
    objective = staticmethod(hard_label_ce)
    layout = "dflash"


class JetSpecTraining(BlockTraining):
    backbone = CAUSAL
    objective = staticmethod(forward_kl)
    layout = "jetspec"


class TreeFlashTraining(BlockTraining):
    """Only the correction trains; the backbone is a trained DFlash head, frozen."""

    Recipe = TreeFlashRecipe
    test_recipe = ("block_size=8", "anchors_per_batch=256", "backbone=random")
    backbone = BIDIRECTIONAL_WITH_CORRECTION
    objective = staticmethod(hard_label_ce)
    layout = "treeflash"

    @staticmethod
    def preflight(recipe: TreeFlashRecipe, target_name: str) -> None:
        """Before anything is written: the shipped backbone exists for this target (one-line error)."""
        if recipe.backbone == "auto":
            try:
                shipped_checkpoint("dflash", target_name)
            except UserError:
                raise UserError(f"treeflash trains on a DFlash backbone and none ships for target '{target_name}'; train "
                                f"one with `specbench train --drafter dflash --target {target_name} --out DIR` and pass "
                                "--set backbone=DIR") from None

    def build_module(self, target, recipe: TreeFlashRecipe) -> BlockModel:
        if recipe.backbone == "random":
            src, base = "random", random_block_model(target, seed=recipe.seed, num_hidden_layers=recipe.num_layers,
                                                      block_size=recipe.block_size).float()
        else:
            src = shipped_checkpoint("dflash", target.name) if recipe.backbone == "auto" else Path(recipe.backbone)
            base = load_block(src, target, "treeflash backbone")
        if base.config.causal:
            raise UserError(f"treeflash backbone '{src}' is causal (a JetSpec head); pass a DFlash checkpoint")
        if base.config.block_size != recipe.block_size:
            raise UserError(f"treeflash backbone '{src}' has block_size {base.config.block_size}; "
                            f"set block_size={base.config.block_size}")
        cfg = base.config.replace(ar_approximation="swiglu", ar_intermediate_size=recipe.ar_intermediate_size or None)
        model = BlockModel(cfg)
        missing = model.load_state_dict(base.state_dict(), strict=False).missing_keys
        assert all(k.startswith("ar_approximation.") for k in missing), missing
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("ar_approximation.") or recipe.backbone == "random")
        return model

    def block_hidden(self, batch: Batch, anchors: Tensor) -> Tensor:
        if self.recipe.backbone == "random":  # tests: the backbone trains too
            return super().block_hidden(batch, anchors)
        with torch.no_grad():
            return super().block_hidden(batch, anchors)

    def head(self, hidden: Tensor, batch: Batch, rows: tuple[Tensor, Tensor, Tensor], anchors: Tensor) -> Tensor:
        s_i, a_i, k_i = rows
        prev = batch.tokens[s_i, anchors[s_i, a_i] + k_i]  # x[a+k-1]: the true previous token
        h = hidden[s_i, a_i, k_i + 1]
        return self.module.logits(self.module.corrected(h, F.embedding(prev, self.embed)), self.lm_head)


__all__ = ["BlockRecipe", "TreeFlashRecipe", "BlockTraining", "DFlashTraining", "JetSpecTraining", "TreeFlashTraining",
           "draw_anchors"]
