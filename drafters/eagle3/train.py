"""Training the EAGLE-3 head: the training-time-test (TTT) unroll over cached target features.

Rows. A sequence x[0..T) gives R = T - 1 head rows; row j holds (target embedding of x[j+1],
fc(features at position j)) at RoPE position j, the same rows the drafter builds at inference
(drafter.py). Its output predicts x[j+2].

Unroll (``ttt_steps`` = 7, SpecForge's ``ttt_length``). Step 0 runs every row causally. Step i >= 1
feeds row j the embedding of the true token x[j+1+i] and the head's own step-(i-1) output at row
j, at RoPE position j + i, and predicts x[j+2+i]. A step-i query at row j attends to

* the step-0 keys of rows 0..j (the committed context up to the "root" x[j+1]), and
* the keys of steps 1..i at row j only (its own self-fed ancestors and itself: the diagonal),

which is exactly what a chain of self-fed tree nodes sees at inference. :func:`ttt_attention` computes
that without materialising the [R, (i+1)R] mask: causal scores over step 0 plus one dot product per
diagonal key. :func:`reference_unroll` computes the same thing slowly through the inference path
(the head's own KV cache and masks), and a test compares them.

Loss at step i: soft cross-entropy from the target's distribution over the draft vocabulary (the
target's logits restricted to the draft ids, softmaxed) to the head's, averaged over rows whose
predicted token is an assistant token and whose target top-1 lies in the draft vocabulary
(upstream's position mask), weighted 0.8^i. ``acc_i`` is the share of those rows where the head's
top-1 equals the target's: the per-depth proxy for acceptance.

Choices that are ours (upstream has no fixed answer): the draft vocabulary is the
``draft_vocab_size`` most frequent next tokens of the training set's assistant positions (ties by
id, then sorted, like upstream's ``d2t`` construction); every weight starts from PyTorch's default
init under the recipe's seed. Starting ``lm_head`` / ``norm`` from the target's rows
(``init_lm_head_from_target``) sounded like a good prior with little data, but on smollm2-135m it
started at a soft CE of ~16 nats and was still at 10.5 after 14 steps, against 6.5 from the default
init, so it is off by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from drafters.eagle3.checkpoint import save_eagle3
from drafters.common.nn import rotate_half
from drafters.common.precision import bf16_autocast, check_precision
from drafters.common.vocab import draft_vocabulary
from drafters.eagle3.model import Eagle3Head, Eagle3HeadConfig, default_feature_layers, new_cache
from specbench.train.trainer import Batch, Trainable, TrainRecipe

PRECISIONS = ("fp32", "bf16")  # the recipe's precision (drafters.common.precision)


@dataclass(frozen=True)
class Eagle3Recipe(TrainRecipe):
    lr: float = 1e-3
    ttt_steps: int = 7  # self-feeding steps unrolled in training (the drafter's depth at inference)
    step_decay: float = 0.8  # loss weight of step i is step_decay ** i
    draft_vocab_size: int = 4096  # lm_head rows; 4096 keeps the fp16 head of smollm2-135m under 16 MB
    init_lm_head_from_target: bool = False  # measured worse here: initial soft CE ~16 nats against ~9 from default init
    batch_tokens: int = 1024  # small data: more, smaller steps (~33 steps per 20k-token epoch)
    # target-regenerated answers: measured at 200k tokens, tau +8% (geometric mean of 5 tasks) over the
    # data sets' own answers (reports/eagle3.md, "Regenerated against original answers"; sweeps/eagle3_answers.toml)
    regenerate: bool = True
    # training arithmetic. fp32: everything. bf16: the head's forward (the TTT unroll and its lm_head)
    # under torch.autocast in bfloat16, with float32 weights, optimizer, norms, softmax and loss, as the
    # block families' bf16 and upstream (SpecForge trains in bf16) do
    precision: str = "fp32"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ttt_steps < 1 or self.draft_vocab_size < 1:
            raise ValueError("ttt_steps and draft_vocab_size must be at least 1")
        check_precision(self.precision, PRECISIONS)


def ttt_attention(attn, x: Tensor, cos: Tensor, sin: Tensor, keys: list[tuple[Tensor, Tensor]], causal: Tensor) -> Tensor:
    """One TTT step of the head's attention, batched.

    x [B, R, 2H]; cos, sin [R, hd]; ``keys`` holds the (k, v) [B, nkv, R, hd] of earlier steps
    (step 0 first) and gets this step's appended; causal [R, R] bool. Returns [B, R, H].
    """
    b, r, _ = x.shape
    nh, nkv, hd = attn.n_heads, attn.n_kv, attn.head_dim
    q = attn.q_proj(x).view(b, r, nh, hd).transpose(1, 2)  # [B, nh, R, hd]
    k = attn.k_proj(x).view(b, r, nkv, hd).transpose(1, 2)
    v = attn.v_proj(x).view(b, r, nkv, hd).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    keys.append((k, v))
    rep = nh // nkv
    scale = 1.0 / math.sqrt(hd)
    k0, v0 = (t.repeat_interleave(rep, dim=1) for t in keys[0])
    scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]  # [B, nh, R, R]
    for kk, _ in keys[1:]:  # one diagonal key per later step: row j sees its own row only
        scores.append((q * kk.repeat_interleave(rep, dim=1)).sum(-1, keepdim=True) * scale)  # [B, nh, R, 1]
    probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    out = probs[..., :r] @ v0
    for i, (_, vv) in enumerate(keys[1:]):
        out = out + probs[..., r + i : r + i + 1] * vv.repeat_interleave(rep, dim=1)
    return attn.o_proj(out.transpose(1, 2).reshape(b, r, nh * hd))


def ttt_layer(head: Eagle3Head, embeds: Tensor, hidden: Tensor, positions: Tensor, keys: list, causal: Tensor) -> Tensor:
    """The midlayer of :meth:`Eagle3Head.forward`, batched, with :func:`ttt_attention`."""
    layer = head.midlayer
    cos, sin = head.rope(positions, hidden.dtype)
    normed = layer.hidden_norm(hidden)
    residual = normed if layer.norm_before_residual else hidden
    x = torch.cat([layer.input_layernorm(embeds.to(hidden.dtype)), normed], dim=-1)
    h = residual + ttt_attention(layer.self_attn, x, cos, sin, keys, causal)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def ttt_unroll(head: Eagle3Head, embed: nn.Embedding | Tensor, tokens: Tensor, features: Tensor, steps: int) -> list[Tensor]:
    """The head's outputs [B, R, H] at every step (list of ``steps``), R = T - 1.

    tokens [B, T]; features [B, T, 3 * Ht] (the fc input). Rows past a sequence's end read
    padding and are never used by a valid row (causal + diagonal).
    """
    b, t = tokens.shape
    r = t - 1
    emb = embed if isinstance(embed, Tensor) else embed.weight
    causal = torch.ones(r, r, dtype=torch.bool, device=tokens.device).tril()
    padded = torch.cat([tokens, tokens.new_zeros(b, steps)], dim=1)  # x[j+1+i] past the end reads 0
    hidden = head.fuse(features[:, :r])
    keys: list[tuple[Tensor, Tensor]] = []
    outs = []
    base = torch.arange(r, device=tokens.device)
    for i in range(steps):
        ids = padded[:, 1 + i : 1 + i + r]
        hidden = ttt_layer(head, F.embedding(ids, emb), hidden, base + i, keys, causal)
        outs.append(hidden)
    return outs


@torch.no_grad()
def reference_unroll(head: Eagle3Head, embed: Tensor, tokens: Tensor, features: Tensor, steps: int) -> list[Tensor]:
    """:func:`ttt_unroll` for ONE sequence (tokens [T], features [T, 3Ht]) the slow way: for every
    row j, run the committed rows 0..j through the head's KV cache, then self-feed the chain
    x[j+2], x[j+3], ... one step at a time exactly as the drafter does at inference."""
    t = tokens.shape[0]
    r = t - 1
    outs = [torch.zeros(r, head.config.hidden_size) for _ in range(steps)]
    for j in range(r):
        cache = new_cache(head)
        rows = torch.arange(j + 1)
        h = head(embed[tokens[1 : j + 2]], head.fuse(features[: j + 1]), rows, cache)  # causal
        h = h[-1:]
        outs[0][j] = h[0]
        for i in range(1, steps):
            tok = tokens[j + 1 + i] if j + 1 + i < t else tokens.new_tensor(0)
            mask = torch.ones(1, cache.length + 1, dtype=torch.bool)
            h = head(embed[tok][None], h, torch.tensor([j + i]), cache, mask)
            outs[i][j] = h[0]
    return outs


class Eagle3Training(Trainable):
    """The EAGLE-3 trainable for :func:`specbench.train.trainer.train`."""

    Recipe = Eagle3Recipe
    test_recipe = ("ttt_steps=4",)

    def __init__(self, target, recipe: Eagle3Recipe, input_ids: list[list[int]], loss_mask: list[list[int]]):
        self.recipe = recipe
        vocab = draft_vocabulary(input_ids, loss_mask, min(recipe.draft_vocab_size, target.vocab_size), target.vocab_size)
        cfg = Eagle3HeadConfig.for_target(target, draft_vocab_size=vocab.numel(),
                                          feature_layers=default_feature_layers(target.num_layers))
        torch.manual_seed(recipe.seed)
        head = Eagle3Head(cfg).float()
        head.set_vocab_mapping(vocab)
        lm = target.model.get_output_embeddings().weight.detach().float().cpu()
        self.target_lm = lm[vocab].clone()  # [Vd, H]: the target's lm_head rows of the draft vocab
        if recipe.init_lm_head_from_target:
            with torch.no_grad():
                head.lm_head.weight.copy_(self.target_lm)
                final_norm = getattr(target.model.base_model, "norm", None)
                if final_norm is not None and final_norm.weight.shape == head.norm.weight.shape:
                    head.norm.weight.copy_(final_norm.weight.detach().float().cpu())
        self.module = head
        self.embed = target.model.get_input_embeddings().weight.detach().float().cpu()  # frozen, not saved
        self.final_layer = target.num_layers  # HF hidden_states[N]: the final normed state
        self.feature_layers = tuple(cfg.feature_layers)

    @property
    def cache_layers(self) -> tuple[int, ...]:
        """Hidden-state indices the feature cache must hold."""
        return tuple(sorted(set(self.feature_layers) | {self.final_layer}))

    def loss(self, batch: Batch) -> tuple[Tensor, dict[str, tuple[float, float]]]:
        head = self.module
        layers = self.cache_layers
        fidx = [layers.index(i) for i in self.feature_layers]
        b, t = batch.tokens.shape
        r = t - 1
        features = batch.hidden[:, :, fidx].reshape(b, t, -1)  # [B, T, 3H] low/mid/high
        device = batch.tokens.device
        if self.embed.device != device:  # once: the frozen target tensors follow the batches
            self.embed, self.target_lm = self.embed.to(device), self.target_lm.to(device)
        target_lm = self.target_lm
        with torch.no_grad():
            final = batch.hidden[:, :, layers.index(self.final_layer)]  # [B, T, H]
            target_logits = final @ target_lm.T  # [B, T, Vd]
            target_p = torch.softmax(target_logits, dim=-1)
            target_top = target_logits.argmax(-1)  # [B, T] (draft ids)
            in_vocab = head.t2d.to(device)[batch.argmax]  # [B, T]: target's top-1 is in the draft vocab
        steps = self.recipe.ttt_steps
        amp = bf16_autocast(device, self.recipe.precision == "bf16")
        with amp:
            outs = ttt_unroll(head, self.embed, batch.tokens, features, steps)
        total = torch.zeros((), device=device)
        metrics: dict[str, tuple[float, float]] = {}
        for i, h in enumerate(outs):
            # row j predicts x[j+2+i]; the target's distribution for it sits at position j+1+i
            pos = torch.arange(r, device=device) + 1 + i  # [R]
            ok = pos + 1 < t
            pos = pos.clamp(max=t - 2)
            mask = (batch.loss_mask[:, pos + 1] & batch.valid[:, pos + 1] & in_vocab[:, pos]) & ok  # [B, R]
            if i == 0:  # how often the target's greedy token is draftable at all: the accuracies count only those
                scorable = batch.loss_mask[:, pos + 1] & batch.valid[:, pos + 1] & ok
                metrics["in_vocab"] = (float(mask.sum()), float(scorable.sum()))
            rows_b, rows_j = mask.nonzero(as_tuple=True)  # the lm_head runs on scored rows only
            with amp:
                logits = head.draft_logits(h[rows_b, rows_j])
            logp = torch.log_softmax(logits.float(), dim=-1)  # [n, Vd]
            at = pos[rows_j]
            ce = -(target_p[rows_b, at] * logp).sum(-1)  # [n]
            n = ce.numel()
            step_loss = ce.sum() / max(n, 1)
            total = total + self.recipe.step_decay**i * step_loss
            hits = int((logp.argmax(-1) == target_top[rows_b, at]).sum())
            metrics[f"loss_{i}"] = (float(ce.sum().detach()), float(n))
            metrics[f"acc_{i}"] = (float(hits), float(n))
        metrics["loss"] = (float(total.detach()), 1.0)
        return total, metrics

    def save(self, out: Path, dtype: torch.dtype = torch.float16) -> Path:
        head = Eagle3Head(self.module.config)
        head.load_state_dict(self.module.state_dict())
        return save_eagle3(head.to(dtype), out)


__all__ = ["Eagle3Recipe", "Eagle3Training", "draft_vocabulary", "ttt_unroll", "reference_unroll", "ttt_attention"]
