"""The EAGLE-3 draft head: one Llama decoder layer over (token embedding, fused target features).

Parameter names are exactly the upstream ones (SafeAILab/EAGLE ``cnets.py``, SpecForge), so a
``state_dict`` is a released checkpoint's key set::

    fc.weight                                   [H, 3 * Ht]   low/mid/high target features -> H (no bias)
    midlayer.hidden_norm.weight                 [H]           RMSNorm of the feature stream
    midlayer.input_layernorm.weight             [H]           RMSNorm of the token embedding
    midlayer.self_attn.{q,k,v}_proj.weight      [*, 2H]       attention input = cat(norm(emb), norm(feature))
    midlayer.self_attn.o_proj.weight            [H, nh * hd]
    midlayer.post_attention_layernorm.weight    [H]
    midlayer.mlp.{gate,up}_proj.weight          [I, H]
    midlayer.mlp.down_proj.weight               [H, I]
    norm.weight                                 [H]           final norm before lm_head
    lm_head.weight                              [Vd, H]       over the reduced draft vocabulary
    d2t                                         [Vd] int64    target_id = draft_id + d2t[draft_id]
    t2d                                         [V] bool      which target ids the draft vocab holds

The token embedding is the TARGET's (never copied or saved): callers pass embeddings in.

Run state is never stored on the module. The attention's K/V live in a :class:`KVCache` that the
caller owns (the drafter keeps one per generation) and passes to :meth:`Eagle3Head.forward`.

One layer step (``norm_before_residual=False``, the upstream EAGLE-3 / SpecForge layout)::

    x   = cat(input_layernorm(emb), hidden_norm(h))            # [n, 2H]
    h   = h + o_proj(attn(q_proj(x), k_proj(x), v_proj(x)))    # RoPE on q, k; GQA
    out = h + mlp(post_attention_layernorm(h))                  # the head's hidden state (pre-norm)

``h`` is ``fc(target features)`` for committed tokens, or a previous ``out`` when self-feeding.
Some vLLM "speculators" checkpoints set ``norm_before_residual: true`` (the residual is
``hidden_norm(h)``); that flag is read from config.json and honoured.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from drafters.common.kv_cache import KVCache
from drafters.common.nn import GatedMLP, RMSNorm, apply_rope, init_normal_
from drafters.common.rope import Rotary
from drafters.common.shape import TargetShaped, rope_from_config_dict, target_shape
from drafters.common.vocab import random_vocabulary, vocab_maps

ARCHITECTURE = "LlamaForCausalLMEagle3"


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Eagle3HeadConfig(TargetShaped):
    """Shape of an EAGLE-3 head (the Llama-style ``config.json`` of a checkpoint)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the TARGET's vocabulary (t2d has this length)
    draft_vocab_size: int  # lm_head rows (d2t has this length)
    head_dim: int | None = None  # None = hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF rope_scaling dict (e.g. llama3), None = plain RoPE
    max_position_embeddings: int = 4096
    target_hidden_size: int | None = None  # fc input is 3 * this; None = hidden_size
    hidden_act: str = "silu"
    norm_before_residual: bool = False
    # HF hidden_states indices (0 = embeddings, i = hidden state ENTERING layer i) of the three taps;
    # None = the EAGLE-3 default (2, N//2, N-3) for an N-layer target.
    feature_layers: tuple[int, ...] | None = None
    target_num_layers: int | None = None  # recorded by specbench when known (a mismatch check)
    extra: dict = field(default_factory=dict, compare=False)  # other config.json keys, kept on save

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads and self.head_dim is None:
            raise ValueError("hidden_size is not a multiple of num_attention_heads; set head_dim")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"need 0 < draft_vocab_size <= vocab_size, got {self.draft_vocab_size} and {self.vocab_size}")

    @classmethod
    def for_target(cls, target, draft_vocab_size: int = 0, **overrides: Any) -> "Eagle3HeadConfig":
        """A head shaped like one layer of ``target`` (a :class:`~specbench.targets.Target`)."""
        values: dict[str, Any] = dict(
            target_shape(target), draft_vocab_size=draft_vocab_size or target.vocab_size,
            target_num_layers=target.num_layers,
        )
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------ config.json
    def to_config_dict(self) -> dict:
        """The Llama-style config.json of a checkpoint (what SpecForge / SGLang / vLLM read)."""
        out = dict(self.extra)
        out.update(
            architectures=[ARCHITECTURE],
            model_type="llama",
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.dim_per_head,
            num_hidden_layers=1,
            hidden_act=self.hidden_act,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=self.vocab_size,
            draft_vocab_size=self.draft_vocab_size,
            tie_word_embeddings=False,
        )
        if self.target_hidden_size is not None and self.target_hidden_size != self.hidden_size:
            out["target_hidden_size"] = self.target_hidden_size
        if self.norm_before_residual:
            out["norm_before_residual"] = True
        if self.feature_layers is not None:
            # SGLang's eagle_config names layer OUTPUTS (it captures the input of layer id + 1),
            # so HF hidden_states index i (entering layer i) is written as i - 1.
            out["eagle_config"] = {
                "use_aux_hidden_state": True,
                "eagle_aux_hidden_state_layer_ids": [i - 1 for i in self.feature_layers],
            }
        if self.target_num_layers is not None:
            out.setdefault("specbench", {})
            out["specbench"] = dict(out["specbench"], target_num_hidden_layers=self.target_num_layers)
        return out

    @classmethod
    def from_config_dict(cls, d: dict) -> "Eagle3HeadConfig":
        """Read a checkpoint's config.json. Raises KeyError naming a missing required key."""
        required = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        for key in required:
            if key not in d:
                raise KeyError(key)
        theta, rope_scaling = rope_from_config_dict(d)
        feature_layers = None
        eagle_cfg = d.get("eagle_config") or {}
        if eagle_cfg.get("eagle_aux_hidden_state_layer_ids"):
            # SGLang convention: ids name layer outputs -> HF hidden_states index id + 1
            feature_layers = tuple(int(i) + 1 for i in eagle_cfg["eagle_aux_hidden_state_layer_ids"])
        elif d.get("eagle_aux_hidden_state_layer_ids"):
            # vLLM convention (top-level key): the index of the hidden state entering that layer
            feature_layers = tuple(int(i) for i in d["eagle_aux_hidden_state_layer_ids"])
        sb = d.get("specbench") or {}
        known = {f.name for f in dataclasses.fields(cls)} | {"eagle_config", "specbench", "rope_parameters",
                                                             "architectures", "model_type", "num_hidden_layers",
                                                             "tie_word_embeddings", "eagle_aux_hidden_state_layer_ids"}
        return cls(
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            vocab_size=int(d["vocab_size"]),
            draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
            head_dim=d.get("head_dim"),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings") or 4096),
            target_hidden_size=d.get("target_hidden_size"),
            hidden_act=d.get("hidden_act", "silu"),
            norm_before_residual=bool(d.get("norm_before_residual", False)),
            feature_layers=feature_layers,
            target_num_layers=sb.get("target_num_hidden_layers"),
            extra={k: v for k, v in d.items() if k not in known},
        )


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's taps: the hidden states ENTERING layers 2, N//2 and N-3 (HF hidden_states indices).

    This is SGLang's and vLLM's default (``layers_to_capture = [2, N // 2, N - 3]``, captured before
    the layer runs). For very shallow targets (N < 6) the formula gives unordered or repeated taps;
    we keep it as is, it only matters for the tiny test targets.
    """
    return (2, num_layers // 2, num_layers - 3)


# --------------------------------------------------------------------------- KV cache


def new_cache(head: "Eagle3Head", capacity: int = 256) -> KVCache:
    """An empty K/V cache for ``head``'s one attention layer (the drafter owns it)."""
    w = head.midlayer.self_attn.k_proj.weight
    return KVCache(head.config.num_key_value_heads, head.config.dim_per_head, w.dtype, w.device, capacity)


# --------------------------------------------------------------------------- layers


class Eagle3Attention(nn.Module):
    """Multi-head attention with GQA whose q/k/v read the 2H-wide concatenated input."""

    def __init__(self, cfg: Eagle3HeadConfig):
        super().__init__()
        hd = cfg.dim_per_head
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(2 * cfg.hidden_size, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, self.n_kv * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, mask: Tensor | None) -> Tensor:
        """x [n, 2H]; cos, sin [n, head_dim]; mask [n, keys] bool (True = attend) or None = causal."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.n_heads, self.head_dim).transpose(0, 1)  # [nh, n, hd]
        k = self.k_proj(x).view(n, self.n_kv, self.head_dim).transpose(0, 1)  # [nkv, n, hd]
        v = self.v_proj(x).view(n, self.n_kv, self.head_dim).transpose(0, 1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)  # [nkv, past + n, hd]
        if mask is None:
            mask = causal_mask(n, past, x.device)
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(out[0].transpose(0, 1).reshape(n, self.n_heads * self.head_dim))


def causal_mask(n: int, past: int, device: torch.device | str) -> Tensor:
    """[n, past + n] bool: row i sees every cached slot and the new rows up to itself."""
    return torch.ones(n, past + n, dtype=torch.bool, device=device).tril(diagonal=past)


class Eagle3Layer(nn.Module):
    """The one decoder layer (upstream name ``midlayer``)."""

    def __init__(self, cfg: Eagle3HeadConfig):
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, embeds: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, mask: Tensor | None) -> Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [n, 2H]: embedding first
        h = residual + self.self_attn(x, cos, sin, cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


# --------------------------------------------------------------------------- the head


class Eagle3Head(nn.Module):
    """fc + midlayer + norm + lm_head, with the draft/target vocabulary maps as buffers."""

    def __init__(self, config: Eagle3HeadConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(3 * config.feature_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        # identity map until set_vocab_mapping / a checkpoint fills them
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[: config.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        # transformers' own RoPE for the target's rope_scaling; a constant buffer, not saved
        self.rotary = Rotary(config.dim_per_head, config.rope_theta, config.rope_scaling, config.max_position_embeddings)

    # ------------------------------------------------------------ pieces
    def fuse(self, features: Tensor) -> Tensor:
        """[n, 3 * Ht] concatenated low/mid/high target hidden states -> [n, H]."""
        return self.fc(features)

    def rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin [n, head_dim] for RoPE positions [n] (HF Llama convention, halves rotated)."""
        return self.rotary(positions, dtype)

    def forward(self, embeds: Tensor, hidden: Tensor, positions: Tensor, cache: KVCache | None = None,
                mask: Tensor | None = None) -> Tensor:
        """One layer step over n rows; returns the head's hidden states [n, H] (before ``norm``).

        embeds [n, H]: the target's embedding of each row's token; hidden [n, H]: ``fuse(features)``
        or a previous output; positions [n] RoPE positions; cache: the caller's K/V (the rows'
        K/V are appended to it); mask [n, cache.length + n] bool (True = attend), None = causal.
        """
        cos, sin = self.rope(positions, hidden.dtype)
        return self.midlayer(embeds.to(hidden.dtype), hidden, cos, sin, cache, mask)

    def draft_logits(self, hidden: Tensor) -> Tensor:
        """[..., H] head hidden states -> [..., Vd] logits over the draft vocabulary."""
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocab ids -> target-vocab ids (target_id = draft_id + d2t[draft_id])."""
        return draft_ids + self.d2t[draft_ids]

    # ------------------------------------------------------------ set-up
    @torch.no_grad()
    def set_vocab_mapping(self, target_ids: Tensor) -> None:
        """Make the draft vocabulary ``target_ids`` ([Vd] distinct target ids, any order is kept)."""
        target_ids = torch.as_tensor(target_ids, dtype=torch.long).cpu()
        if target_ids.shape != self.d2t.shape:
            raise ValueError(f"need {self.d2t.numel()} distinct target ids")
        d2t, t2d = vocab_maps(target_ids, self.config.vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def init_random(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded normal(0, std) init of every matrix (norm weights stay ones)."""
        init_normal_(self, generator, std)


def random_head(target, draft_vocab_size: int = 0, seed: int = 0, std: float | None = None) -> Eagle3Head:
    """A seeded random-init head shaped for ``target`` (for tests and as a training start).

    With ``draft_vocab_size`` below the target's, the draft vocabulary is a seeded random subset of
    the target's ids (sorted). ``std`` defaults to the target's ``initializer_range``.
    """
    cfg = Eagle3HeadConfig.for_target(target, draft_vocab_size=draft_vocab_size,
                                      feature_layers=default_feature_layers(target.num_layers))
    g = torch.Generator().manual_seed(seed)
    head = Eagle3Head(cfg)
    head.init_random(g, std if std is not None else float(getattr(target.model.config, "initializer_range", 0.02)))
    if cfg.draft_vocab_size < cfg.vocab_size:
        head.set_vocab_mapping(random_vocabulary(cfg.draft_vocab_size, cfg.vocab_size, g))
    return head.to(device=target.device, dtype=target.dtype).eval()


__all__ = ["Eagle3HeadConfig", "Eagle3Head", "KVCache", "new_cache", "causal_mask", "default_feature_layers", "random_head",
           "ARCHITECTURE"]
