"""Analytic cost profiles: a roofline with host overhead, computed from any HF config.

One formula, two regimes (``../docs`` HARDWARE.md; the README's "Hardware projections" section)::

    T_fwd(n) = max(H, s*H + max(W / (eta_m * BW), n * F / (eta_c * PEAK)))

* ``H = layers * c_layer``: host / launch cost of one forward; ``s``: the share of it that does not
  overlap GPU work (0 with CUDA graphs, where the host launches one graph).
* ``W``: bytes read per forward = 2 bytes * every linear weight (lm_head included, tied or not)
  + the KV cache at the context (2 bytes * K and V * layers * kv_heads * head_dim * context).
* ``F``: FLOPs per query token = 2 * linear params + 4 * layers * (heads * head_dim) * context.
  (HARDWARE.md writes ``hidden`` for ``heads * head_dim``; the two differ only where a config sets
  ``head_dim`` apart from ``hidden / heads``, as Qwen3-4B does.)

A step of a speculative run costs ``t_fix + t_round + T_draft + T_fwd(n)`` and the autoregressive
baseline ``t_fix + T_fwd(1)`` per token (see :mod:`specbench.hardware.project`).

Everything is in seconds; the CLI prints milliseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from specbench.errors import UserError

BYTES_PER_WEIGHT = 2  # bf16 / fp16 weights and KV cache

# ------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """What the cost model needs of a model: its linear layers and its KV cache."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int  # rows of the output head (a drafter's draft vocabulary where it has one)
    tied: bool
    qkv_in: int  # input width of q/k/v (2 * hidden for an EAGLE-3 layer)
    extra_params: int = 0  # linear weights outside the decoder layers and lm_head (a drafter's fc)

    @property
    def layer_params(self) -> int:
        q = self.qkv_in * self.heads * self.head_dim
        kv = 2 * self.qkv_in * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down (SwiGLU)
        return q + kv + o + mlp

    @property
    def lm_head_params(self) -> int:
        return self.hidden * self.vocab  # read every forward, whether or not tied to the embedding

    @property
    def linear_params(self) -> int:
        return self.layers * self.layer_params + self.lm_head_params + self.extra_params

    def kv_bytes(self, context: int) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_WEIGHT * max(context, 0)

    def weight_bytes(self, context: int) -> float:
        """W: bytes read by one forward at ``context`` cached positions."""
        return BYTES_PER_WEIGHT * self.linear_params + self.kv_bytes(context)

    def flops_per_token(self, context: int) -> float:
        """F: FLOPs per query token at ``context`` cached positions."""
        return 2.0 * self.linear_params + 4.0 * self.layers * self.heads * self.head_dim * max(context, 0)


_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def shape_from_config(config: dict[str, Any], name: str = "model") -> Shape:
    """A :class:`Shape` from an HF ``config.json`` dict (text config of a multimodal one included).

    Drafter configs: ``draft_vocab_size`` sets the output head's rows; an EAGLE-3 architecture
    (``*Eagle3*``) reads 2*hidden into q/k/v and fuses 3 target layers (fc 3*hidden -> hidden); a
    ``dflash_config.target_layer_ids`` list fuses that many layers; ``specbench.fc_in_multiple``
    names the fc's input width in hiddens for any other head (EAGLE-1: 2).
    """
    if not isinstance(config, dict):
        raise UserError(f"config of '{name}' is not a JSON object; pass an HF config.json")
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    missing = [k for k in _REQUIRED if not isinstance(cfg.get(k), int)]
    if missing:
        raise UserError(
            f"config of '{name}' lacks {', '.join(missing)}; pass the config.json of a decoder-only HF model"
        )
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    archs = " ".join(cfg.get("architectures") or [])
    extra = cfg.get("specbench") if isinstance(cfg.get("specbench"), dict) else {}
    qkv_in = hidden
    fc_in = int(extra.get("fc_in_multiple", 0))
    if "Eagle3" in archs:
        qkv_in = 2 * hidden
        fc_in = fc_in or 3
    dflash = cfg.get("dflash_config")
    if isinstance(dflash, dict) and dflash.get("target_layer_ids"):
        fc_in = fc_in or len(dflash["target_layer_ids"])
    vocab = int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
    return Shape(
        name=name, layers=int(cfg["num_hidden_layers"]), hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, intermediate=int(cfg["intermediate_size"]), vocab=vocab,
        tied=bool(cfg.get("tie_word_embeddings", False)), qkv_in=qkv_in, extra_params=fc_in * hidden * hidden,
    )


def bundled_configs() -> list[str]:
    """Names of the configs shipped in specbench/hardware/configs (without .json)."""
    folder = resources.files("specbench.hardware") / "configs"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_config(spec: str | Path) -> tuple[str, dict[str, Any]]:
    """``(name, config dict)`` from a bundled config name, a config.json path or a model directory."""
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.exists():
            raise UserError(f"'{spec}' has no config.json; pass an HF config.json or a bundled shape ({', '.join(bundled_configs())})")
    if path.is_file():
        try:
            return path.parent.name if path.name == "config.json" else path.stem, json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read '{path}' as JSON ({exc}); pass an HF config.json") from None
    name = text[:-5] if text.endswith(".json") else text
    if name in bundled_configs():
        source = resources.files("specbench.hardware") / "configs" / f"{name}.json"
        return name, json.loads(source.read_text())
    raise UserError(
        f"no config '{spec}': not a file, a model directory, or a bundled shape ({', '.join(bundled_configs())})"
    )


def load_shape(spec: str | Path) -> Shape:
    name, cfg = load_config(spec)
    return shape_from_config(cfg, name)


# ------------------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Device:
    name: str
    bw: float  # bytes / s (HBM)
    peak: float  # dense bf16 FLOP / s
    eta_m: float  # achieved share of bw
    eta_c: float  # achieved share of peak


@dataclass(frozen=True)
class Regime:
    """How the forward is launched: per-layer host cost and the per-step costs around it (seconds)."""

    name: str
    c_layer: float  # host / launch time per decoder layer
    s: float  # share of the host time that does not overlap GPU work
    t_fix: float  # per step, speculative or not (sampling, scheduling)
    t_round: float  # per speculative step: building the tree and accepting
    t_d: float  # per drafter forward, on top of its own T_fwd
    description: str = ""


MS = 1e-3

DEVICES = {
    "h100-sxm": Device("h100-sxm", 3.35e12, 989e12, 0.80, 0.65),
    "h200": Device("h200", 4.8e12, 989e12, 0.80, 0.65),
    "a100": Device("a100", 2.0e12, 312e12, 0.80, 0.74),
}

REGIMES = {
    "engine": Regime("engine", 0.012 * MS, 0.0, 1.0 * MS, 1.1 * MS, 0.7 * MS,
                     "CUDA-graph serving engine (vLLM / SGLang class)"),
    # t_round and t_d refitted from HARDWARE.md's first estimate (0, 0) to (0.6, 1.7) ms: with 0 no
    # parameter set meets the DFlash (ddtree), JetSpec-paper and Spec-Bench EAGLE speedup/tau points,
    # which all say an eager step pays Python work per round and per drafter forward. A grid fit
    # (0.1 ms steps) minimising the squared tolerance-normalised errors of the consistent points;
    # see reports/hardware.md ("Hardware notes") and tests/test_hardware.py.
    "hf-eager": Regime("hf-eager", 0.93 * MS, 0.63, 0.0, 0.6 * MS, 1.7 * MS, "plain transformers, eager PyTorch"),
}


@dataclass(frozen=True)
class AnalyticProfile:
    device: Device
    regime: Regime
    kind = "analytic"

    @property
    def name(self) -> str:
        return f"{self.device.name}:{self.regime.name}"

    @property
    def description(self) -> str:
        d = self.device
        return (f"{self.regime.description}; {d.bw / 1e12:.2f} TB/s, {d.peak / 1e12:.0f} TFLOP/s bf16, "
                f"eta_m {d.eta_m}, eta_c {d.eta_c}")

    def t_fwd(self, shape: Shape, n: int, context: int) -> float:
        """Seconds of one forward of ``shape`` over ``n`` query tokens with ``context`` cached positions."""
        if n < 1:
            raise ValueError(f"a forward has at least one query token, got n={n}")
        d, r = self.device, self.regime
        host = shape.layers * r.c_layer
        memory = shape.weight_bytes(context) / (d.eta_m * d.bw)
        compute = n * shape.flops_per_token(context) / (d.eta_c * d.peak)
        return max(host, r.s * host + max(memory, compute))

    def drafter_forward(self, shape: Shape | None, n: int, context: int) -> float:
        """Seconds of one drafter forward: its own T_fwd (0 for a drafter with no weights) + t_d."""
        own = 0.0 if shape is None else self.t_fwd(shape, n, context)
        return own + self.regime.t_d

    @property
    def t_fix(self) -> float:
        return self.regime.t_fix

    @property
    def t_round(self) -> float:
        return self.regime.t_round


ANALYTIC_PROFILES: dict[str, AnalyticProfile] = {
    f"{dev}:{reg}": AnalyticProfile(DEVICES[dev], REGIMES[reg]) for dev in DEVICES for reg in REGIMES
}


def analytic_profile(name: str) -> AnalyticProfile | None:
    return ANALYTIC_PROFILES.get(name)


def with_params(profile: AnalyticProfile, **changes: float) -> AnalyticProfile:
    """A copy with some regime parameters changed (seconds), for what-if and fitting."""
    return replace(profile, regime=replace(profile.regime, **changes))
