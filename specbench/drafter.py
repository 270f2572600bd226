"""The drafter contract, the sampling settings, and the entry-point registry.

The harness finds drafter classes through the ``specbench.drafters`` entry-point group, so a
third-party package adds one without touching specbench; the harness never branches on a drafter's
name. Every registered class subclasses :class:`Drafter`, which declares every member a drafter
may have, with a default wherever the member is optional:

========================  =========  ===========================================================
member                    required   meaning
========================  =========  ===========================================================
``Config``                no         a frozen dataclass of options, every field with a default
                                     (``--set key=value`` is parsed against it); default: none.
                                     A drafter that loads weights has a ``path`` field:
                                     ``"auto"`` (the checkpoint shipped for the target),
                                     ``"random"`` (seeded random init, for tests) or a directory.
``description``           no         one line for ``specbench drafters``
``__init__(target, cfg)`` yes        build against a loaded :class:`~specbench.targets.Target`
``feature_layers``        no         HF ``hidden_states`` indices to tap (``()``: none)
``reset(sampling)``       yes        forget everything about the previous generation
``propose(ctx)``          yes        return a :class:`~specbench.tree.DraftTree` rooted at
                                     ``ctx.tokens[-1]``
``checkpoint``            no         :class:`CheckpointId` of the weights loaded (None: no weights)
``training()``            no         the family's trainable class for ``specbench train``
                                     (a :class:`specbench.train.trainer.Trainable`), or None
``take_log()``            no         records of the drafter's own decisions since the last call
                                     (stored per result row as ``drafter_log`` JSON), or None
``test_options``          no         ``--set`` option lists the conformance suite runs on the tiny
                                     targets (``tests/test_conformance.py``); learned drafters
                                     are also run with ``path=random`` and with a briefly
                                     trained checkpoint when they have ``training()``
========================  =========  ===========================================================
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from specbench.errors import UserError
from specbench.tree import DraftTree

__all__ = ["UserError", "Sampling", "DraftContext", "NewRows", "Drafter", "CheckpointId", "NoOptions", "parse_config",
           "drafter_class", "takes_checkpoint", "config_json", "available_drafters"]

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

    Feature rows. ``features[i]`` is the target hidden state at the position before its token (the
    (hidden at t, token t+1) pairing EAGLE and DFlash use), so the first token of a sequence
    (position 0) has no row: ``features`` pairs with the LAST ``features.shape[0]`` tokens, which
    is all of them except on the first call. :meth:`new_rows` gives the rows with their tokens and
    positions.
    """

    tokens: Tensor  # [m] int64 newly committed tokens; tokens[-1] is the new root
    # [r, F] target features of the last r tokens (r = m, or m - 1 when tokens[0] sits at position 0);
    # None when the drafter asked for no feature layers.
    features: Tensor | None
    pos: int  # position of the root == number of tokens in the target's KV cache
    accepted_nodes: Tensor | None  # [a+1] node ids of the previous tree on the accepted path (None on the first call)

    @property
    def first_pos(self) -> int:
        """Absolute position of ``tokens[0]``."""
        return self.pos - self.tokens.numel() + 1

    def new_rows(self) -> "NewRows":
        """The newly committed (token, feature) rows with their positions (see the class doc)."""
        if self.features is None:
            raise ValueError("this context carries no features: the drafter asked for no feature layers")
        r = self.features.shape[0]
        m = self.tokens.numel()
        return NewRows(tokens=self.tokens[m - r:], features=self.features, positions=torch.arange(
            self.pos - r + 1, self.pos + 1, device=self.tokens.device))


@dataclass(frozen=True)
class NewRows:
    """Committed tokens that have a feature row, in order; the last is the root."""

    tokens: Tensor  # [r] int64
    features: Tensor  # [r, F] the target's state at the position before each token
    positions: Tensor  # [r] int64 absolute position of each token (its feature is at position - 1)

    @property
    def count(self) -> int:
        return int(self.tokens.numel())


@dataclass(frozen=True)
class CheckpointId:
    """Which weights a drafter runs: where they came from and a digest of their bytes."""

    path: str  # the directory (or "random:seed=S", or a draft LM's name)
    sha256: str  # of the weight files read (sorted by name), or of the tensors for in-memory weights

    @staticmethod
    def of_files(path: str | Path, files: list[Path]) -> "CheckpointId":
        h = hashlib.sha256()
        for f in sorted(files, key=lambda p: p.name):
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        return CheckpointId(str(path), h.hexdigest())

    @staticmethod
    def of_tensors(path: str, state: dict[str, Tensor]) -> "CheckpointId":
        h = hashlib.sha256()
        for key in sorted(state):
            t = state[key].detach().cpu().contiguous()
            h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
            if t.numel():  # hashed in place through the buffer protocol (no copy of the bytes)
                h.update(t.view(-1).view(torch.uint8).numpy())
        return CheckpointId(path, h.hexdigest())


@dataclass(frozen=True)
class NoOptions:
    """The Config of a drafter without options."""


class Drafter(abc.ABC):
    """The base class of every drafter (see the module doc for the members)."""

    Config: ClassVar[type] = NoOptions
    description: ClassVar[str] = ""
    # option lists (``--set`` pairs) the conformance suite runs on the tiny test targets
    test_options: ClassVar[tuple[tuple[str, ...], ...]] = ((),)
    feature_layers: tuple[int, ...] = ()  # HF hidden_states indices (0 = embeddings, i + 1 = output of layer i)
    checkpoint: CheckpointId | None = None

    @abc.abstractmethod
    def __init__(self, target, config) -> None: ...

    @abc.abstractmethod
    def reset(self, sampling: Sampling) -> None:
        """Forget everything about the previous generation."""

    @abc.abstractmethod
    def propose(self, ctx: DraftContext) -> DraftTree:
        """Return a tree rooted at ``ctx.tokens[-1]``."""

    @classmethod
    def training(cls) -> type | None:
        """The family's trainable for ``specbench train`` (imported on demand), or None."""
        return None

    def take_log(self) -> list[dict] | None:
        """Records (JSON-able dicts) of what the drafter decided since the last call, e.g. an online
        adaptation's decisions; the runner stores them in the result row's ``drafter_log``. None: no log."""
        return None


def takes_checkpoint(cls: type[Drafter]) -> bool:
    """True when the drafter loads weights (its Config has a ``path`` option)."""
    return "path" in {f.name for f in dataclasses.fields(cls.Config)}


# --------------------------------------------------------------------------- registry


def available_drafters() -> dict[str, Any]:
    """name -> entry point, for every installed drafter."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def drafter_class(name: str) -> type[Drafter]:
    eps = available_drafters()
    if name not in eps:
        raise UserError(f"unknown drafter '{name}'; choose one of: {', '.join(sorted(eps))} (see `specbench drafters`)")
    cls = eps[name].load()
    if not (isinstance(cls, type) and issubclass(cls, Drafter)):
        raise UserError(f"drafter '{name}' ({eps[name].value}) does not subclass specbench.drafter.Drafter; "
                        "fix the package that registers it")
    if not (dataclasses.is_dataclass(cls.Config) and all(
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            for f in dataclasses.fields(cls.Config))):
        raise UserError(f"drafter '{name}': its Config must be a dataclass with a default for every field")
    return cls


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
