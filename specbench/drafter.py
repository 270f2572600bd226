"""The drafter contract, the sampling settings, and the entry-point registry.

A drafter is any object with ``feature_layers``, ``reset(sampling)`` and ``propose(ctx)``. The
harness finds drafter classes through the ``specbench.drafters`` entry-point group, so a third-party
package adds one without touching specbench; the harness never branches on a drafter's name.

A drafter class provides:

* ``Config``: a dataclass of its options (every field with a default). ``--set key=value`` on the
  command line is parsed and validated against it by :func:`parse_config`.
* ``description``: one line for ``specbench drafters``.
* ``__init__(self, target, config)``: build against a loaded :class:`~specbench.targets.Target`.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

import torch
from torch import Tensor

from specbench.errors import UserError
from specbench.tree import DraftTree

__all__ = ["UserError", "Sampling", "DraftContext", "Drafter", "parse_config", "drafter_class"]

ENTRY_POINT_GROUP = "specbench.drafters"


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k filter
    generator: torch.Generator | None = None  # the one random stream of a generation

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class DraftContext:
    """Everything the drafter learns since its previous call.

    On the first call of a generation ``tokens`` is the whole prompt; afterwards it is the accepted
    drafts of the previous tree followed by the bonus token. ``tokens[-1]`` is always the new root.
    """

    tokens: Tensor  # [m] int64 newly committed tokens; tokens[-1] is the new root
    # [m, F] target features paired with tokens: features[i] is the target hidden state at the
    # position before tokens[i] (zeros for the first token of the sequence). None when the drafter
    # asked for no feature layers.
    features: Tensor | None
    pos: int  # position of the root == number of tokens in the target's KV cache
    accepted_nodes: Tensor | None  # [a+1] node ids of the previous tree on the accepted path (None on the first call)


class Drafter(Protocol):
    # hidden_states indices (HF convention: 0 = embeddings, i + 1 = output of layer i) to tap
    feature_layers: tuple[int, ...]

    def reset(self, sampling: Sampling) -> None:
        """Forget everything about the previous generation."""

    def propose(self, ctx: DraftContext) -> DraftTree:
        """Return a tree rooted at ``ctx.tokens[-1]``."""


# --------------------------------------------------------------------------- registry


def available_drafters() -> dict[str, Any]:
    """name -> entry point, for every installed drafter."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def drafter_class(name: str) -> type:
    eps = available_drafters()
    if name not in eps:
        raise UserError(f"unknown drafter '{name}'; choose one of: {', '.join(sorted(eps))} (see `specbench drafters`)")
    return eps[name].load()


def _coerce(value: str, typ: Any, key: str) -> Any:
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin is typing.Union or str(origin) == "types.UnionType":
        non_none = [a for a in args if a is not type(None)]
        if value.lower() in ("none", "null", ""):
            return None
        return _coerce(value, non_none[0], key)
    if typ is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise UserError(f"--set {key}={value}: expected true or false")
    if typ is int:
        try:
            return int(value)
        except ValueError:
            raise UserError(f"--set {key}={value}: expected an integer") from None
    if typ is float:
        try:
            return float(value)
        except ValueError:
            raise UserError(f"--set {key}={value}: expected a number") from None
    if origin in (tuple, list):
        parts = [p for p in value.replace("[", "").replace("]", "").split(",") if p.strip()]
        inner = args[0] if args else str
        return origin(_coerce(p.strip(), inner, key) for p in parts)
    return value


def parse_config(config_cls: type, pairs: list[str]) -> Any:
    """Build ``config_cls`` from ``["key=value", ...]``; unknown keys or bad values raise UserError."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    hints = typing.get_type_hints(config_cls)
    values: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError(f"--set expects key=value, got '{pair}'")
        key, value = pair.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in fields:
            valid = ", ".join(sorted(fields)) or "(this drafter has no options)"
            raise UserError(f"unknown --set key '{key}'; valid keys: {valid}")
        values[key] = _coerce(value.strip(), hints[key], key)
    try:
        return config_cls(**values)
    except (ValueError, TypeError) as exc:
        raise UserError(f"invalid drafter options: {exc}") from None


def config_json(config: Any) -> str:
    """Canonical JSON of a drafter config (sorted keys), stored with every result row."""
    return json.dumps(dataclasses.asdict(config), sort_keys=True)
