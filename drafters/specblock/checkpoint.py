"""SpecBlock checkpoints in the released layout (shiweijiezero/SpecBlock ``save_pretrained``).

A checkpoint directory holds:

* ``config.json``: a Llama config (``architectures: ["LlamaForCausalLMSpecBlockShift"]``,
  ``num_hidden_layers: 2``) plus ``draft_vocab_size``, ``diffspec_draft_token_num`` (K),
  ``rank_classes``, ``num_ttt_blocks`` and ``target_hidden_size``; specbench adds a ``specbench``
  object (target layer count, feature taps) that upstream ignores. Taps: upstream hard-codes the
  hidden states entering layers (2, N//2, N-3), which is also specbench's default.
* ``model.safetensors``: every key of model.py but the embedding (upstream drops every key containing
  "embed"; the drafter copies the TARGET's embedding at load), ``d2t`` and ``t2d`` included.
* ``vocab_mapping.pt``: ``{"d2t": ..., "t2d": ...}`` (SpecForge ``generate_vocab_mapping_file``),
  which upstream's loader prefers when the draft vocabulary is reduced. Read here with
  ``torch.load(weights_only=True)`` (tensors and plain containers only: nothing is unpickled that could
  run code); when present it must agree with the d2t / t2d in model.safetensors.

Loading refuses in one line a checkpoint made for another target (vocabulary, feature width, hidden
size against the target's embedding, recorded layer count), missing / stray / mis-shaped weights, and
inconsistent vocabulary maps.
"""

from __future__ import annotations

from pathlib import Path

import torch

from drafters.common.loading import (WEIGHTS_NAME, check_feature_head_for, check_made_for, load_checked, read_config, read_weights,
                                     write_checkpoint)
from drafters.common.vocab import check_vocab_maps
from drafters.specblock.model import SpecBlockConfig, SpecBlockModel
from specbench.drafter import CheckpointId
from specbench.errors import UserError

VOCAB_MAPPING = "vocab_mapping.pt"


def save_specblock(model: SpecBlockModel, path: str | Path) -> Path:
    """Write config.json + model.safetensors (no embedding) + vocab_mapping.pt into ``path``."""
    out = write_checkpoint(path, model.config.to_config_dict(), model.released_state(), model.lm_head.weight.dtype)
    torch.save({"d2t": model.d2t.detach().cpu().clone(), "t2d": model.t2d.detach().cpu().clone()}, out / VOCAB_MAPPING)
    return out


def read_vocab_mapping(src: Path, where: str) -> dict[str, torch.Tensor] | None:
    """``vocab_mapping.pt`` without unpickling arbitrary objects, or None when absent."""
    path = src / VOCAB_MAPPING
    if not path.exists():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - an unsafe or corrupt file becomes one line
        raise UserError(f"{where}: {VOCAB_MAPPING} is not a plain tensor file ({type(exc).__name__}); "
                        "it must hold {'d2t': tensor, 't2d': tensor}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), torch.Tensor) for k in ("d2t", "t2d")):
        raise UserError(f"{where}: {VOCAB_MAPPING} must hold {{'d2t': tensor, 't2d': tensor}}")
    return {"d2t": data["d2t"], "t2d": data["t2d"]}


def read_specblock(path: str | Path, target) -> tuple[SpecBlockModel, CheckpointId]:
    """The model in ``path`` for ``target`` (embedding copied from it), on its device and dtype, and the
    identity of the weight files read."""
    src = Path(path).expanduser()
    where = f"SpecBlock checkpoint '{src}'"
    cfg = read_config(src, where, SpecBlockConfig.from_config_dict)
    check_made_for(cfg, target, where)
    check_feature_head_for(cfg, cfg.feature_layers, target, where)
    state, identity = read_weights(src, where)
    state = {k: v for k, v in state.items() if "embed" not in k.lower()}
    maps = read_vocab_mapping(src, where)
    files = [src / WEIGHTS_NAME] if (src / WEIGHTS_NAME).exists() else []
    if maps is not None:
        for key in ("d2t", "t2d"):
            if key in state and not torch.equal(state[key].long(), maps[key].long()):
                raise UserError(f"{where}: {key} in {VOCAB_MAPPING} differs from the one in the weights")
            state[key] = maps[key]
        if files:
            identity = CheckpointId.of_files(src, files + [src / VOCAB_MAPPING])
    if cfg.draft_vocab_size == cfg.vocab_size:
        state.setdefault("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        state.setdefault("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
    missing_maps = [k for k in ("d2t", "t2d") if k not in state]
    if missing_maps:
        raise UserError(f"{where} has no {' / '.join(missing_maps)} vocabulary map (in {WEIGHTS_NAME} or {VOCAB_MAPPING}); "
                        "specbench never regenerates it: a wrong map silently collapses acceptance")
    if tuple(state["d2t"].shape) != (cfg.draft_vocab_size,) or tuple(state["t2d"].shape) != (cfg.vocab_size,):
        raise UserError(f"{where}: d2t / t2d have shapes {list(state['d2t'].shape)} / {list(state['t2d'].shape)}, "
                        f"config.json implies [{cfg.draft_vocab_size}] / [{cfg.vocab_size}]")
    check_vocab_maps(state["d2t"], state["t2d"], where)
    state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    model = SpecBlockModel(cfg)
    embed_key = "input_layer.embed_tokens.weight"
    state[embed_key] = model.state_dict()[embed_key]  # replaced by the target's just below
    load_checked(model, state, where, "a SpecBlock model")
    model.copy_embedding(target)
    return model.to(device=target.device, dtype=target.dtype).eval(), identity


__all__ = ["save_specblock", "read_specblock", "read_vocab_mapping", "VOCAB_MAPPING"]
