"""`specbench export --format speculators DIR OUT`: a trained drafter in the format vLLM serves.

The format is that of vLLM's ``speculators`` library (github.com/vllm-project/speculators), which
``vllm serve OUT`` reads: ``config.json`` with ``speculators_model_type``, a
``transformer_layer_config`` (the draft layer's HF config), the algorithm's fields and a
``speculators_config`` naming the proposal method and the verifier (the target), beside
``model.safetensors``. It was derived from speculators' source (``speculators/config.py``,
``models/eagle3/config.py``, ``convert/eagle/eagle3_converter.py``, at commit c05b95b3, version
0.9.0) and from what vLLM reads (``transformers_utils/configs/speculators/{base,algos}.py``), not
produced by the package: speculators 0.9.0 pins transformers <= 5.19 and specbench runs 5.24.

EAGLE-3 (``--format speculators``):

* weights: the released layout's ``midlayer.*`` become ``layers.0.*``; ``fc``, ``norm``,
  ``lm_head``, ``d2t`` (draft id -> target id offset) and ``t2d`` (target ids kept) as they are; no
  ``embed_tokens`` (the verifier's is used, as in speculators' converter without a drafter embedding);
* ``transformer_layer_config``: a Llama config of the one draft layer with the TARGET's vocabulary
  size (the length of ``t2d``), as speculators' converter writes it;
* ``draft_vocab_size``, ``target_hidden_size``, ``norm_before_residual`` (always written: vLLM
  assumes true when it is absent, the released layout means false), and
  ``eagle_aux_hidden_state_layer_ids`` as HF ``hidden_states`` indices (what vLLM captures);
* ``speculators_config``: algorithm ``eagle3``, one greedy proposal with ``speculative_tokens``
  (``--tokens``, default 3 as the converter), the verifier's ``name_or_path`` and ``architectures``.

DFlash is refused: speculators' DFlash checkpoints carry the verifier's embedding and lm_head and
take the mask from the verifier's embedding row at ``mask_token_id``; the block drafters specbench
trains for a target without a spare token id learn their own mask vector, which that format has no
place for (see "Serving these checkpoints elsewhere" in reports/block-drafters.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbench.errors import UserError

FORMATS = ("speculators",)
SPECULATORS_VERSION = "0.9.0"  # the speculators version whose source the format was derived from
# the Hugging Face ids of the built-in targets (the verifier vLLM loads)
HF_IDS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
}
HF_ARCHITECTURES = {"smollm2-135m": ["LlamaForCausalLM"], "qwen2.5-coder-0.5b": ["Qwen2ForCausalLM"],
                    "qwen2.5-coder-1.5b": ["Qwen2ForCausalLM"]}
_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
               "attention_bias", "mlp_bias")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {what} {path} ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} is not a JSON object")
    return data


def family(config: dict[str, Any]) -> str:
    archs = [str(a) for a in config.get("architectures") or []]
    if any("Eagle3" in a for a in archs):
        return "eagle3"
    if "dflash_config" in config or any("DFlash" in a for a in archs):
        return "dflash"
    return "unknown"


def trained_for(src: Path) -> str | None:
    """The target a specbench checkpoint was trained for (its training.json), if recorded."""
    path = src / "training.json"
    if not path.is_file():
        return None
    job = _read_json(path, "training record").get("job") or {}
    return job.get("target") if isinstance(job.get("target"), str) else None


def verifier_of(src: Path, verifier: str | None) -> tuple[str, list[str]]:
    """(name_or_path, architectures) of the verifier: --verifier, else the checkpoint's target."""
    name = verifier or trained_for(src)
    if name is None:
        raise UserError(f"{src} does not record the target it was trained for; name it with --verifier (an HF id or model directory)")
    if name in HF_IDS:
        return HF_IDS[name], HF_ARCHITECTURES[name]
    local = Path(name).expanduser()
    if (local / "config.json").is_file():
        archs = _read_json(local / "config.json", "verifier config").get("architectures") or []
        return str(local.absolute()), [str(a) for a in archs]
    if name.startswith("tiny-") or name.startswith("random:"):
        raise UserError(f"the verifier '{name}' is built in code and cannot be served; pass --verifier with an HF id or model directory")
    if "/" in name:  # a hub id: its architectures are read by vLLM when it loads it
        return name, []
    raise UserError(f"unknown verifier '{name}'; pass --verifier with an HF id or a model directory")


def export_speculators(src: Path, out: Path, verifier: str | None = None, tokens: int = 3) -> dict[str, Any]:
    """Write ``src`` (a drafter checkpoint directory) to ``out`` in the speculators format; returns
    the written config."""
    from safetensors.torch import load_file, save_file

    src = Path(src).expanduser()
    out = Path(out).expanduser()
    if not (src / "config.json").is_file():
        raise UserError(f"{src} has no config.json; pass a drafter checkpoint directory (e.g. drafters/checkpoints/eagle3-smollm2-135m)")
    if tokens < 1:
        raise UserError(f"--tokens must be at least 1, got {tokens}")
    config = _read_json(src / "config.json", "checkpoint config")
    kind = family(config)
    if kind == "dflash":
        raise UserError(f"{src} is a block drafter (the DFlash layout, which JetSpec and TreeFlash heads share) and is not "
                        "exported: the speculators DFlash format takes the mask from the verifier's embedding row and has "
                        "no place for the learned mask vector specbench's block drafters carry")
    if kind != "eagle3":
        raise UserError(f"{src} is not an EAGLE-3 checkpoint (architectures {config.get('architectures')}); "
                        "only EAGLE-3 heads are exported to the speculators format")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an empty folder; choose a new OUT")
    weights_path = src / "model.safetensors"
    if not weights_path.is_file():
        raise UserError(f"{src} has no model.safetensors")
    name, archs = verifier_of(src, verifier)

    from drafters.eagle3.model import Eagle3HeadConfig, default_feature_layers

    try:
        head = Eagle3HeadConfig.from_config_dict(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{src}/config.json is not a valid EAGLE-3 config ({exc})") from None
    state = load_file(str(weights_path))
    if "t2d" in state and int(state["t2d"].numel()) != head.vocab_size:
        raise UserError(f"{src}: t2d has {state['t2d'].numel()} entries but vocab_size is {head.vocab_size}")
    taps = head.feature_layers
    if taps is None:
        if head.target_num_layers is None:
            raise UserError(f"{src} records neither its taps nor its target's layer count; cannot name the aux layers")
        taps = default_feature_layers(int(head.target_num_layers))

    layer = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
             "vocab_size": head.vocab_size, "tie_word_embeddings": False,
             **{k: config[k] for k in _LAYER_KEYS if k in config}}
    if "rope_theta" not in layer:
        layer["rope_theta"] = head.rope_theta
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype:
        layer["torch_dtype"] = dtype
    speculator = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": head.draft_vocab_size,
        "target_hidden_size": head.target_hidden_size,
        "norm_before_residual": bool(head.norm_before_residual),
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "eagle_aux_hidden_state_layer_ids": [int(i) for i in taps],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(tokens),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": name, "architectures": archs},
        },
    }
    if dtype:
        speculator["torch_dtype"] = dtype
    renamed = {(("layers.0." + k[len("midlayer."):]) if k.startswith("midlayer.") else k): v.contiguous()
               for k, v in state.items() if k != "embed_tokens.weight"}
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(speculator, indent=2) + "\n", encoding="utf-8")
        save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    except OSError as exc:
        raise UserError(f"cannot write {out} ({exc.strerror or exc}); choose another OUT") from None
    return speculator


__all__ = ["FORMATS", "HF_IDS", "export_speculators", "family", "verifier_of"]
