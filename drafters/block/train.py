"""Training the block drafters over cached target features: anchor blocks (SpecForge's DFlash recipe).

Anchors. In a batch, every position a whose token and next token are both assistant (loss) tokens
is a valid anchor. Training takes every valid anchor of a sequence up to ``anchors_per_sequence``
(512, upstream's ``num_anchors`` in SpecForge's ``OnlineDFlashModel``; answers regenerated at 256
new tokens never have more), a seeded sample beyond that (the seed mixes the recipe seed, the
batch, the current weights and the sequence's tokens, so a resumed run draws what an uninterrupted
one would). The held-out evaluation takes every valid anchor of the held-out conversations, with no
randomness: the same anchors for every checkpoint and every family.

Chunks. The blocks of a batch run ``anchor_chunk`` anchors at a time against the context keys and
values computed once for the batch, and the lm_head and loss run on ``logit_chunk`` scored rows at
a time; the trainer's :meth:`BlockTraining.backward` backpropagates each chunk as soon as its loss
is known (then the context part once), so memory holds one chunk, never [anchors * (B-1), V]
logits, and the gradient is exactly the whole batch's.

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
block efficiency a greedy chain would get with teacher-forced context. Held-out only, the
root-sensitivity probe (:mod:`specbench.train.probe`): ``shuffled_root_acc_0``, depth-1 top-1 with
the roots shuffled across the batch's anchors, and ``shuffled_root_same_argmax_0``.

Reduced draft vocabulary (``draft_vocab_size`` > 0; ours, an explicit variant, never the default):
the head scores the ``draft_vocab_size`` most frequent assistant tokens of the training data
(EAGLE-3's d2t/t2d, :mod:`drafters.common.vocab`) through those rows of the target's lm_head. The
loss learns the rows whose label (JetSpec: the target's top-1) is in that vocabulary, JetSpec's KL
over the target's distribution restricted to it (as EAGLE-3); ``acc_*`` and ``chain_tau`` count
every scored row as for the full head (a target token outside the vocabulary is a miss), so the two
variants' held-out numbers compare.
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
from drafters.common.locate import checkpoint_dir, is_checkpoint
from drafters.common.precision import bf16_autocast, check_precision
from drafters.common.vocab import draft_vocabulary
from specbench.train.trainer import Batch, Trainable, TrainRecipe

PRECISIONS = ("fp32", "bf16-head", "bf16")  # the recipe's precision


@dataclass(frozen=True)
class BlockRecipe(TrainRecipe):
    lr: float = 1e-3
    batch_tokens: int = 2048
    num_layers: int = 2  # drafter layers = tapped target layers (spread from layer 1 to N-3)
    block_size: int = 16
    # anchors per sequence in training: upstream's num_anchors (SpecForge OnlineDFlashModel, 512); a
    # sequence with more valid anchors gets a seeded sample of this many; 0 = every valid anchor
    anchors_per_sequence: int = 512
    # anchors per block forward (summed over the batch's sequences) and scored rows per lm_head + loss
    # chunk: they bound memory and leave the result exact. Chosen by scripts/measure-block-step on
    # smollm2-135m (reports/block-drafters.md): anchor_chunk 128 took 0.74x the step time of 512 (a chunk attends only
    # to the context before its last root), logit_chunk 512 0.94x that of 2048 (within noise)
    anchor_chunk: int = 128
    logit_chunk: int = 512
    # ours, an explicit variant: a head over the N most frequent training tokens (EAGLE-3's d2t/t2d);
    # 0 = the target's whole vocabulary (the paper-faithful head, the default)
    draft_vocab_size: int = 0
    gamma: float = 0.0  # loss decay exp(-(k-1)/gamma); 0 = DFlash's default (7 for B=16, 4 for B=8)
    regenerate: bool = True  # DFlash trains on target-regenerated answers
    # training arithmetic. fp32: everything. bf16-head: the frozen lm_head's matmul (the scored rows'
    # logits, JetSpec's target log-probs) in bfloat16. bf16: that and the drafter's own forward under
    # torch.autocast (bfloat16 matmuls, float32 weights, optimizer and norms). Logits return to float32
    # before the softmax and the loss in both. Mixed precision is how upstream trains (SpecForge: bf16);
    # on a CPU with AVX512-BF16 a bfloat16 matmul runs ~3.7x faster (scripts/measure-block-step)
    precision: str = "fp32"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_layers < 1 or self.block_size < 2 or self.gamma < 0:
            raise ValueError("num_layers must be at least 1, block_size at least 2, gamma >= 0")
        if self.anchors_per_sequence < 0 or self.anchor_chunk < 1 or self.logit_chunk < 1:
            raise ValueError("anchor_chunk and logit_chunk must be at least 1, anchors_per_sequence >= 0 (0 = all)")
        if self.draft_vocab_size < 0:
            raise ValueError("draft_vocab_size must be >= 0 (0 = the target's vocabulary)")
        check_precision(self.precision, PRECISIONS)

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
    # (draft_vocab_size: 0 = the backbone's vocabulary, reduced or not)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backbone not in ("auto", "random") and not is_checkpoint(checkpoint_dir(self.backbone)):
            raise ValueError(f"backbone '{self.backbone}' is not a DFlash checkpoint directory (no config.json); "
                             "train one with `specbench train --drafter dflash` or leave backbone=auto")


# --------------------------------------------------------------------------- anchors


def _draw_seed(seed: int, batch: Batch, module: torch.nn.Module) -> int:
    """A training draw's seed from the recipe seed, the batch and the trainable weights (deterministic
    under resume, different at every step)."""
    h = hashlib.sha256(f"{seed}/{tuple(batch.tokens.shape)}/{int(batch.tokens.sum())}".encode())
    first = next((p for p in module.parameters() if p.requires_grad), None)
    first = next(module.parameters()) if first is None else first
    h.update(first.detach().flatten()[:16].float().cpu().numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 62) - 1)


def _tokens_seed(seed: int, tokens: Tensor) -> int:
    h = hashlib.sha256(f"{seed}/".encode())
    h.update(tokens.detach().cpu().numpy().astype("int64").tobytes())
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 62) - 1)


def valid_anchors(batch: Batch) -> Tensor:
    """[S, T-1] bool: positions whose token and next token are both assistant (loss) tokens."""
    return batch.loss_mask[:, :-1] & batch.loss_mask[:, 1:] & batch.valid[:, 1:]


def select_anchors(batch: Batch, per_sequence: int = 0, seed: int = 0) -> tuple[Tensor, Tensor]:
    """anchors [S, A] (positions) and their validity [S, A]: every valid anchor of each sequence, or,
    with ``per_sequence`` > 0, a sample of at most that many per sequence, drawn with ``seed`` mixed
    with the sequence's own tokens (so a sequence's draw does not depend on its batch-mates)."""
    ok = valid_anchors(batch)
    picks = []
    for i in range(ok.shape[0]):
        where = ok[i].nonzero()[:, 0]
        if per_sequence and where.numel() > per_sequence:
            g = torch.Generator().manual_seed(_tokens_seed(seed, batch.tokens[i][batch.valid[i]]))
            where = where[torch.randperm(where.numel(), generator=g)[:per_sequence].sort().values.to(where.device)]
        picks.append(where)
    a = max([p.numel() for p in picks] + [1])
    anchors = torch.zeros(ok.shape[0], a, dtype=torch.long, device=batch.tokens.device)
    valid = torch.zeros(ok.shape[0], a, dtype=torch.bool, device=batch.tokens.device)
    for i, p in enumerate(picks):
        anchors[i, : p.numel()] = p
        valid[i, : p.numel()] = True
    return anchors, valid


def shuffled_roots(batch: Batch, roots: Tensor, ok: Tensor) -> Tensor:
    """``roots`` [S, A] permuted across the valid anchors of the batch (a fixed permutation seeded by
    the batch's tokens): the root-sensitivity probe's wrong roots."""
    g = torch.Generator().manual_seed(_tokens_seed(1, batch.tokens[batch.valid]))
    flat = roots[ok]
    out = roots.clone()
    out[ok] = flat[torch.randperm(flat.numel(), generator=g).to(flat.device)]
    return out


# --------------------------------------------------------------------------- objectives


class _RowCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy of softmax(``logits``) [n, V] against one-hot ``labels`` [n] or against a
    distribution ``probs`` [n, V] (plus ``plogp`` [n] = sum p log p, which makes it KL(p || softmax)),
    returned with the log-probs (no gradient; the metrics read them). The values and the gradient are
    those of the autograd chain log_softmax -> gather (or product and sum) -> row selection, whose
    backward fills and writes several [n, V] buffers (gather's and the row index's zeros, log_softmax's
    own); this one writes one, softmax - target, scaled by each row's incoming gradient (0 for rows the
    caller leaves out). At the full vocabulary those buffers were a third of a training step."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor | None, probs: Tensor | None, plogp: Tensor | None):
        logp = torch.log_softmax(logits, dim=-1)
        if probs is None:
            loss = -logp.gather(1, labels[:, None])[:, 0]
        else:
            loss = plogp - (probs * logp).sum(-1)
        ctx.hard = probs is None
        ctx.save_for_backward(logp, labels if probs is None else probs)
        ctx.mark_non_differentiable(logp)
        return loss, logp

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_logp):
        logp, target = ctx.saved_tensors
        g = logp.exp()
        if ctx.hard:
            g[torch.arange(g.shape[0], device=g.device), target] -= 1.0
        else:
            g -= target
        g *= grad_loss[:, None]
        return g, None, None, None


TargetRows = Callable[[], tuple[Tensor, Tensor]]  # the rows' target distribution p [n, Vd] and sum p log p [n]


def hard_label_ce(logits: Tensor, labels: Tensor, target: TargetRows) -> tuple[Tensor, Tensor]:
    """DFlash: cross-entropy on the true next tokens (per row; labels are draft ids). Returns the
    per-row losses and the rows' log-probs."""
    return _RowCrossEntropy.apply(logits, labels, None, None)


def forward_kl(logits: Tensor, labels: Tensor, target: TargetRows) -> tuple[Tensor, Tensor]:
    """JetSpec: KL(target || drafter) to the target's own distribution (per row; over the draft
    vocabulary). Returns the per-row losses and the rows' log-probs."""
    p, plogp = target()
    return _RowCrossEntropy.apply(logits, None, p, plogp)


class BlockTraining(Trainable):
    """The shared trainable; a family is its backbone, its objective and its checkpoint layout."""

    Recipe = BlockRecipe
    test_recipe = ("block_size=8",)
    backbone: Backbone = BIDIRECTIONAL
    objective: Callable[[Tensor, Tensor, TargetRows], tuple[Tensor, Tensor]] = staticmethod(hard_label_ce)
    soft_labels = False  # True: the objective learns the target's distribution (rows scored by its top-1)
    layout = "dflash"  # released checkpoint layout (checkpoint.LAYOUTS)

    def __init__(self, target, recipe: BlockRecipe, input_ids: list[list[int]], loss_mask: list[list[int]]):
        self.recipe = recipe
        torch.manual_seed(recipe.seed)
        self.module = self.build_module(target, recipe, input_ids, loss_mask).float()
        self.embed = target.model.get_input_embeddings().weight.detach().float().cpu()  # frozen, not saved
        # the target's lm_head rows the head scores (all of them unless draft_vocab_size is set)
        self.lm_head = self.module.draft_lm_head(target.model.get_output_embeddings().weight.detach().float().cpu())
        # the matmul's copy, cast once (itself in fp32)
        self.head_weight = self.lm_head.to(torch.float32 if recipe.precision == "fp32" else torch.bfloat16)
        self.draft_index = self.module.draft_index()  # [V] draft id of each target id (-1: outside), None = full
        cfg = self.module.config
        self.feature_layers = cfg.feature_layers
        self.final_layer = target.num_layers  # HF hidden_states[N]: the final normed state
        self.weights = torch.exp(-torch.arange(cfg.block_size - 1, dtype=torch.float) / recipe.decay)  # depth 1..B-1

    def build_module(self, target, recipe: BlockRecipe, input_ids: list[list[int]], loss_mask: list[list[int]]) -> BlockModel:
        vd = min(recipe.draft_vocab_size, target.vocab_size) or None
        cfg = BlockConfig.for_target(target, num_hidden_layers=recipe.num_layers, block_size=recipe.block_size,
                                     causal=self.backbone.causal, draft_vocab_size=vd)
        model = BlockModel(cfg)  # PyTorch's default init under the recipe seed
        if model.mask_embedding is not None:
            with torch.no_grad():
                model.mask_embedding.normal_(0.0, 0.02)
        if cfg.reduced_vocab:  # EAGLE-3's choice: the most frequent assistant tokens of the training data
            model.set_vocab_mapping(draft_vocabulary(input_ids, loss_mask, cfg.draft_vocab_size, cfg.vocab_size))
        return model

    @property
    def cache_layers(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.feature_layers) | {self.final_layer}))

    @property
    def frozen_backbone(self) -> bool:
        """True when only a part outside the backbone trains (TreeFlash's correction)."""
        return False

    # ------------------------------------------------------------ the forward pieces
    def context_kv(self, batch: Batch) -> list[tuple[Tensor, Tensor]]:
        """Every layer's context keys/values over the whole batch (shared by all anchor chunks)."""
        s, t = batch.tokens.shape
        layers = self.cache_layers
        fidx = [layers.index(i) for i in self.feature_layers]
        return self.module.context_kv(self.module.context(batch.hidden[:, :, fidx].reshape(s, t, -1)))

    def block_hidden(self, kv: list[tuple[Tensor, Tensor]], anchors: Tensor, roots: Tensor) -> Tensor:
        """Pre-norm block hidden states [S, A, B, H] of the blocks rooted at ``roots`` [S, A] (token ids)."""
        model = self.module
        return model.forward_anchors_kv(model.block_embeds(F.embedding(roots, self.embed), self.embed), anchors, kv)

    def head(self, hidden: Tensor, prev: Tensor) -> Tensor:
        """Logits [n, Vd] of scored rows from their block hidden states [n, H]; ``prev`` [n] is each
        row's previous token (the root at depth 1; TreeFlash's correction reads it)."""
        return self.score(hidden)

    def score(self, hidden: Tensor) -> Tensor:
        """Float32 logits [n, Vd] of pre-norm hidden states [n, H] through the frozen lm_head (the
        model's :meth:`~BlockModel.logits`), the matmul in the recipe's ``precision``."""
        return self.module.logits(hidden, self.head_weight).float()

    def amp(self, device) -> torch.autocast:
        """The drafter's forward under bfloat16 autocast when the recipe's precision is bf16 (else a no-op)."""
        return bf16_autocast(device, self.recipe.precision == "bf16")

    def target_logp(self, final_states: Tensor) -> Tensor:
        """The target's own log-probs [n, Vd] from its cached final normed states [n, H]."""
        w = self.head_weight
        return torch.log_softmax((final_states.to(w.dtype) @ w.T).float(), dim=-1)

    def target_rows(self, batch: Batch, pos_c: Tensor, scored: Tensor) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """JetSpec's soft labels, computed once per batch: the target's distribution p [Vd] and
        sum p log p at every position a scored row conditions on (row k of anchor a conditions on
        position a+k-1, so one position serves up to B-1 anchors' blocks: per row, the lm_head matmul
        and the softmax ran B-1 times over; computing them once took a JetSpec bf16 step to 0.75x, reports/block-drafters.md). Returns a lookup
        (sequence indices, positions) -> (p [n, Vd], sum p log p [n])."""
        s, t = batch.tokens.shape
        device = batch.tokens.device
        seq = torch.arange(s, device=device)[:, None, None].expand_as(pos_c)
        need = torch.zeros(s * t, dtype=torch.bool, device=device)
        need[(seq * t + pos_c - 1)[scored]] = True
        where = need.nonzero()[:, 0]
        slot = torch.full((s * t,), -1, dtype=torch.long, device=device)
        slot[where] = torch.arange(where.numel(), device=device)
        states = batch.hidden[:, :, self.cache_layers.index(self.final_layer)].reshape(s * t, -1)
        p = torch.empty(where.numel(), self.head_weight.shape[0], device=device)
        plogp = torch.empty(where.numel(), device=device)
        with torch.no_grad():
            for r0 in range(0, where.numel(), self.recipe.logit_chunk):
                part = slice(r0, r0 + self.recipe.logit_chunk)
                tl = self.target_logp(states[where[part]])
                p[part] = tl.exp()
                plogp[part] = (p[part] * tl).sum(-1)

        def lookup(si: Tensor, at: Tensor) -> tuple[Tensor, Tensor]:
            i = slot[si * t + at]
            return p[i], plogp[i]
        return lookup

    # ------------------------------------------------------------ the loss
    def loss(self, batch: Batch) -> tuple[Tensor, dict[str, tuple[float, float]]]:
        return self._blocks(batch, None)

    def backward(self, batch: Batch, scale: float) -> tuple[float, dict[str, tuple[float, float]]]:
        """``scale * loss`` backpropagated chunk by chunk (anchor chunks, then lm_head row chunks), so
        memory holds one chunk's activations; the gradient is the whole batch's."""
        total, metrics = self._blocks(batch, scale)
        return float(total), metrics

    def _to(self, device) -> None:
        if self.embed.device != torch.device(device):
            self.embed, self.lm_head = self.embed.to(device), self.lm_head.to(device)
            self.head_weight = self.head_weight.to(device)
            self.draft_index = None if self.draft_index is None else self.draft_index.to(device)

    def _blocks(self, batch: Batch, scale: float | None) -> tuple[Tensor, dict[str, tuple[float, float]]]:
        """The loss and metrics over every anchor of ``batch``; ``scale`` set: backpropagated in chunks."""
        r = self.recipe
        model = self.module
        device = batch.tokens.device
        self._to(device)
        s, t = batch.tokens.shape
        b = model.config.block_size
        evaluating = not model.training
        if evaluating:  # held-out: every valid anchor, the same set for every checkpoint and family
            anchors, ok = select_anchors(batch)
        else:
            anchors, ok = select_anchors(batch, r.anchors_per_sequence, _draw_seed(r.seed, batch, model))
        roots = batch.tokens.gather(1, anchors)  # [S, A]
        pos = anchors[..., None] + torch.arange(1, b, device=device)  # [S, A, B-1]: the predicted positions
        pos_c = pos.clamp(max=t - 1)
        gather = lambda x: x.gather(1, pos_c.flatten(1)).view_as(pos)  # noqa: E731
        scored = ok[..., None] & (pos < t) & gather(batch.valid) & gather(batch.loss_mask)
        labels = gather(batch.tokens)
        target_top = batch.argmax.gather(1, (pos_c - 1).flatten(1)).view_as(pos)  # the target's greedy choice
        learn_ids = target_top if self.soft_labels else labels
        if self.draft_index is None:
            learn, draft_labels = scored, labels
        else:  # rows the reduced head can learn: the label (or the target's top-1) is in its vocabulary
            draft_labels = self.draft_index[labels]
            learn = scored & (self.draft_index[learn_ids] >= 0)
        w = self.weights.to(device)
        wsum = (w * learn).sum().clamp(min=1e-9)

        grad = torch.is_grad_enabled()
        backbone_grad = grad and not self.frozen_backbone
        with torch.set_grad_enabled(backbone_grad):
            with self.amp(device):
                kv = self.context_kv(batch)
        stepwise = scale is not None and grad
        kv_in = kv
        if stepwise and backbone_grad:  # chunks backpropagate into these leaves; then one pass into fc
            kv_in = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in kv]
        probe_roots = shuffled_roots(batch, roots, ok) if evaluating else None
        soft = self.target_rows(batch, pos_c, scored) if self.soft_labels else None

        sums: dict[str, list[Tensor]] = {}

        def per_k(name: str, k: Tensor, values: Tensor) -> None:  # per-depth sums and row counts
            acc = sums.setdefault(name, [torch.zeros(b - 1, device=device), torch.zeros(b - 1, device=device)])
            acc[0] += torch.bincount(k, weights=values.float(), minlength=b - 1)[: b - 1]
            acc[1] += torch.bincount(k, minlength=b - 1)[: b - 1].float()

        total = torch.zeros((), device=device)
        total_value = 0.0
        chain = [0.0, 0.0]
        step = max(1, r.anchor_chunk // s)
        for a0 in range(0, anchors.shape[1], step):
            sl = slice(a0, a0 + step)
            if not bool(scored[:, sl].any()):
                chain[1] += float(ok[:, sl].sum())
                chain[0] += float(ok[:, sl].sum())
                continue
            with torch.set_grad_enabled(backbone_grad), self.amp(device):
                hidden = self.block_hidden(kv_in, anchors[:, sl], roots[:, sl])  # [S, a, B, H]
            h_use = hidden.detach().requires_grad_() if stepwise and hidden.requires_grad else hidden
            rows = scored[:, sl].nonzero(as_tuple=True)  # (s, a - a0, k-1)
            match = torch.zeros_like(scored[:, sl])
            preds = []
            for r0 in range(0, rows[0].numel(), r.logit_chunk):
                si, ai, ki = (x[r0 : r0 + r.logit_chunk] for x in rows)
                ag = ai + a0
                prev = torch.where(ki == 0, roots[si, ag], batch.tokens[si, (anchors[si, ag] + ki).clamp(max=t - 1)])
                with self.amp(device):
                    logits = self.head(h_use[si, ai, ki + 1], prev)
                # every row's loss and log-probs [n, Vd] in one op; a row the head cannot learn (its
                # label outside a reduced vocabulary: draft id -1, scored as id 0) stays out of the loss
                at = pos_c[si, ag, ki]
                per_row_all, logp = self.objective(logits.float(), draft_labels[si, ag, ki].clamp(min=0),
                                                   lambda: soft(si, at - 1))
                pred = model.to_target_ids(logp.argmax(-1))
                preds.append(pred)
                hit = pred == target_top[si, ag, ki]
                match[si, ai, ki] = hit
                per_k("acc", ki, hit.float())
                lrow = learn[si, ag, ki].nonzero()[:, 0]
                if lrow.numel():
                    per_row = per_row_all[lrow]
                    part = (w[ki[lrow]] * per_row).sum() / wsum
                    per_k("loss", ki[lrow], per_row.detach())
                    total_value += float(part.detach())
                    if stepwise:
                        if part.requires_grad:
                            (part * scale).backward()
                    else:
                        total = total + part
            if stepwise and h_use is not hidden and h_use.grad is not None:
                hidden.backward(h_use.grad)
            run = match.long().cumprod(-1).sum(-1)  # [S, a] leading agreements
            chain[0] += float((1 + run)[ok[:, sl]].sum())
            chain[1] += float(ok[:, sl].sum())
            if probe_roots is not None:  # depth 1 again with the roots shuffled across anchors
                first = (rows[2] == 0).nonzero()[:, 0]
                if first.numel():
                    si, ai = rows[0][first], rows[1][first]
                    with self.amp(device):
                        shuffled = self.block_hidden(kv_in, anchors[:, sl], probe_roots[:, sl])
                        pred_sh = model.to_target_ids(self.head(shuffled[si, ai, 1], probe_roots[si, ai + a0]).argmax(-1))
                    zero = torch.zeros_like(si)
                    per_k("shuffled_root_acc", zero, (pred_sh == target_top[si, ai + a0, 0]).float())
                    per_k("shuffled_root_same_argmax", zero, (pred_sh == torch.cat(preds)[first]).float())
        if stepwise and kv_in is not kv:
            pairs = [(x, x_in.grad) for (k, v), (k_in, v_in) in zip(kv, kv_in) for x, x_in in ((k, k_in), (v, v_in))
                     if x_in.grad is not None]
            if pairs:
                torch.autograd.backward([x for x, _ in pairs], [g for _, g in pairs])

        metrics: dict[str, tuple[float, float]] = {"loss": (total_value, 1.0)}
        for k in range(b - 1):
            for name in ("loss", "acc"):
                if name in sums:
                    metrics[f"{name}_{k}"] = (float(sums[name][0][k]), float(sums[name][1][k]))
                else:
                    metrics[f"{name}_{k}"] = (0.0, 0.0)
        for name in ("shuffled_root_acc", "shuffled_root_same_argmax"):
            if name in sums:
                metrics[f"{name}_0"] = (float(sums[name][0][0]), float(sums[name][1][0]))
        metrics["chain_tau"] = (chain[0], chain[1])
        return (torch.tensor(total_value) if stepwise else total), metrics

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
    soft_labels = True
    layout = "jetspec"


class TreeFlashTraining(BlockTraining):
    """Only the correction trains; the backbone is a trained DFlash head, frozen."""

    Recipe = TreeFlashRecipe
    test_recipe = ("block_size=8", "backbone=random")
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

    def build_module(self, target, recipe: TreeFlashRecipe, input_ids: list[list[int]],
                     loss_mask: list[list[int]]) -> BlockModel:
        if recipe.backbone == "random":
            src, base = "random", random_block_model(target, seed=recipe.seed, num_hidden_layers=recipe.num_layers,
                                                      block_size=recipe.block_size).float()
        else:
            src = shipped_checkpoint("dflash", target.name) if recipe.backbone == "auto" else checkpoint_dir(recipe.backbone)
            base = load_block(src, target, "treeflash backbone")
        if base.config.causal:
            raise UserError(f"treeflash backbone '{src}' is causal (a JetSpec head); pass a DFlash checkpoint")
        if base.config.block_size != recipe.block_size:
            raise UserError(f"treeflash backbone '{src}' has block_size {base.config.block_size}; "
                            f"set block_size={base.config.block_size}")
        cfg = base.config.replace(ar_approximation="swiglu", ar_intermediate_size=recipe.ar_intermediate_size or None)
        vd = min(recipe.draft_vocab_size, target.vocab_size)
        new_vocab = False
        if vd and base.config.reduced_vocab and vd != base.config.draft_vocab_size:
            raise UserError(f"treeflash backbone '{src}' scores a draft vocabulary of {base.config.draft_vocab_size} ids; "
                            f"set draft_vocab_size={base.config.draft_vocab_size} (or 0: the backbone's)")
        if vd and not base.config.reduced_vocab and vd < target.vocab_size:  # the reduced variant on a full-vocab backbone
            cfg, new_vocab = cfg.replace(draft_vocab_size=vd), True
        model = BlockModel(cfg)
        missing = model.load_state_dict(base.state_dict(), strict=False).missing_keys
        assert all(k.startswith("ar_approximation.") or k in ("d2t", "t2d") for k in missing), missing
        if new_vocab:
            model.set_vocab_mapping(draft_vocabulary(input_ids, loss_mask, vd, cfg.vocab_size))
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("ar_approximation.") or recipe.backbone == "random")
        return model

    @property
    def frozen_backbone(self) -> bool:
        return self.recipe.backbone != "random"  # tests (random): the backbone trains too

    def head(self, hidden: Tensor, prev: Tensor) -> Tensor:
        """The corrected logits: ``prev`` is x[a+k-1], the true previous token (the root at depth 1)."""
        return self.score(self.module.corrected(hidden, F.embedding(prev, self.embed)))


__all__ = ["BlockRecipe", "TreeFlashRecipe", "BlockTraining", "DFlashTraining", "JetSpecTraining", "TreeFlashTraining",
           "select_anchors", "valid_anchors", "shuffled_roots"]
