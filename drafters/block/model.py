"""The shared block backbone of DFlash, JetSpec and TreeFlash (z-lab/dflash ``dflash/model.py``).

One drafter forward turns a block ``[root, MASK x (B-1)]`` into B hidden states; positions
1..B-1 give the drafts for depths 1..B-1 through the TARGET's ``lm_head``. Parameter names are the
released ones, so a ``state_dict`` is a z-lab DFlash checkpoint's key set::

    fc.weight                                   [H, k * Ht]  the k tapped target layers -> H (no bias)
    hidden_norm.weight                          [H]          RMSNorm of the context stream
    layers.{i}.input_layernorm.weight           [H]
    layers.{i}.self_attn.{q,k,v,o}_proj.weight               Qwen3 attention (no bias)
    layers.{i}.self_attn.{q_norm,k_norm}.weight [head_dim]   per-head RMSNorm of queries / keys
    layers.{i}.post_attention_layernorm.weight  [H]
    layers.{i}.mlp.{gate,up,down}_proj.weight                SwiGLU MLP
    norm.weight                                 [H]          final norm before the target's lm_head

plus, when present: ``mask_embedding`` [H] (ours: a learned mask embedding for targets with no
spare token id; upstream uses a reserved id of the target's embedding), TreeFlash's
``ar_approximation.{ug.weight, ug.bias, d.weight, norm.weight}``, and ``d2t`` [Vd] / ``t2d`` [V] of
the reduced draft vocabulary variant.

Reduced draft vocabulary (``draft_vocab_size`` < ``vocab_size``; ours, an explicit named variant,
never the default): the head scores only ``Vd`` target ids, through the rows of the TARGET's
lm_head for those ids (nothing new is learned: the variant buys a ``V / Vd`` cheaper lm_head and
loss). The ids and their maps are EAGLE-3's (:mod:`drafters.common.vocab`): draft id i is target
id ``i + d2t[i]``. The paper-faithful head scores the whole vocabulary and has no maps.

Context injection (every layer): the context stream ``c = hidden_norm(fc(features))`` is not
updated by the layers; in layer l its keys/values are ``k_proj_l(c)``, ``v_proj_l(c)`` (the same
projections as the block's, with ``k_norm`` and RoPE at the context rows' own positions). Queries
come from the block only. A block query sees the context rows strictly before the root plus
the block keys: all of them (DFlash, TreeFlash: bidirectional) or those at or before its own
position (JetSpec: causal).

Positions. Context row p is the target's hidden state at position p (its output on token x[p]);
the root x[L-1] sits at block position 0 = absolute position L-1, block position k at L-1+k.

State. The module holds no run state: a :class:`ContextCache` owned by the drafter keeps each
layer's context keys/values, and grows by the committed tokens' rows every round. The block's own
keys are never cached, so each layer's mask is [every cached context key of THAT layer | the block
part (all ones, or lower-triangular for JetSpec)], built from the keys the layer actually holds;
a shared length (layer 0's) cannot leak into later layers, the bug JetSpec warns about for
implementations that cache the block.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from drafters.common.kv_cache import LayerCaches
from drafters.common.nn import GatedMLP, RMSNorm, apply_rope, init_normal_
from drafters.common.rope import Rotary
from drafters.common.shape import TargetShaped, target_shape
from drafters.common.vocab import random_vocabulary, target_ids_of, vocab_maps
from specbench.errors import UserError


def build_target_layer_ids(num_target_layers: int, num_taps: int) -> tuple[int, ...]:
    """Upstream's taps: layer OUTPUT ids spread evenly from 1 to N-3 (Qwen3-8B, 5 taps: 1, 9, 17, 25, 33)."""
    if num_taps == 1:
        return (num_target_layers // 2,)
    start, end = 1, max(num_target_layers - 3, 1)
    return tuple(int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps))


@dataclass(frozen=True)
class BlockConfig(TargetShaped):
    """Shape and options of a block drafter (its ``config.json``)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's (the drafter decodes with the target's lm_head)
    target_layer_ids: tuple[int, ...]  # layer OUTPUT ids (HF hidden_states index id + 1)
    num_target_layers: int
    block_size: int = 16
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # the target's HF rope_scaling (llama3, yarn, ...), None = plain RoPE
    max_position_embeddings: int = 8192
    target_hidden_size: int | None = None  # None = hidden_size
    mask_token_id: int | None = None  # None = a learned ``mask_embedding`` (no spare id in the target)
    causal: bool = False  # JetSpec's causal block mask (``dflash_config.causal_head``)
    ar_approximation: str | None = None  # TreeFlash: "swiglu" or None
    ar_intermediate_size: int | None = None  # TreeFlash MLP width; None = intermediate_size (upstream)
    draft_vocab_size: int | None = None  # ours: a reduced draft vocabulary (d2t/t2d); None = the target's (upstream)
    extra: dict = field(default_factory=dict, compare=False)  # other config.json keys, kept on save

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise ValueError("block_size must be at least 2 (the root plus one draft)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer")
        if self.ar_approximation not in (None, "swiglu"):
            raise ValueError(f"ar_approximation must be 'swiglu' or null, got {self.ar_approximation!r}")
        if self.draft_vocab_size is not None and not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"need 0 < draft_vocab_size <= vocab_size, got {self.draft_vocab_size} and {self.vocab_size}")

    @property
    def reduced_vocab(self) -> bool:
        """True for the reduced draft vocabulary variant (a head over fewer ids than the target's)."""
        return self.draft_vocab_size is not None and self.draft_vocab_size < self.vocab_size

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """HF ``hidden_states`` indices of the taps (the output of layer id is index id + 1)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    def replace(self, **changes: Any) -> "BlockConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_target(cls, target, num_hidden_layers: int = 2, block_size: int = 16, **overrides: Any) -> "BlockConfig":
        """A drafter shaped like ``target``'s layers, tapping ``num_hidden_layers`` target layers."""
        values: dict[str, Any] = dict(
            target_shape(target), num_hidden_layers=num_hidden_layers,
            target_layer_ids=build_target_layer_ids(target.num_layers, num_hidden_layers),
            num_target_layers=target.num_layers, block_size=block_size,
        )
        values.update(overrides)
        return cls(**values)


# --------------------------------------------------------------------------- cache


ContextCache = LayerCaches  # per-layer context keys/values (drafters.common.kv_cache), owned by the drafter


# --------------------------------------------------------------------------- layers


class BlockAttention(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        hd = cfg.dim_per_head
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """x [..., n, H] -> rotated keys and values [..., nkv, n, hd]."""
        *lead, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(*lead, n, self.n_kv, self.head_dim)).transpose(-2, -3)
        v = self.v_proj(x).view(*lead, n, self.n_kv, self.head_dim).transpose(-2, -3)
        return apply_rope(k, cos.unsqueeze(-3), sin.unsqueeze(-3)), v

    def attention(self, scores: Tensor) -> Tensor:
        """Attention weights [..., nh, B, T + B] over [context keys | block keys] from masked scores
        (float32). A method of its own so a diagnostic can read the weights
        (``scripts/block-heldout-probe --attention``)."""
        return torch.softmax(scores.float(), dim=-1)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, k_ctx: Tensor, v_ctx: Tensor,
                ctx_visible: Tensor | None, causal: bool) -> Tensor:
        """Block rows x [..., B, H] attend to context keys [..., nkv, T, hd] (broadcast over the
        leading dims) and to the block's own keys.

        ctx_visible: bool broadcastable to [..., 1, 1, T] (None = every context row); causal: block
        row j sees block rows <= j only.
        """
        *lead, b, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(*lead, b, self.n_heads, self.head_dim)).transpose(-2, -3)  # [..., nh, B, hd]
        q = apply_rope(q, cos.unsqueeze(-3), sin.unsqueeze(-3))
        k_blk, v_blk = self.kv(x, cos, sin)  # [..., nkv, B, hd]
        rep = self.n_heads // self.n_kv
        if rep > 1:
            k_ctx, v_ctx, k_blk, v_blk = (t.repeat_interleave(rep, dim=-3) for t in (k_ctx, v_ctx, k_blk, v_blk))
        scale = 1.0 / math.sqrt(self.head_dim)
        s_ctx = (q @ k_ctx.transpose(-1, -2)) * scale  # [..., nh, B, T]
        if ctx_visible is not None:
            s_ctx = s_ctx.masked_fill(~ctx_visible, float("-inf"))
        s_blk = (q @ k_blk.transpose(-1, -2)) * scale  # [..., nh, B, B]
        if causal:
            tri = torch.ones(b, b, dtype=torch.bool, device=x.device).tril()
            s_blk = s_blk.masked_fill(~tri, float("-inf"))
        t = s_ctx.shape[-1]
        probs = self.attention(torch.cat([s_ctx, s_blk], dim=-1)).to(q.dtype)
        out = probs[..., :t] @ v_ctx + probs[..., t:] @ v_blk  # [..., nh, B, hd]
        return self.o_proj(out.transpose(-2, -3).reshape(*lead, b, self.n_heads * self.head_dim))


class BlockLayer(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, k_ctx: Tensor, v_ctx: Tensor,
                ctx_visible: Tensor | None, causal: bool) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, k_ctx, v_ctx, ctx_visible, causal)
        return h + self.mlp(self.post_attention_layernorm(h))


class SwiGLUApproximation(nn.Module):
    """TreeFlash's AR approximation: a correction of block position p's hidden state from the
    previous token. ``d`` starts at zero, so an untrained correction leaves the backbone exact."""

    def __init__(self, hidden: int, inter: int, eps: float = 1e-6):
        super().__init__()
        self.ug = nn.Linear(2 * hidden, 2 * inter, bias=True)
        self.d = nn.Linear(inter, hidden, bias=False)
        self.norm = RMSNorm(hidden, eps)
        nn.init.zeros_(self.d.weight)

    def forward(self, prev_embeds: Tensor, normed_hidden: Tensor) -> Tensor:
        u, g = self.ug(torch.cat([self.norm(prev_embeds), normed_hidden], dim=-1)).chunk(2, dim=-1)
        return self.d(F.silu(g) * u)


# --------------------------------------------------------------------------- the model


class BlockModel(nn.Module):
    """fc + hidden_norm + decoder layers + norm (+ mask embedding, + TreeFlash correction)."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(len(config.target_layer_ids) * config.feature_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.mask_token_id is None:
            self.mask_embedding = nn.Parameter(torch.zeros(config.hidden_size))
        else:
            self.mask_embedding = None
        self.ar_approximation = None
        if config.ar_approximation == "swiglu":
            inter = config.ar_intermediate_size or config.intermediate_size
            self.ar_approximation = SwiGLUApproximation(config.hidden_size, inter)
        if config.reduced_vocab:  # the first Vd ids until set_vocab_mapping / a checkpoint fills them
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
            t2d[: config.draft_vocab_size] = True
            self.register_buffer("t2d", t2d)
        # transformers' own RoPE for the target's rope_scaling; a constant buffer, not saved
        self.rotary = Rotary(config.dim_per_head, config.rope_theta, config.rope_scaling, config.max_position_embeddings)

    # ------------------------------------------------------------ pieces
    def context(self, features: Tensor) -> Tensor:
        """[..., k * Ht] concatenated tapped target states -> the context stream [..., H]."""
        return self.hidden_norm(self.fc(features))

    def block_embeds(self, root_embeds: Tensor, embed_weight: Tensor) -> Tensor:
        """[..., H] root embeddings -> [..., B, H]: the root then B-1 mask embeddings."""
        cfg = self.config
        mask = embed_weight[cfg.mask_token_id] if self.mask_embedding is None else self.mask_embedding
        mask = mask.to(root_embeds.dtype).expand(*root_embeds.shape[:-1], cfg.block_size - 1, cfg.hidden_size)
        return torch.cat([root_embeds.unsqueeze(-2), mask], dim=-2)

    def rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return self.rotary(positions, dtype)

    def logits(self, hidden: Tensor, lm_head: Tensor) -> Tensor:
        """Pre-norm hidden states [..., H] -> logits through ``lm_head`` [Vd, H]: :meth:`draft_lm_head`
        of the target's (the target's own weight when the vocabulary is full), in ``lm_head``'s dtype
        (training may pass a bfloat16 copy)."""
        return self.norm(hidden).to(lm_head.dtype) @ lm_head.T

    # ------------------------------------------------------------ the draft vocabulary
    def draft_ids(self) -> Tensor | None:
        """[Vd] target ids of the draft vocabulary (draft id order), None for the full vocabulary."""
        return target_ids_of(self.d2t) if self.config.reduced_vocab else None

    def draft_lm_head(self, lm_head: Tensor) -> Tensor:
        """The rows of the target's lm_head [V, H] this head scores ([Vd, H]; ``lm_head`` itself when full)."""
        ids = self.draft_ids()
        return lm_head if ids is None else lm_head[ids.to(lm_head.device)]

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft ids (indices into :meth:`logits`' last dim) -> target ids."""
        if not self.config.reduced_vocab:
            return draft_ids
        d2t = self.d2t.to(draft_ids.device)
        return draft_ids + d2t[draft_ids]

    def draft_index(self) -> Tensor | None:
        """[V] draft id of every target id, -1 outside the draft vocabulary (None when full)."""
        ids = self.draft_ids()
        if ids is None:
            return None
        index = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=ids.device)
        index[ids] = torch.arange(ids.numel(), device=ids.device)
        return index

    @torch.no_grad()
    def set_vocab_mapping(self, target_ids: Tensor) -> None:
        """Make the draft vocabulary ``target_ids`` ([Vd] distinct target ids, order kept)."""
        if not self.config.reduced_vocab or torch.as_tensor(target_ids).numel() != self.config.draft_vocab_size:
            raise ValueError(f"need {self.config.draft_vocab_size} ids for a reduced draft vocabulary")
        d2t, t2d = vocab_maps(torch.as_tensor(target_ids).cpu(), self.config.vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def corrected(self, hidden: Tensor, prev_embeds: Tensor) -> Tensor:
        """TreeFlash: pre-norm hidden [..., H] corrected by the previous token's embedding [..., H]."""
        return hidden + self.ar_approximation(prev_embeds, self.norm(hidden))

    # ------------------------------------------------------------ inference
    def forward_block(self, block: Tensor, block_positions: Tensor, context: Tensor, context_positions: Tensor,
                      cache: ContextCache) -> Tensor:
        """One drafter forward at inference (one sequence).

        block [B, H] embeddings at block_positions [B]; context [m, H] the NEW context rows
        (``context(features)``) at context_positions [m], appended to ``cache`` in every layer.
        Returns the pre-norm hidden states [B, H].
        """
        causal = self.config.causal
        cos_b, sin_b = self.rope(block_positions, block.dtype)
        cos_c, sin_c = self.rope(context_positions, block.dtype)
        h = block
        for i, layer in enumerate(self.layers):
            k_new, v_new = layer.self_attn.kv(context, cos_c, sin_c)
            k_ctx, v_ctx = cache.append(i, k_new, v_new)
            h = layer(h, cos_b, sin_b, k_ctx, v_ctx, None, causal)
        return h

    # ------------------------------------------------------------ training
    def forward_anchors(self, block: Tensor, anchors: Tensor, context: Tensor) -> Tensor:
        """Many blocks of a batch of sequences at once (training).

        block [S, A, B, H]: the block embeddings of A anchors per sequence; anchors [S, A] their
        root positions; context [S, T, H] the context stream of every position. Block (s, a) sees
        context rows < anchors[s, a] and its own block. Returns pre-norm hidden states [S, A, B, H].
        """
        return self.forward_anchors_kv(block, anchors, self.context_kv(context))

    def context_kv(self, context: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every layer's context keys and values [S, nkv, T, hd] from the context stream [S, T, H]
        (at positions 0..T-1): computed once per batch, shared by every chunk of anchors."""
        ctx_pos = torch.arange(context.shape[1], device=context.device)
        cos_c, sin_c = self.rope(ctx_pos, context.dtype)  # [T, hd]
        return [layer.self_attn.kv(context, cos_c, sin_c) for layer in self.layers]

    def forward_anchors_kv(self, block: Tensor, anchors: Tensor, kv: list[tuple[Tensor, Tensor]]) -> Tensor:
        """:meth:`forward_anchors` from :meth:`context_kv`'s keys and values."""
        s, a, b, _ = block.shape
        # no block sees context rows at or after its root: keep the rows before the last root only
        t = max(1, min(kv[0][0].shape[-2], int(anchors.max()) if anchors.numel() else 1))
        kv = [(k[..., :t, :], v[..., :t, :]) for k, v in kv]
        block_pos = anchors[..., None] + torch.arange(b, device=block.device)  # [S, A, B]
        cos_b, sin_b = self.rope(block_pos, block.dtype)  # [S, A, B, hd]
        visible = self.context_visible(anchors, t)[:, :, None, None, :]  # [S, A, 1, 1, T]
        h = block
        for layer, (k_ctx, v_ctx) in zip(self.layers, kv):
            h = layer(h, cos_b, sin_b, k_ctx[:, None], v_ctx[:, None], visible, self.config.causal)
        return h

    def context_visible(self, anchors: Tensor, t: int) -> Tensor:
        """[S, A, T] bool: the context rows 0..t-1 each block of :meth:`forward_anchors_kv` sees, those
        before its root (scripts/block-heldout-probe narrows it for its context probe)."""
        return torch.arange(t, device=anchors.device) < anchors[..., None]

    # ------------------------------------------------------------ set-up
    def init_random(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded normal(0, std) init of every matrix; norms are ones; biases and TreeFlash's ``d`` zero."""
        init_normal_(self, generator, std, zero=lambda name: name.startswith("ar_approximation.d."))


@dataclass(frozen=True)
class Backbone:
    """What a family's backbone is: the block mask and the optional TreeFlash correction."""

    causal: bool = False  # JetSpec's causal block (row j sees block rows <= j); else bidirectional
    ar_approximation: str | None = None  # TreeFlash's previous-token correction ("swiglu"), built at random init

    def check(self, model: BlockModel, family: str) -> None:
        """Refuse (one line) a checkpoint whose block mask is not this backbone's."""
        if model.config.causal and not self.causal:
            raise UserError(f"{family}: this checkpoint has a causal block (a JetSpec head); run it with --drafter jetspec")
        if self.causal and not model.config.causal:
            raise UserError(f"{family}: this checkpoint has a bidirectional block (a DFlash head; no "
                            "dflash_config.causal_head); run it with --drafter dflash")


BIDIRECTIONAL = Backbone()
CAUSAL = Backbone(causal=True)
BIDIRECTIONAL_WITH_CORRECTION = Backbone(ar_approximation="swiglu")


def random_block_model(target, seed: int = 0, **overrides: Any) -> BlockModel:
    """A seeded random-init block drafter for ``target`` (tests, training start)."""
    cfg = BlockConfig.for_target(target, **overrides)
    model = BlockModel(cfg)
    g = torch.Generator().manual_seed(seed)
    model.init_random(g, float(getattr(target.model.config, "initializer_range", 0.02)))
    if cfg.reduced_vocab:  # a seeded random subset of the target's ids
        model.set_vocab_mapping(random_vocabulary(cfg.draft_vocab_size, cfg.vocab_size, g))
    return model.to(device=target.device, dtype=target.dtype).eval()


__all__ = ["Backbone", "BIDIRECTIONAL", "CAUSAL", "BIDIRECTIONAL_WITH_CORRECTION", "BlockConfig", "BlockModel", "ContextCache", "SwiGLUApproximation", "build_target_layer_ids",
           "random_block_model"]
