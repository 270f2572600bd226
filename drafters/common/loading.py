"""Loading a learned drafter's checkpoint: config.json, the target check, the weights, shipped lookup.

Each family parses its own config (``parse``) and checks its own extras; the one-line
:class:`~specbench.errors.UserError` messages for the shared cases live here once:

* :func:`read_config`: a missing directory or config.json, broken JSON, a missing key;
* :func:`check_made_for`: a checkpoint made for another target (vocabulary, feature width);
* :func:`read_weights`: ``model.safetensors`` (or upstream's ``pytorch_model.bin``, read with
  ``weights_only``), returned with the :class:`~specbench.drafter.CheckpointId` of the bytes read;
* :func:`load_checked`: missing, stray and mis-shaped weights are refused before loading;
* :func:`write_checkpoint`: the other direction, ``config.json`` + ``model.safetensors`` as every
  family writes them;
* :func:`shipped_checkpoint`: the checkpoint that ships for a target (package data), chosen by
  ``drafters/checkpoints/defaults.toml`` where several heads ship for one family and target;
  :func:`~drafters.common.locate.checkpoint_dir` finds a ``--drafter-path`` (torch-free, in ``locate``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from drafters.common.locate import DEFAULTS_NAME, checkpoint_dir, default_checkpoint_name, shipped_defaults, shipped_folder
from specbench.drafter import CheckpointId
from specbench.errors import UserError

C = TypeVar("C")
WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"


def write_checkpoint(path: str | Path, config: dict, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> Path:
    """Write ``config.json`` (sorted keys, ``torch_dtype`` set to ``dtype``) and ``model.safetensors`` into
    directory ``path`` (made if missing); a family writes its extra files beside them itself."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = {**config, "torch_dtype": str(dtype).removeprefix("torch.")}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    return out


def require_folder(src: Path, where: str) -> None:
    """A checkpoint path that is no folder is one line naming it (``where``) and what to pass instead."""
    if not src.is_dir():
        raise UserError(f"{where} is not a directory; pass the folder holding config.json and model.safetensors")


def read_config(src: Path, where: str, parse: Callable[[dict], C]) -> C:
    """``parse(config.json)`` of directory ``src``; missing, broken or invalid configs are one line."""
    require_folder(src, where)
    if not (src / "config.json").exists():
        if (src / "trainer_state.pt").exists():  # specbench.train.trainer.STATE_FILE: a run still training
            raise UserError(f"{where} is a training run that has not finished (no config.json yet); write its last "
                            f"saved weights with `python scripts/snapshot-head {src} DEST` and pass DEST")
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


def check_feature_head_for(cfg: Any, layers, target, where: str) -> None:
    """An EAGLE-lineage head (eagle3, specblock) fits ``target``: embedding width, layer count, and the
    three hidden states it taps (``layers``)."""
    made_for = f"{where} was made for a different target:"
    embed_dim = int(target.model.get_input_embeddings().weight.shape[1])
    if cfg.hidden_size != embed_dim:
        raise UserError(f"{made_for} hidden_size {cfg.hidden_size}, but target '{target.name}' embeds tokens in {embed_dim} dims")
    if cfg.target_num_layers is not None and int(cfg.target_num_layers) != target.num_layers:
        raise UserError(f"{made_for} {cfg.target_num_layers} layers, but target '{target.name}' has {target.num_layers}")
    if layers is not None and (len(layers) != 3 or not all(0 <= i <= target.num_layers for i in layers)):
        raise UserError(f"{where} taps hidden states {list(layers)}, which target '{target.name}' "
                        f"({target.num_layers} layers) does not have")


def read_weights(src: Path, where: str) -> tuple[dict[str, torch.Tensor], CheckpointId]:
    """The state dict in ``src`` and the identity (path, sha256) of the file it came from."""
    from safetensors.torch import load_file

    if (src / WEIGHTS_NAME).exists():
        path = src / WEIGHTS_NAME
        try:
            state = dict(load_file(str(path)))
        except Exception as exc:  # noqa: BLE001 - a corrupt file becomes one line
            raise UserError(f"{where}: could not read {WEIGHTS_NAME} ({type(exc).__name__})") from None
    elif (src / LEGACY_WEIGHTS_NAME).exists():
        path = src / LEGACY_WEIGHTS_NAME
        try:
            state = dict(torch.load(path, map_location="cpu", weights_only=True))
        except Exception as exc:  # noqa: BLE001
            raise UserError(f"{where}: could not read {LEGACY_WEIGHTS_NAME} ({type(exc).__name__})") from None
    else:
        raise UserError(f"{where} has no {WEIGHTS_NAME} (or {LEGACY_WEIGHTS_NAME})")
    return state, CheckpointId.of_files(src, [path])


def load_checked(module: nn.Module, state: dict[str, torch.Tensor], where: str, kind: str,
                 ignore: Iterable[str] = ()) -> None:
    """``module.load_state_dict(state, strict=True)`` after one-line checks of the key set and shapes.

    ``ignore`` lists keys a released checkpoint may carry that the module does not own (dropped).
    """
    state = {k: v for k, v in state.items() if k not in set(ignore) and not k.endswith("rotary_emb.inv_freq")}
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise UserError(f"{where} lacks weights: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise UserError(f"{where} holds weights {kind} does not have: {', '.join(unexpected[:5])}")
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise UserError(f"{where}: '{key}' has shape {list(state[key].shape)}, config.json implies {list(tensor.shape)}")
    module.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


def random_identity(module: nn.Module, seed: int) -> CheckpointId:
    """The identity of seeded random-init weights (path ``random:seed=S`` and a digest of the tensors)."""
    return CheckpointId.of_tensors(f"random:seed={seed}", module.state_dict())


def shipped_checkpoint(family: str, target_name: str, train_hint: str = "") -> Path:
    """The default checkpoint that ships for a target (package data), or a one-line UserError saying how to get one."""
    folder = shipped_folder(default_checkpoint_name(family, target_name))
    if not (folder / "config.json").is_file():
        raise UserError(
            f"no trained {family} drafter ships for target '{target_name}'; train one with `specbench train --drafter "
            f"{family} --target {target_name}{train_hint} --out DIR` and pass --drafter-path DIR (or --set path=random "
            "for an untrained one)"
        )
    return folder


__all__ = ["require_folder", "read_config", "check_made_for", "read_weights", "load_checked", "random_identity", "shipped_checkpoint",
           "default_checkpoint_name", "shipped_defaults", "checkpoint_dir", "DEFAULTS_NAME",
           "WEIGHTS_NAME", "LEGACY_WEIGHTS_NAME"]
