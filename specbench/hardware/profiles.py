"""Measured hardware profiles (``specbench profile`` writes them) and the lookup of any profile by name.

A measured profile is one JSON file in the profile folder (``$SPECBENCH_HARDWARE_DIR``, default
``hardware/`` in the cache, ``$SPECBENCH_CACHE`` or ``~/.cache/specbench``)::

    {"name": ..., "kind": "measured", "schema": 1, "created": ISO time,
     "target": "tiny-llama", "target_config": {HF config dict}, "mode": "eager",
     "contexts": [c0, c1, ...], "ns": [1, 2, 4, ...],
     "t_fwd_ms": [[ms at n for n in ns] for c in contexts],   # median of the repeats
     "drafters": {"ngram": {"ms_per_forward": x, "forwards": k, "config": {...}}, ...},
     "fingerprint": {... specbench.results.env_fingerprint ...}}

``t_fwd`` interpolates linearly in n and in context (clamped to the measured context range; n
beyond the largest measured is extrapolated along the last segment, never downwards). Its step costs ``t_fix`` and
``t_round`` are 0: a measured profile times the forwards only, the harness's own per-step time is
in the run's ``other_s``.
"""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.errors import UserError
from specbench.hardware.analytic import ANALYTIC_PROFILES, AnalyticProfile, Shape, shape_from_config

ENV_DIR = "SPECBENCH_HARDWARE_DIR"
SCHEMA = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,80}$")


def profile_dir() -> Path:
    """``$SPECBENCH_HARDWARE_DIR`` if set, else ``hardware/`` in the cache every other artefact uses."""
    from specbench.fetch import cache_root

    return Path(os.environ[ENV_DIR]).expanduser() if os.environ.get(ENV_DIR) else cache_root() / "hardware"


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise UserError(f"profile name '{name}' is not valid; use letters, digits, '.', '_', '-', ':' or '+' (e.g. my-h200)")
    if name in ANALYTIC_PROFILES:
        raise UserError(f"'{name}' is an analytic profile; give the measured profile another --name")
    return name


def _file(name: str) -> Path:
    return profile_dir() / f"{name.replace(':', '__')}.json"


def _interp(xs: list[float], ys: list[float], x: float, extrapolate: bool) -> float:
    if len(xs) == 1:
        return ys[0]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        if not extrapolate:
            return ys[-1]
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)  # noisy timings must not extrapolate downwards
        return ys[-1] + slope * (x - xs[-1])
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class MeasuredProfile:
    name: str
    target: str
    target_config: dict[str, Any]
    contexts: list[int]
    ns: list[int]
    t_fwd_ms: list[list[float]]  # [context][n]
    drafters: dict[str, dict[str, Any]] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    mode: str = "eager"
    created: str = ""
    kind = "measured"
    t_fix = 0.0
    t_round = 0.0

    @property
    def description(self) -> str:
        fp = self.fingerprint
        where = fp.get("device_name") or fp.get("device") or "?"
        return f"measured {self.created[:10]} on {where} ({fp.get('dtype', '?')}, {self.mode}) for {self.target}"

    @property
    def shape(self) -> Shape:
        return shape_from_config(self.target_config, self.target)

    def t_fwd(self, shape: Shape | None, n: int, context: int) -> float:
        """Seconds of the profiled target's forward over ``n`` tokens at ``context`` (``shape`` must be
        the profiled target's or None: a measured curve belongs to one model)."""
        if shape is not None and not _same_shape(shape, self.shape):
            raise UserError(
                f"measured profile '{self.name}' timed {self.target}; it cannot price another model's forward "
                "(use an analytic profile for --as-target, or profile that model)"
            )
        per_ctx = [_interp(self.ns, row, n, extrapolate=True) for row in self.t_fwd_ms]
        return max(_interp(self.contexts, per_ctx, context, extrapolate=False), 0.0) * 1e-3

    def drafter_forward_ms(self, drafter: str) -> float | None:
        entry = self.drafters.get(drafter)
        return None if entry is None else float(entry["ms_per_forward"])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": "measured", "schema": SCHEMA, "created": self.created, "target": self.target,
            "target_config": self.target_config, "mode": self.mode, "contexts": self.contexts, "ns": self.ns,
            "t_fwd_ms": self.t_fwd_ms, "drafters": self.drafters, "fingerprint": self.fingerprint,
        }


def _same_shape(a: Shape, b: Shape) -> bool:
    return (a.layers, a.hidden, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.vocab) == (
        b.layers, b.hidden, b.heads, b.kv_heads, b.head_dim, b.intermediate, b.vocab)


def save_measured(profile: MeasuredProfile) -> Path:
    path = _file(check_name(profile.name))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(profile.to_json(), indent=1))
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"cannot write the profile to {path} ({exc.strerror or exc}); set {ENV_DIR} to a writable folder") from None
    return path


def _from_json(data: dict[str, Any], path: Path) -> MeasuredProfile:
    try:
        return MeasuredProfile(
            name=str(data["name"]), target=str(data["target"]), target_config=dict(data["target_config"]),
            contexts=[int(c) for c in data["contexts"]], ns=[int(n) for n in data["ns"]],
            t_fwd_ms=[[float(v) for v in row] for row in data["t_fwd_ms"]], drafters=dict(data.get("drafters", {})),
            fingerprint=dict(data.get("fingerprint", {})), mode=str(data.get("mode", "eager")),
            created=str(data.get("created", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path} is not a specbench hardware profile ({exc}); delete it or run `specbench profile` again") from None


def list_measured() -> list[MeasuredProfile]:
    folder = profile_dir()
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("kind") == "measured":
            out.append(_from_json(data, path))
    return out


def load_measured(name: str) -> MeasuredProfile | None:
    path = _file(name)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); delete it or run `specbench profile` again") from None
    return _from_json(data, path)


def get_profile(name: str) -> AnalyticProfile | MeasuredProfile:
    """An analytic profile (``h100-sxm:engine``, ...) or a measured one by name; else a one-line error."""
    if name in ANALYTIC_PROFILES:
        return ANALYTIC_PROFILES[name]
    if _NAME.match(name or ""):
        found = load_measured(name)
        if found is not None:
            return found
    measured = [p.name for p in list_measured()]
    known = ", ".join(list(ANALYTIC_PROFILES) + measured)
    raise UserError(f"unknown hardware profile '{name}'; choose one of: {known} (see `specbench hardware`)")
