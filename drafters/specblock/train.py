"""Training SpecBlock: K-slot blocks over cached target features, unrolled over 3 blocks.

Rows. A sequence x[0..T) gives R = T - 1 rows; row i holds (the target's features at position i,
token x_{i+1}) with slots at RoPE positions i + 1 + k, exactly the rows the drafter builds (drafter.py).
Slot k of row i predicts x_{i+2+k}.

Feature taps: EAGLE-3's (the hidden states entering layers 2, N//2, N-3, upstream SpecBlock's too)
plus the final state for the target's distribution, so ``cache_layers`` equals EAGLE-3's and the
feature cache built for ``--drafter eagle3`` on the same data and target is reused as is
(:func:`specbench.train.features.cache_key` hashes the target, the data and the layer set only).

Blocks (upstream ``OnlineSpecBlockModel``, ``num_ttt_blocks`` = 3 as its recipes run). Block 1 is every
row with the target's features; slot (i, k) attends to all K slots of rows < i and to slots <= k of row
i. Block b+1 draws M ~ U{1..K} (one M for the batch, as upstream), is conditioned on block b's draft
hidden state at slot M - 1 and fed the true token x_{i+1+o} (o: the cumulative offset), at the same
positions; its slot k predicts x_{i+2+o+k}. It attends as at inference: to block 1's K slots of rows < i,
to the slots 0..M-1 of every earlier block at row i, and to its own slots <= k. (Upstream also lets
block b+1 see block b+1's slots of earlier rows, which do not exist at inference; we leave that out.)

Losses, per block, summed over blocks:

* draft: soft cross-entropy from the target's distribution over the draft vocabulary (its logits at
  the draft ids, softmaxed) to slot k's, on rows whose predicted token is an assistant token whose
  target top-1 is in the draft vocabulary, under the valid-prefix mask (slot k counts only where slots
  0..k-1 predicted the target's top-1), weighted ``slot_decay ** k`` (0.8);
* rank (from ``rank_start_step`` on, weighted ``rank_weight``; before it, one block only as upstream's
  phase 1): the rank head's 4 classes against the bucketed rank of the target's top-1 in the draft's
  logits, with upstream's four parts: asymmetric ordinal label smoothing (kernel
  1 / (1 + |c - t| + max(t - c, 0))^2), asymmetric distance weight 1 + |t - p| + max(t - p, 0) (p the
  predicted class), per-slot class-frequency reweighting min(1, budget / count_c), and the rank-chain
  curriculum mask (slot k counts while the rank head was right on slots < k).

Metrics: block 1's per-slot top-1 accuracy ``acc_k`` (all scored rows) and loss ``loss_k`` (the
chain-masked soft CE), ``chain_tau`` (1 + the leading run of correct slots), later blocks'
``b{b}_acc_k`` / ``b{b}_loss_k``, the rank head's accuracy ``rank_acc`` and its confusion matrix
``rank_confusion_{true}_{pred}`` (shares of block-1 scored slot rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from drafters.common.vocab import draft_vocabulary
from drafters.eagle3.model import default_feature_layers
from drafters.specblock.checkpoint import save_specblock
from drafters.specblock.model import BlockOutput, SpecBlockConfig, SpecBlockModel, rank_labels, sdpa
from specbench.train.trainer import Batch, Trainable, TrainRecipe


@dataclass(frozen=True)
class SpecBlockRecipe(TrainRecipe):
    lr: float = 1e-3
    slots: int = 4  # K
    layers: int = 2
    blocks: int = 3  # blocks unrolled (upstream num_ttt_blocks)
    slot_decay: float = 0.8  # draft-loss weight of slot k is slot_decay ** k
    rank_start_step: int = 0  # training-mode loss calls before the rank loss (and the later blocks) start
    rank_weight: float = 1.0
    rank_budget_per_class: int = 10  # per-slot class-frequency reweighting (<= 0: off)
    draft_vocab_size: int = 4096  # as EAGLE-3's recipe (same data, same vocabulary choice)
    regenerate: bool = True  # as EAGLE-3's recipe (same data, same answer source)
    batch_tokens: int = 1024
    # the slot-k draft loss is a sum over the rows the valid-prefix mask keeps, divided by: "scored" =
    # every scored row of the slot (ours, the default), "chain" = the kept rows only (upstream)
    chain_norm: str = "scored"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.slots < 1 or self.layers < 1 or self.blocks < 1 or self.draft_vocab_size < 20:
            raise ValueError("slots, layers and blocks must be at least 1, draft_vocab_size at least 20")
        if not 0 < self.slot_decay <= 1 or self.rank_weight < 0 or self.rank_start_step < 0:
            raise ValueError("need 0 < slot_decay <= 1, rank_weight >= 0 and rank_start_step >= 0")
        if self.chain_norm not in ("scored", "chain"):
            raise ValueError("chain_norm must be 'scored' or 'chain'")


def ordinal_smooth(labels: Tensor, classes: int = 4) -> Tensor:
    """[N] -> [N, C] soft targets: 1 / (1 + |c - t| + max(t - c, 0))^2, normalised (upstream)."""
    diff = labels[:, None].float() - torch.arange(classes, device=labels.device).float()
    raw = 1.0 / (1.0 + diff.abs() + diff.clamp(min=0.0)).square()
    return raw / raw.sum(-1, keepdim=True)


def rank_loss_terms(rank_logits: Tensor, labels: Tensor, mask: Tensor, budget: int) -> tuple[Tensor, Tensor]:
    """(sum of weighted per-row CE, sum of weights) of one slot: ordinal smoothing, distance weight,
    class-frequency reweighting (``budget`` <= 0: off). rank_logits [N, C], labels [N], mask [N] float."""
    classes = rank_logits.shape[-1]
    onehot = F.one_hot(labels, classes).float()
    counts = (onehot * mask[:, None]).sum(0)
    weight = mask * ((budget / counts.clamp_min(1)).clamp(max=1.0)[labels] if budget > 0 else 1.0)
    ce = -(ordinal_smooth(labels, classes) * F.log_softmax(rank_logits.float(), dim=-1)).sum(-1)
    diff = (labels - rank_logits.argmax(-1)).float()
    dist = 1.0 + diff.abs() + diff.clamp(min=0.0)
    return (ce * dist * weight).sum(), weight.sum()


def block_mask(rows: int, k: int, valid_counts: list[int], device) -> Tensor:
    """[R*K, b*R*K] bool: block b (= len(valid_counts) + 1) against blocks 1..b (see the module doc).
    ``valid_counts`` [M_1, ..., M_{b-1}]: the slots of each earlier block a row sees at its own row."""
    r_of = torch.arange(rows * k, device=device) // k
    s_of = torch.arange(rows * k, device=device) % k
    earlier = r_of[None, :] < r_of[:, None]
    same = r_of[None, :] == r_of[:, None]
    if not valid_counts:
        return earlier | (same & (s_of[None, :] <= s_of[:, None]))
    parts = [earlier | (same & (s_of[None, :] < valid_counts[0]).expand_as(same))]
    parts += [same & (s_of[None, :] < m).expand_as(same) for m in valid_counts[1:]]
    parts.append(same & (s_of[None, :] <= s_of[:, None]))
    return torch.cat(parts, dim=1)


def block_attention(q: Tensor, blocks: list[tuple[Tensor, Tensor]], k: int, valid_counts: list[int],
                    chunk_rows: int = 128) -> Tensor:
    """Attention of block b = len(blocks) over blocks 1..b, equal to ``sdpa(q, cat keys, cat values,
    block_mask(R, k, valid_counts))`` but without most of the work that mask throws away.

    Only block 1's keys are seen across rows (causally); the keys of blocks 2..b are seen at the query's
    own row only. So the queries go in chunks of ``chunk_rows`` rows, each against block 1's keys up to
    the chunk's last row plus the later blocks' keys of the chunk's own rows, under the same mask
    restricted to those keys. q [B, nh, R*K, D]; blocks[j] = (keys, values) [B, nkv, R*K, D].
    """
    r = q.shape[2] // k
    device = q.device
    slot = torch.arange(k, device=device)
    # which key slots of a query's own row it sees, per block: the first M of earlier blocks, <= own of its own
    same_row = [(slot < m)[None, :].expand(k, k) for m in valid_counts] + [slot[None, :] <= slot[:, None]]
    out = []
    for a in range(0, r, chunk_rows):
        e = min(a + chunk_rows, r)
        qr = torch.arange(a, e, device=device).repeat_interleave(k)  # query rows
        qs = slot.repeat(e - a)  # query slots
        kr = torch.arange(e, device=device).repeat_interleave(k)
        ks = slot.repeat(e)
        parts = [(kr[None, :] < qr[:, None]) | ((kr[None, :] == qr[:, None]) & same_row[0][qs[:, None], ks[None, :]])]
        own_rows = kr[a * k:]  # the chunk's rows, as key rows
        own_slots = ks[a * k:]
        for j in range(1, len(blocks)):
            parts.append((own_rows[None, :] == qr[:, None]) & same_row[j][qs[:, None], own_slots[None, :]])
        keys = torch.cat([blocks[0][0][:, :, :e * k]] + [kk[:, :, a * k:e * k] for kk, _ in blocks[1:]], dim=2)
        values = torch.cat([blocks[0][1][:, :, :e * k]] + [v[:, :, a * k:e * k] for _, v in blocks[1:]], dim=2)
        out.append(sdpa(q[:, :, a * k:e * k], keys, values, torch.cat(parts, dim=1)))
    return torch.cat(out, dim=2)


def unroll(model: SpecBlockModel, tokens: Tensor, features: Tensor, ms: list[int]) -> list[BlockOutput]:
    """Every block's output over all rows: tokens [B, T], features [B, T, 3Ht]; ``ms`` the M drawn after
    each block but the last (len(ms) + 1 blocks)."""
    b, t = tokens.shape
    r, k = t - 1, model.config.slots
    device = tokens.device
    positions = torch.arange(1, r + 1, device=device)
    padded = torch.cat([tokens, tokens.new_zeros(b, sum(ms) + 1)], dim=1)
    keys: list[list[tuple[Tensor, Tensor]]] = [[] for _ in model.layers]  # per layer, per block
    outs: list[BlockOutput] = []
    cond, draft_cond, offset = features[:, :r], False, 0
    for blk in range(len(ms) + 1):

        def attend(layer: int, q: Tensor, kk: Tensor, v: Tensor) -> Tensor:
            keys[layer].append((kk, v))
            return block_attention(q, keys[layer], k, ms[:blk])

        ids = padded[:, 1 + offset : 1 + offset + r]
        out = model.run(cond, ids, positions, attend, draft_cond)
        outs.append(out)
        if blk < len(ms):
            m = ms[blk]
            cond, draft_cond, offset = out.hidden[:, :, m - 1], True, offset + m
    return outs


class SpecBlockTraining(Trainable):
    """The SpecBlock trainable for :func:`specbench.train.trainer.train`."""

    Recipe = SpecBlockRecipe
    test_recipe = ("blocks=2",)

    def __init__(self, target, recipe: SpecBlockRecipe, input_ids: list[list[int]], loss_mask: list[list[int]]):
        self.recipe = recipe
        vocab = draft_vocabulary(input_ids, loss_mask, min(recipe.draft_vocab_size, target.vocab_size), target.vocab_size)
        self.feature_layers = tuple(default_feature_layers(target.num_layers))
        cfg = SpecBlockConfig.for_target(target, draft_vocab_size=vocab.numel(), slots=recipe.slots,
                                         num_hidden_layers=recipe.layers, num_ttt_blocks=recipe.blocks,
                                         feature_layers=self.feature_layers)
        torch.manual_seed(recipe.seed)
        model = SpecBlockModel(cfg).float()
        with torch.no_grad():
            torch.nn.init.normal_(model.input_layer.position_queries.weight, std=0.02)  # upstream's init
        model.set_vocab_mapping(vocab)
        model.input_layer.embed_tokens.weight.data.copy_(target.model.get_input_embeddings().weight.detach().float().cpu())
        lm = target.model.get_output_embeddings().weight.detach().float().cpu()
        self.target_lm = lm[vocab].clone()  # [Vd, H]
        self.module = model
        self.final_layer = target.num_layers
        self.calls = 0  # training-mode loss calls (the rank loss starts at recipe.rank_start_step)
        self.generator = torch.Generator().manual_seed(recipe.seed)

    @property
    def cache_layers(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.feature_layers) | {self.final_layer}))

    def _draw_ms(self, n: int) -> list[int]:
        k = self.recipe.slots
        gen = self.generator if self.module.training else torch.Generator().manual_seed(self.recipe.seed)
        return [int(torch.randint(1, k + 1, (1,), generator=gen)) for _ in range(n)]

    def loss(self, batch: Batch) -> tuple[Tensor, dict[str, tuple[float, float]]]:
        model, recipe = self.module, self.recipe
        layers = self.cache_layers
        b, t = batch.tokens.shape
        r, k = t - 1, recipe.slots
        device = batch.tokens.device
        if self.target_lm.device != device:
            self.target_lm = self.target_lm.to(device)
        features = batch.hidden[:, :, [layers.index(i) for i in self.feature_layers]].reshape(b, t, -1)
        with torch.no_grad():
            final = batch.hidden[:, :, layers.index(self.final_layer)]
            target_logits = final @ self.target_lm.T  # [B, T, Vd]
            target_p = torch.softmax(target_logits, dim=-1)
            target_top = target_logits.argmax(-1)
            in_vocab = model.t2d.to(device)[batch.argmax]
            scored = batch.loss_mask & batch.valid  # the predicted token is an assistant token
        rank_on = recipe.rank_weight > 0 and (not model.training or self.calls >= recipe.rank_start_step)
        if model.training:
            self.calls += 1
        ms = self._draw_ms(recipe.blocks - 1) if rank_on else []
        outs = unroll(model, batch.tokens, features, ms)
        total = torch.zeros((), device=device)
        metrics: dict[str, tuple[float, float]] = {}
        rows = torch.arange(r, device=device)
        offset = 0
        for blk, out in enumerate(outs):
            chain = torch.ones(b, r, dtype=torch.bool, device=device)
            rank_chain = torch.ones(b, r, dtype=torch.bool, device=device)
            rank_sum = torch.zeros((), device=device)
            rank_den = torch.zeros((), device=device)
            lead = torch.ones(b, r, dtype=torch.bool, device=device)
            run = torch.zeros(b, r, device=device)
            for s in range(k):
                pos = rows + 1 + offset + s  # where the target's distribution for this slot sits
                ok = pos + 1 < t
                pos = pos.clamp(max=t - 2)
                valid = (scored[:, pos + 1] & in_vocab[:, pos]) & ok  # [B, R]
                logits = out.logits[:, :, s]  # [B, R, Vd]
                tgt = target_top[:, pos]  # [B, R]
                pred = logits.argmax(-1)
                hit = pred == tgt
                use = valid & chain
                rb, rj = use.nonzero(as_tuple=True)
                logp = torch.log_softmax(logits[rb, rj].float(), dim=-1)
                ce = -(target_p[rb, pos[rj]] * logp).sum(-1)
                n = ce.numel()
                norm = n if recipe.chain_norm == "chain" else int(valid.sum())
                total = total + recipe.slot_decay ** s * ce.sum() / max(norm, 1)
                pre = "" if blk == 0 else f"b{blk + 1}_"  # block 1: acc_k / loss_k (the card's table)
                metrics[f"{pre}loss_{s}"] = (float(ce.sum().detach()), float(n))
                metrics[f"{pre}acc_{s}"] = (float((hit & valid).sum()), float(valid.sum()))
                if blk == 0:
                    run = run + (lead & valid & hit).float()
                    lead = lead & hit
                if rank_on or not model.training:
                    labels = rank_labels(logits.detach(), tgt)  # [B, R]
                    rmask = valid & rank_chain
                    rl = out.rank_logits[:, :, s]
                    num, den = rank_loss_terms(rl[rmask], labels[rmask], torch.ones(int(rmask.sum()), device=device),
                                               recipe.rank_budget_per_class)
                    rank_sum, rank_den = rank_sum + num, rank_den + den
                    rpred = rl.argmax(-1)
                    rank_chain = rank_chain & (rpred == labels)
                    if blk == 0:
                        lv, pv = labels[valid], rpred[valid]
                        metrics["rank_acc"] = tuple(a + c for a, c in zip(metrics.get("rank_acc", (0.0, 0.0)),
                                                                          (float((lv == pv).sum()), float(lv.numel()))))
                        for tc in range(4):
                            for pc in range(4):
                                key = f"rank_confusion_{tc}_{pc}"
                                prev = metrics.get(key, (0.0, 0.0))
                                metrics[key] = (prev[0] + float(((lv == tc) & (pv == pc)).sum()), prev[1] + float(lv.numel()))
                chain = chain & hit
            if blk == 0:
                first = (rows + 2 < t)[None, :] & scored[:, (rows + 2).clamp(max=t - 1)] & in_vocab[:, (rows + 1).clamp(max=t - 2)]
                metrics["chain_tau"] = (float((1 + run)[first].sum()), float(first.sum()))
            if rank_on and rank_den > 0:
                rank_loss = rank_sum / rank_den
                total = total + recipe.rank_weight * rank_loss
                metrics["rank_loss" if blk == 0 else f"b{blk + 1}_rank_loss"] = (float(rank_loss.detach()), 1.0)
            if blk < len(ms):
                offset += ms[blk]
        metrics["loss"] = (float(total.detach()), 1.0)
        return total, metrics

    def save(self, out: Path, dtype: torch.dtype = torch.float16) -> Path:
        model = SpecBlockModel(self.module.config)
        model.load_state_dict(self.module.state_dict())
        return save_specblock(model.to(dtype), out)


__all__ = ["SpecBlockRecipe", "SpecBlockTraining", "unroll", "block_mask", "ordinal_smooth", "rank_loss_terms"]
