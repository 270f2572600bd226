"""What every learned drafter's checkpoint loader does first: read config.json, check the target.

Each family parses its own config (``parse``) and checks its own extras; the one-line
:class:`~specbench.errors.UserError` messages for the shared cases live here once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from specbench.errors import UserError

C = TypeVar("C")


def read_config(src: Path, where: str, parse: Callable[[dict], C]) -> C:
    """``parse(config.json)`` of directory ``src``; missing, broken or invalid configs are one line."""
    if not src.is_dir():
        raise UserError(f"{where} is not a directory; pass the folder holding config.json and model.safetensors")
    if not (src / "config.json").exists():
        raise UserError(f"{where} has no config.json")
    try:
        return parse(json.loads((src / "config.json").read_text()))
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: config.json is not valid JSON ({exc})") from None
    except KeyError as exc:
        raise UserError(f"{where}: config.json lacks '{exc.args[0]}'") from None
    except (ValueError, TypeError) as exc:
        raise UserError(f"{where}: invalid config.json ({exc})") from None


def check_made_for(cfg: Any, target, where: str) -> None:
    """The checkpoint's vocabulary and feature width must be the target's."""
    made_for = f"{where} was made for a different target:"
    if cfg.vocab_size != target.vocab_size:
        raise UserError(f"{made_for} vocab_size {cfg.vocab_size}, but target '{target.name}' has {target.vocab_size}")
    if cfg.feature_size != target.hidden_size:
        raise UserError(f"{made_for} hidden size {cfg.feature_size}, but target '{target.name}' has {target.hidden_size}")


__all__ = ["read_config", "check_made_for"]
