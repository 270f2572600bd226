"""EAGLE-3 checkpoints in the released layout (SafeAILab/EAGLE ``yuhuili/EAGLE3-*``, SpecForge).

A checkpoint directory holds:

* ``config.json``: a Llama config with ``num_hidden_layers: 1``, ``draft_vocab_size``, optional
  ``target_hidden_size``, ``architectures: ["LlamaForCausalLMEagle3"]``. Taps are read from
  SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids`` (layer-output ids, +1 for the HF
  index) or vLLM's top-level ``eagle_aux_hidden_state_layer_ids`` (HF index as is); absent, the
  default (2, N//2, N-3) applies. specbench also writes ``specbench.target_num_hidden_layers``.
* ``model.safetensors`` (or upstream's ``pytorch_model.bin``): the keys listed in model.py,
  ``d2t`` and ``t2d`` included. An ``embed_tokens.weight`` some releases carry is ignored: the
  head always uses the target's own embedding.

Loading refuses (one-line :class:`~specbench.errors.UserError`) a checkpoint made for another
target (vocab size, hidden size, layer count when recorded) and a reduced-vocabulary head without
d2t/t2d: those maps are never regenerated, since a wrong map silently collapses acceptance. A
full-vocabulary head (``draft_vocab_size == vocab_size``) needs no maps: upstream EAGLE deletes the
d2t/t2d buffers exactly then (``ea_model.py``) and vLLM skips an absent ``draft_id_to_target_id``,
so such releases may carry none (or all-zero ones); the map is the identity either way.
"""

from __future__ import annotations

from pathlib import Path

import torch

from drafters.eagle3.model import Eagle3Head, Eagle3HeadConfig, default_feature_layers
from drafters.common.loading import (check_feature_head_for, check_made_for, load_checked, read_config, read_weights,
                                     write_checkpoint)
from drafters.common.vocab import check_vocab_maps
from specbench.drafter import CheckpointId
from specbench.errors import UserError

# keys a released checkpoint may carry that the head does not own
IGNORED_KEYS = ("embed_tokens.weight",)


def save_eagle3(head: Eagle3Head, path: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` for ``head`` into directory ``path``."""
    return write_checkpoint(path, head.config.to_config_dict(), head.state_dict(), head.fc.weight.dtype)


def load_eagle3(path: str | Path, target) -> Eagle3Head:
    """Load the head in ``path`` for ``target``, on the target's device and dtype."""
    return read_eagle3(path, target)[0]


def read_eagle3(path: str | Path, target) -> tuple[Eagle3Head, CheckpointId]:
    """The head in ``path`` for ``target`` and the identity (path, sha256) of the weights read."""
    src = Path(path).expanduser()
    where = f"EAGLE-3 checkpoint '{src}'"
    cfg = read_config(src, where, Eagle3HeadConfig.from_config_dict)

    # 1. made for this target?
    check_made_for(cfg, target, where)
    check_feature_head_for(cfg, cfg.feature_layers or default_feature_layers(target.num_layers), target, where)

    # 2. the weights, d2t and t2d included
    state, identity = read_weights(src, where)
    for key in IGNORED_KEYS:
        state.pop(key, None)
    full_vocab = cfg.draft_vocab_size == cfg.vocab_size
    missing_maps = [k for k in ("d2t", "t2d") if k not in state]
    if full_vocab:
        # upstream deletes d2t / t2d exactly when the draft vocab is the whole vocabulary: the identity
        state.setdefault("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        state.setdefault("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
    elif missing_maps:
        raise UserError(
            f"{where} has no {' / '.join(missing_maps)} vocabulary map; it must ship with the checkpoint "
            "(specbench never regenerates it: a wrong map silently collapses acceptance)"
        )
    head = Eagle3Head(cfg)
    if full_vocab:
        # upstream (cnets.py) never reads the maps when the draft vocab is the whole vocabulary, and
        # its t2d buffer may then be left all False: the identity map is what such a head means
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    else:
        check_vocab_maps(state["d2t"], state["t2d"], where)
        state["d2t"] = state["d2t"].long()
        state["t2d"] = state["t2d"].bool()
    load_checked(head, state, where, "an EAGLE-3 head")
    return head.to(device=target.device, dtype=target.dtype).eval(), identity
