"""The SpecBlock draft model (shiweijiezero/SpecBlock, ``LlamaForCausalLMSpecBlockShift``).

Parameter names are the upstream ones (SpecForge ``_llama3_specblock_base.py`` + ``llama3_specblock.py``),
so a ``state_dict`` without the embedding is a released ``model.safetensors``::

    input_layer.condition_proj.weight   [H, 3 * Ht]  low/mid/high target features -> H
    input_layer.condition_norm.weight   [H]
    input_layer.embed_tokens.weight     [V, H]       the TARGET's embedding, copied at load, frozen, never saved
    input_layer.token_norm.weight       [H]
    input_layer.position_queries.weight [K, H]       the learned slot queries
    input_layer.query_norm.weight       [H]
    input_layer.fuse.weight             [H, 3H]      [condition ; token ; slot query] -> H
    layers.{l}.input_layernorm / post_attention_layernorm .weight  [H]
    layers.{l}.self_attn.{q,k,v,o}_proj.weight                      Llama attention (GQA), head_dim = H // heads
    layers.{l}.mlp.{gate,up,down}_proj.weight
    shift_proj.{l-1}.weight             [H, 2H]      before layer l > 0: h <- W [h ; shifted(h)]
    norm.weight                         [H]
    lm_head.weight                      [Vd, H]      reduced draft vocabulary
    rank_head.0.weight                  [256, H + 15]
    rank_head.2.weight                  [C, 256]     C = 4 rank classes
    d2t [Vd] int64, t2d [V] bool                     vocabulary maps (drafters.common.vocab)

A *block* is R rows times K slots. Row r has a condition (the target's three features, through
``condition_proj``; or, for a later block, a draft hidden state of the previous block, as is), a
token and its position; slot k of row r predicts the token k+1 places after the row's token, at RoPE
position ``p + k`` where p is the row token's position (upstream: row index i = p - 1, position
``i + 1 + k``). Every slot fuses ``[condition_norm(cond) ; token_norm(embed(token)) ;
query_norm(query_k)]`` by ``fuse``. Layer-wise shift: before every layer l > 0 the hidden state of
slot k is ``shift_proj[l-1]([h_k ; h_{k-1}])`` (slot 0 uses itself for h_{-1}).

Attention is the caller's: :meth:`SpecBlockModel.run` takes an ``attend(layer, q, k, v)`` function
(the drafter's KV cache and tree masks at inference, the unrolled block masks in training), so the
two share every other line. ``q`` is [B, nh, R*K, hd], ``k``/``v`` [B, nkv, R*K, hd] (RoPE applied),
rows major, slots minor.

Rank head: an MLP over ``[norm(h).detach() ; 15 features of the top-20 logits]`` (top-10 log-probs,
top1-top2 / top1-top3 / top1-top5 logit gaps, top-1 probability, top-20 entropy, all normalised over
the top 20 as upstream) giving 4 classes: the target's token is at rank 1 / 2-4 / 5-10 / >10 of the
draft distribution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from drafters.common.nn import GatedMLP, RMSNorm, apply_rope, init_normal_
from drafters.common.rope import Rotary
from drafters.common.shape import rope_from_config_dict, target_shape
from drafters.common.vocab import random_vocabulary, target_ids_of, vocab_maps

ARCHITECTURE = "LlamaForCausalLMSpecBlockShift"
RANK_FEATURES = 15  # top-10 log-probs, 3 gaps, top-1 prob, top-20 entropy
RANK_HIDDEN = 256
TOP_FEATURE = 20  # the rank features read the top 20 logits


def rank_class_of(rank0: Tensor) -> Tensor:
    """0-based rank of the target token (>= 10: not in the top 10) -> class 0 (rank 1) / 1 (2-4) / 2 (5-10) / 3."""
    return torch.where(rank0 == 0, 0, torch.where(rank0 <= 3, 1, torch.where(rank0 <= 9, 2, 3))).long()


def rank_labels(logits: Tensor, target: Tensor) -> Tensor:
    """[...] rank class of ``target`` (draft ids) in ``logits`` [..., Vd] (upstream ``_compute_rank_labels``)."""
    top = logits.topk(min(10, logits.shape[-1]), dim=-1).indices
    match = top == target[..., None]
    rank0 = torch.where(match.any(-1), match.float().argmax(-1), torch.full_like(target, 10))
    return rank_class_of(rank0)


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class SpecBlockConfig:
    """Shape of a SpecBlock drafter (a checkpoint's ``config.json``)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the TARGET's vocabulary (t2d, embedding)
    draft_vocab_size: int  # lm_head rows (d2t)
    num_hidden_layers: int = 2
    slots: int = 4  # K (upstream ``diffspec_draft_token_num``)
    rank_classes: int = 4
    num_ttt_blocks: int = 3  # blocks unrolled in training (upstream writes it for inference too)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    target_hidden_size: int | None = None  # condition_proj input is 3 * this; None = hidden_size
    hidden_act: str = "silu"
    feature_layers: tuple[int, ...] | None = None  # HF hidden_states indices; None = (2, N//2, N-3)
    target_num_layers: int | None = None  # recorded by specbench (a mismatch check)
    extra: dict = field(default_factory=dict, compare=False)  # other config.json keys, kept on save

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads (SpecBlock's head_dim is H // heads)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not TOP_FEATURE <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"need {TOP_FEATURE} <= draft_vocab_size <= vocab_size, got {self.draft_vocab_size} and {self.vocab_size}")
        if self.slots < 1 or self.num_hidden_layers < 1 or self.rank_classes != 4:
            raise ValueError("need slots >= 1, num_hidden_layers >= 1 and rank_classes == 4")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def feature_size(self) -> int:
        return self.target_hidden_size or self.hidden_size

    @classmethod
    def for_target(cls, target, draft_vocab_size: int = 0, slots: int = 4, **overrides: Any) -> "SpecBlockConfig":
        shape = target_shape(target)
        shape.pop("head_dim")
        values: dict[str, Any] = dict(shape, draft_vocab_size=draft_vocab_size or target.vocab_size, slots=slots,
                                      target_num_layers=target.num_layers)
        values.update(overrides)
        return cls(**values)

    def to_config_dict(self) -> dict:
        """The upstream config.json: a Llama config plus the SpecBlock fields."""
        out = dict(self.extra)
        out.update(
            architectures=[ARCHITECTURE], model_type="llama", hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            num_hidden_layers=self.num_hidden_layers, hidden_act=self.hidden_act, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings, vocab_size=self.vocab_size,
            draft_vocab_size=self.draft_vocab_size, tie_word_embeddings=False,
            diffspec_draft_token_num=self.slots, rank_classes=self.rank_classes, num_ttt_blocks=self.num_ttt_blocks,
            target_hidden_size=self.feature_size,
        )
        sb = dict(out.get("specbench") or {})
        if self.target_num_layers is not None:
            sb["target_num_hidden_layers"] = self.target_num_layers
        if self.feature_layers is not None:
            sb["feature_layers"] = list(self.feature_layers)
        if sb:
            out["specbench"] = sb
        return out

    @classmethod
    def from_config_dict(cls, d: dict) -> "SpecBlockConfig":
        """Read a checkpoint's config.json. Raises KeyError naming a missing required key."""
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "diffspec_draft_token_num"):
            if key not in d:
                raise KeyError(key)
        theta, scaling = rope_from_config_dict(d)
        sb = d.get("specbench") or {}
        known = {f.name for f in dataclasses.fields(cls)} | {
            "specbench", "rope_parameters", "architectures", "model_type", "tie_word_embeddings", "head_dim",
            "diffspec_draft_token_num", "torch_dtype"}
        return cls(
            hidden_size=int(d["hidden_size"]), intermediate_size=int(d["intermediate_size"]),
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            vocab_size=int(d["vocab_size"]), draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
            num_hidden_layers=int(d.get("num_hidden_layers") or 1), slots=int(d["diffspec_draft_token_num"]),
            rank_classes=int(d.get("rank_classes") or 4), num_ttt_blocks=int(d.get("num_ttt_blocks") or 3),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)), rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings") or 4096),
            target_hidden_size=d.get("target_hidden_size"), hidden_act=d.get("hidden_act", "silu"),
            feature_layers=tuple(sb["feature_layers"]) if sb.get("feature_layers") else None,
            target_num_layers=sb.get("target_num_hidden_layers"),
            extra={k: v for k, v in d.items() if k not in known},
        )


# --------------------------------------------------------------------------- layers


class SpecBlockInputLayer(nn.Module):
    """[condition ; token ; slot query] -> H for every slot (upstream ``SpecBlockInputLayer``)."""

    def __init__(self, cfg: SpecBlockConfig):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.condition_proj = nn.Linear(3 * cfg.feature_size, h, bias=False)
        self.condition_norm = RMSNorm(h, eps)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        self.token_norm = RMSNorm(h, eps)
        self.position_queries = nn.Embedding(cfg.slots, h)
        self.query_norm = RMSNorm(h, eps)
        self.fuse = nn.Linear(3 * h, h, bias=False)

    def forward(self, cond: Tensor, tokens: Tensor, draft_condition: bool) -> Tensor:
        """cond [..., 3Ht] (target features) or [..., H] (a draft hidden state); tokens [...] target ids
        -> [..., K, H]."""
        dtype = self.fuse.weight.dtype
        c = cond.to(dtype) if draft_condition else self.condition_proj(cond.to(dtype))
        c = self.condition_norm(c)
        t = self.token_norm(self.embed_tokens(tokens).to(dtype))
        q = self.query_norm(self.position_queries.weight)  # [K, H]
        k = q.shape[0]
        lead = c.shape[:-1]
        x = torch.cat([c[..., None, :].expand(*lead, k, -1), t[..., None, :].expand(*lead, k, -1),
                       q.expand(*lead, k, -1)], dim=-1)
        return self.fuse(x)


class SpecBlockAttention(nn.Module):
    def __init__(self, cfg: SpecBlockConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, n, H] -> q [B, nh, n, hd], k, v [B, nkv, n, hd] (RoPE on q, k)."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def out(self, o: Tensor) -> Tensor:
        """o [B, nh, n, hd] -> [B, n, H]."""
        b, _, n, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim))


class SpecBlockDecoderLayer(nn.Module):
    def __init__(self, cfg: SpecBlockConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SpecBlockAttention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)


# (layer index, q [B, nh, n, hd], k, v [B, nkv, n, hd]) -> attention output [B, nh, n, hd]
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Scaled dot-product attention with GQA and a bool mask (True = attend) broadcastable to [B, nh, n, keys]."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def rank_features(logits: Tensor) -> Tensor:
    """[..., Vd] draft logits -> [..., 15] rank-head features (upstream's top-20 fast path), float32, no grad."""
    with torch.no_grad():
        top20 = logits.detach().float().topk(TOP_FEATURE, dim=-1).values
        lse = torch.logsumexp(top20, dim=-1, keepdim=True)
        lp20 = top20 - lse
        lp10 = lp20[..., :10]
        gaps = top20[..., :1] - top20[..., [1, 2, 4]]
        p20 = lp20.exp()
        entropy = -(p20 * lp20).nan_to_num(0.0).sum(-1, keepdim=True)
        return torch.cat([lp10, gaps, lp10[..., :1].exp(), entropy], dim=-1)


@dataclass(frozen=True)
class BlockOutput:
    logits: Tensor  # [B, R, K, Vd]
    rank_logits: Tensor  # [B, R, K, C]
    hidden: Tensor  # [B, R, K, H] pre-norm (the next block's condition)
    rank_input: Tensor  # [B, R, K, H + 15] what the rank head read (detached)


class SpecBlockModel(nn.Module):
    """input_layer + layers with shift injection + norm + lm_head + rank_head, with d2t / t2d."""

    def __init__(self, config: SpecBlockConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.input_layer = SpecBlockInputLayer(config)
        self.layers = nn.ModuleList(SpecBlockDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.shift_proj = nn.ModuleList(nn.Linear(2 * h, h, bias=False) for _ in range(config.num_hidden_layers - 1))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.rank_head = nn.Sequential(nn.Linear(h + RANK_FEATURES, RANK_HIDDEN, bias=False), nn.SiLU(),
                                       nn.Linear(RANK_HIDDEN, config.rank_classes, bias=False))
        # the identity map onto the first Vd ids until set_vocab_mapping / a checkpoint fills them
        d2t, t2d = vocab_maps(torch.arange(config.draft_vocab_size), config.vocab_size)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings)

    # ------------------------------------------------------------ vocabulary
    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]

    @torch.no_grad()
    def set_vocab_mapping(self, target_ids: Tensor) -> None:
        d2t, t2d = vocab_maps(torch.as_tensor(target_ids).cpu(), self.config.vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    @property
    def draft_ids_of_target(self) -> Tensor:
        """[Vd] target id of every draft id."""
        return target_ids_of(self.d2t)

    # ------------------------------------------------------------ one block
    def run(self, cond: Tensor, tokens: Tensor, positions: Tensor, attend: Attend, draft_condition: bool) -> BlockOutput:
        """One block: cond [B, R, 3Ht or H], tokens [B, R] (target ids), positions [R] (the row tokens'
        positions p; slot k sits at p + k) -> :class:`BlockOutput`."""
        b, r = tokens.shape
        k = self.config.slots
        h = self.config.hidden_size
        x = self.input_layer(cond, tokens, draft_condition).reshape(b, r * k, h)
        slot_pos = (positions[:, None] + torch.arange(k, device=positions.device)).reshape(-1)
        cos, sin = self.rotary(slot_pos, x.dtype)
        for i, layer in enumerate(self.layers):
            if i > 0:
                g = x.view(b, r, k, h)
                shifted = torch.cat([g[:, :, :1], g[:, :, :-1]], dim=2).view(b, r * k, h)
                x = self.shift_proj[i - 1](torch.cat([x, shifted], dim=-1))
            attn = layer.self_attn
            q, kk, v = attn.qkv(layer.input_layernorm(x), cos, sin)
            x = x + attn.out(attend(i, q, kk, v))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden = x.view(b, r, k, h)
        logits, rank_logits, rank_input = self.heads(hidden)
        return BlockOutput(logits, rank_logits, hidden, rank_input)

    def heads(self, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Pre-norm hidden [..., H] -> (draft logits, rank logits, rank-head input)."""
        normed = self.norm(hidden)
        logits = self.lm_head(normed)
        rank_input = torch.cat([normed.detach(), rank_features(logits).to(normed.dtype)], dim=-1)
        return logits, self.rank_head(rank_input), rank_input

    # ------------------------------------------------------------ set-up
    @torch.no_grad()
    def copy_embedding(self, target) -> None:
        weight = target.model.get_input_embeddings().weight
        if tuple(weight.shape) != tuple(self.input_layer.embed_tokens.weight.shape):
            raise ValueError(f"target embedding {tuple(weight.shape)} does not fit {tuple(self.input_layer.embed_tokens.weight.shape)}")
        self.input_layer.embed_tokens.weight.copy_(weight.detach().to(self.input_layer.embed_tokens.weight.dtype))

    def released_state(self) -> dict[str, Tensor]:
        """The state dict of a released checkpoint: everything but the embedding (upstream drops every
        key containing 'embed')."""
        return {k: v for k, v in self.state_dict().items() if "embed" not in k.lower()}

    def init_random(self, generator: torch.Generator, std: float = 0.02) -> None:
        init_normal_(self, generator, std, zero=lambda name: "embed_tokens" in name)


def random_model(target, slots: int = 4, draft_vocab_size: int = 0, seed: int = 0, std: float | None = None,
                 feature_layers: tuple[int, ...] | None = None) -> SpecBlockModel:
    """A seeded random-init model for ``target`` (tests, and the start of training), on its device and dtype."""
    from drafters.eagle3.model import default_feature_layers

    cfg = SpecBlockConfig.for_target(target, draft_vocab_size=draft_vocab_size, slots=slots,
                                     feature_layers=feature_layers or default_feature_layers(target.num_layers))
    g = torch.Generator().manual_seed(seed)
    model = SpecBlockModel(cfg)
    model.init_random(g, std if std is not None else float(getattr(target.model.config, "initializer_range", 0.02)))
    if cfg.draft_vocab_size < cfg.vocab_size:
        model.set_vocab_mapping(random_vocabulary(cfg.draft_vocab_size, cfg.vocab_size, g))
    model.copy_embedding(target)
    return model.to(device=target.device, dtype=target.dtype).eval()


__all__ = ["SpecBlockConfig", "SpecBlockModel", "BlockOutput", "random_model", "rank_features", "rank_labels",
           "rank_class_of", "sdpa", "ARCHITECTURE"]
