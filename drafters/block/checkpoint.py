"""Block drafter checkpoints in the released layouts.

* **DFlash** (z-lab ``*-DFlash*``): a Qwen3-style ``config.json`` with ``block_size``,
  ``num_target_layers``, ``layer_types`` and ``dflash_config: {mask_token_id, target_layer_ids,
  block_size}``; ``model.safetensors`` with the keys listed in model.py (no embedding, no lm_head).
* **JetSpec**: the same keys, with ``dflash_config.causal_head: true`` (we also write the top-level
  ``is_causal: true`` that z-lab's attention honours, so their code runs the head causally).
* **TreeFlash** (ETH-DISCO): the backbone keys under a ``model.`` prefix, the correction under
  ``ar_approximation.{ug.weight, ug.bias, d.weight, norm.weight}``, and
  ``treeflash_config: {ar_approximation: "swiglu" | null, candidate_tokens}``.

A target with no spare token id (SmolLM2) needs a learned mask embedding [H]. It is written the
way vLLM's DFlash model (``qwen3_dflash.py``) takes one: ``mask_embedding.pt`` beside the weights,
a plain tensor saved with ``torch.save`` (vLLM reads it with ``torch.load(weights_only=True)`` and
``reshape(-1)``), together with a non-null ``dflash_config.mask_token_id`` (vLLM's proposer fills
the B-1 masked slots with that id and the model swaps in the file's vector wherever the input id
equals it). The chosen id is the last id of the vocabulary (``vocab_size - 1``: a reserved padding
row or the rarest BPE merge; only a root equal to it would see the mask vector instead of its own
embedding, which costs acceptance, never correctness), or the id a loaded checkpoint recorded.
``model.safetensors`` then holds the plain upstream key set; ``specbench.learned_mask_embedding``
marks the layout. z-lab's and TreeFlash's code (and SGLang) read the mask from the target's own
embedding row and ignore the file, so they cannot serve such a checkpoint; no ``auto_map`` is
written (z-lab's remote code would build a model that drafts with the wrong mask vector). A model
that uses a spare id of the target keeps the plain upstream layout (no file). Loading prefers
``mask_embedding.pt`` (the vector vLLM uses), and still reads specbench's older layout (a
``mask_embedding`` key in ``model.safetensors`` with ``mask_token_id: null``).

The reduced draft vocabulary variant (ours) adds a top-level ``draft_vocab_size`` (EAGLE-3's key)
and ``specbench.reduced_draft_vocabulary: true`` to config.json and EAGLE-3's ``d2t`` [Vd] int64 /
``t2d`` [V] bool to ``model.safetensors`` (unprefixed in every layout); loading refuses it without
valid maps. Upstream code cannot serve such a head; the full-vocabulary layout is unchanged.

A TreeFlash correction narrower than ``intermediate_size`` is recorded as
``treeflash_config.ar_intermediate_size`` (upstream always uses ``intermediate_size``).

Loading refuses, with one line, a checkpoint made for another target (vocab size, hidden size,
layer count) or whose weights do not match its config.
"""

from __future__ import annotations

from pathlib import Path

import torch

from drafters.block.model import BlockConfig, BlockModel, build_target_layer_ids
from drafters.common.loading import WEIGHTS_NAME, check_made_for, load_checked, read_config, read_weights, write_checkpoint
from drafters.common.rope import rope_parameters
from drafters.common.shape import rope_from_config_dict
from drafters.common.vocab import check_vocab_maps
from specbench.drafter import CheckpointId
from specbench.errors import UserError

MASK_EMBEDDING_NAME = "mask_embedding.pt"  # vLLM's file for a learned mask embedding
LAYOUTS = ("dflash", "jetspec", "treeflash")
_KNOWN = {
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling",
    "max_position_embeddings", "block_size", "num_target_layers", "layer_types", "dflash_config", "treeflash_config",
    "is_causal", "specbench", "torch_dtype", "dtype", "tie_word_embeddings", "hidden_act", "attention_bias",
    "target_hidden_size", "draft_vocab_size",
}
VOCAB_MAPS = ("d2t", "t2d")  # the reduced draft vocabulary's maps (EAGLE-3's), unprefixed in every layout


def config_dict(cfg: BlockConfig, layout: str) -> dict:
    """The ``config.json`` of ``cfg`` in ``layout`` (dflash, jetspec or treeflash)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    out = {k: v for k, v in cfg.extra.items() if k != "candidate_tokens"}  # TreeFlash's lives in treeflash_config
    mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else export_mask_token_id(cfg)
    dflash = {"mask_token_id": mask_id, "target_layer_ids": list(cfg.target_layer_ids), "block_size": cfg.block_size}
    if cfg.causal:
        dflash["causal_head"] = True
    arch = {"dflash": "DFlashDraftModel", "jetspec": "DFlashDraftModel", "treeflash": "TreeFlashDraftModel"}[layout]
    out.update(
        architectures=[arch], model_type="qwen3", hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.dim_per_head, vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling,
        rope_parameters=rope_parameters(cfg.rope_theta, cfg.rope_scaling),
        max_position_embeddings=cfg.max_position_embeddings, block_size=cfg.block_size,
        num_target_layers=cfg.num_target_layers, layer_types=["full_attention"] * cfg.num_hidden_layers,
        dflash_config=dflash, is_causal=cfg.causal, tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
    )
    if cfg.target_hidden_size not in (None, cfg.hidden_size):
        out["target_hidden_size"] = cfg.target_hidden_size
    if layout == "treeflash":
        tf = {"ar_approximation": cfg.ar_approximation, "candidate_tokens": int(cfg.extra.get("candidate_tokens", 64))}
        if cfg.ar_intermediate_size not in (None, cfg.intermediate_size):
            tf["ar_intermediate_size"] = cfg.ar_intermediate_size
        out["treeflash_config"] = tf
    if cfg.mask_token_id is None:
        out["specbench"] = dict(out.get("specbench", {}), learned_mask_embedding=True)
    if cfg.reduced_vocab:  # ours (EAGLE-3's key): upstream DFlash / JetSpec / TreeFlash code cannot serve it
        out["draft_vocab_size"] = cfg.draft_vocab_size
        out["specbench"] = dict(out.get("specbench", {}), reduced_draft_vocabulary=True)
    return out


def export_mask_token_id(cfg: BlockConfig) -> int:
    """The ``mask_token_id`` written for a model with a learned mask embedding (see the module doc)."""
    recorded = cfg.extra.get("mask_token_id")
    if isinstance(recorded, int) and 0 <= recorded < cfg.vocab_size:
        return recorded
    return cfg.vocab_size - 1


def config_from_dict(d: dict) -> BlockConfig:
    """Read a DFlash / JetSpec / TreeFlash ``config.json``. KeyError names a missing key."""
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if key not in d:
            raise KeyError(key)
    dflash = d.get("dflash_config") or {}
    tf = d.get("treeflash_config") or {}
    n_target = d.get("num_target_layers")
    layer_ids = dflash.get("target_layer_ids") or d.get("target_layer_ids")
    if layer_ids is None:
        if n_target is None:
            raise KeyError("dflash_config.target_layer_ids")
        layer_ids = build_target_layer_ids(int(n_target), int(d["num_hidden_layers"]))
    theta, scaling = rope_from_config_dict(d)
    causal = bool(dflash.get("causal_head", d.get("is_causal") or False))
    return BlockConfig(
        hidden_size=int(d["hidden_size"]), intermediate_size=int(d["intermediate_size"]),
        num_hidden_layers=int(d["num_hidden_layers"]), num_attention_heads=int(d["num_attention_heads"]),
        num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]), vocab_size=int(d["vocab_size"]),
        target_layer_ids=tuple(int(i) for i in layer_ids),
        num_target_layers=int(n_target) if n_target is not None else max(layer_ids) + 3,
        block_size=int(d.get("block_size") or dflash.get("block_size") or 16), head_dim=d.get("head_dim"),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(d.get("max_position_embeddings") or 8192),
        target_hidden_size=d.get("target_hidden_size"), mask_token_id=dflash.get("mask_token_id", d.get("mask_token_id")),
        causal=causal, ar_approximation=tf.get("ar_approximation"), ar_intermediate_size=tf.get("ar_intermediate_size"),
        draft_vocab_size=int(d["draft_vocab_size"]) if d.get("draft_vocab_size") else None,
        extra={k: v for k, v in d.items() if k not in _KNOWN} | ({"candidate_tokens": tf["candidate_tokens"]} if "candidate_tokens" in tf else {}),
    )


def state_dict_for(model: BlockModel, layout: str) -> dict[str, torch.Tensor]:
    """The model's weights under ``layout``'s key names."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if layout != "treeflash":
        if any(k.startswith("ar_approximation.") for k in state):
            raise ValueError(f"a {layout} checkpoint has no ar_approximation; save it in the treeflash layout")
        return state
    return {(k if k.startswith("ar_approximation.") or k in VOCAB_MAPS else f"model.{k}"): v for k, v in state.items()}


def save_block(model: BlockModel, path: str | Path, layout: str) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ ``mask_embedding.pt``) of ``model`` into ``path``."""
    tensors = state_dict_for(model, layout)
    mask = tensors.pop("model.mask_embedding" if layout == "treeflash" else "mask_embedding", None)
    out = write_checkpoint(path, config_dict(model.config, layout), tensors, model.fc.weight.dtype)
    if mask is not None:
        torch.save(mask.clone(), out / MASK_EMBEDDING_NAME)  # a plain [H] tensor, what vLLM reads
    else:
        (out / MASK_EMBEDDING_NAME).unlink(missing_ok=True)  # never leave a stale one beside a plain layout
    return out


def load_block(path: str | Path, target, family: str) -> BlockModel:
    """Load the block drafter in ``path`` for ``target`` (on its device and dtype).

    ``family`` names the drafter asking (for messages and the causal check).
    """
    return read_block(path, target, family)[0]


def read_block(path: str | Path, target, family: str) -> tuple[BlockModel, CheckpointId]:
    """:func:`load_block` plus the identity (path, sha256 of the weight files read) of the checkpoint."""
    src = Path(path).expanduser()
    where = f"{family} checkpoint '{src}'"
    cfg = read_config(src, where, config_from_dict)
    check_made_for(cfg, target, where)
    made_for = f"{where} was made for a different target:"
    if cfg.num_target_layers != target.num_layers:
        raise UserError(f"{made_for} {cfg.num_target_layers} layers, but target '{target.name}' has {target.num_layers}")
    if not all(0 <= i < target.num_layers for i in cfg.target_layer_ids):
        raise UserError(f"{where} taps layers {list(cfg.target_layer_ids)}, which target '{target.name}' does not have")
    embed_dim = int(target.model.get_input_embeddings().weight.shape[1])
    if cfg.hidden_size != embed_dim:
        raise UserError(f"{where} has hidden_size {cfg.hidden_size}, but target '{target.name}' embeds tokens in {embed_dim} dims")
    if cfg.mask_token_id is not None and not 0 <= int(cfg.mask_token_id) < target.vocab_size:
        raise UserError(f"{where}: mask_token_id {cfg.mask_token_id} is outside the target's vocabulary")

    if not (src / WEIGHTS_NAME).exists():
        raise UserError(f"{where} has no {WEIGHTS_NAME}")
    state, identity = read_weights(src, where)
    if any(k.startswith("model.") for k in state):  # the TreeFlash layout
        state = {k.removeprefix("model."): v for k, v in state.items()}
    if (src / MASK_EMBEDDING_NAME).exists():  # a learned mask embedding, vLLM's file (preferred)
        identity = CheckpointId.of_files(src, [src / WEIGHTS_NAME, src / MASK_EMBEDDING_NAME])
        state["mask_embedding"] = _read_mask_embedding(src / MASK_EMBEDDING_NAME, cfg, where)
        recorded = {} if cfg.mask_token_id is None else {"mask_token_id": int(cfg.mask_token_id)}
        cfg = cfg.replace(mask_token_id=None, extra=cfg.extra | recorded)
    elif cfg.mask_token_id is None and "mask_embedding" not in state:
        raise UserError(f"{where} has mask_token_id null but no {MASK_EMBEDDING_NAME}: it needs a mask token id "
                        "or the learned mask embedding")
    if cfg.reduced_vocab:
        missing = [k for k in VOCAB_MAPS if k not in state]
        if missing:
            raise UserError(f"{where} has draft_vocab_size {cfg.draft_vocab_size} but no {' / '.join(missing)} vocabulary "
                            "map; it must ship with the checkpoint (a wrong map silently collapses acceptance)")
        check_vocab_maps(state["d2t"], state["t2d"], where)
        state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    model = BlockModel(cfg)
    load_checked(model, state, where, "a block drafter with this config.json")
    return model.to(device=target.device, dtype=target.dtype).eval(), identity


def _read_mask_embedding(path: Path, cfg: BlockConfig, where: str) -> torch.Tensor:
    """``mask_embedding.pt``: a tensor of hidden_size values, or vLLM's ``{mask_token_id, embedding}`` dict."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a corrupt or pickled-code file becomes one line
        raise UserError(f"{where}: could not read {MASK_EMBEDDING_NAME} ({type(exc).__name__})") from None
    if isinstance(state, dict):
        recorded = state.get("mask_token_id", cfg.mask_token_id)
        if cfg.mask_token_id is not None and recorded != cfg.mask_token_id:
            raise UserError(f"{where}: {MASK_EMBEDDING_NAME} is for mask_token_id {recorded}, "
                            f"config.json says {cfg.mask_token_id}")
        state = state.get("embedding")
    if not isinstance(state, torch.Tensor) or not state.is_floating_point():
        raise UserError(f"{where}: {MASK_EMBEDDING_NAME} holds no floating-point tensor")
    if state.numel() != cfg.hidden_size:
        raise UserError(f"{where}: {MASK_EMBEDDING_NAME} holds {state.numel()} values, hidden_size is {cfg.hidden_size}")
    return state.reshape(-1)


__all__ = ["save_block", "load_block", "read_block", "config_dict", "config_from_dict", "state_dict_for", "export_mask_token_id",
           "LAYOUTS", "WEIGHTS_NAME", "MASK_EMBEDDING_NAME"]
