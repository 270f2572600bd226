"""`specbench export --format speculators`: the shipped EAGLE-3 head in the format vLLM serves — the
config fields vLLM reads, the weights renamed and unchanged, the vocabulary mapping, the verifier;
a load with the `speculators` package when it is installed; one-line refusals."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafters.common.loading import shipped_checkpoint
from drafters.eagle3.model import Eagle3HeadConfig

from clirun import invoke, one_error_line

SHIPPED = shipped_checkpoint("eagle3", "smollm2-135m")  # the default head (defaults.toml)
DFLASH = shipped_checkpoint("dflash", "smollm2-135m")


def vllm_reads(config: dict) -> dict:
    """What vLLM takes from a speculators config (transformers_utils/configs/speculators/base.py and
    algos.py, restated): the speculative config and the draft model's config; KeyError if malformed."""
    spec = config["speculators_config"]
    method = spec["proposal_methods"][0]
    layer = dict(config["transformer_layer_config"])
    assert isinstance(layer, dict)
    assert config["speculators_model_type"] == "eagle3"
    layer.update(draft_vocab_size=config["draft_vocab_size"], norm_before_residual=config.get("norm_before_residual", True),
                 architectures=["Eagle3LlamaForCausalLM"])
    if config.get("target_hidden_size") is not None:
        layer["target_hidden_size"] = config["target_hidden_size"]
    if config.get("eagle_aux_hidden_state_layer_ids"):
        layer["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    return {"method": config["speculators_model_type"], "num_speculative_tokens": method["speculative_tokens"],
            "target": spec["verifier"]["name_or_path"], "draft": layer}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "eagle3-speculators"
    result = invoke("export", SHIPPED, out, "--format", "speculators", "--tokens", "4")
    assert result.exit_code == 0, result.output
    assert f"vllm serve {out}" in result.stdout.replace("\n", " ")
    return out


def test_config_names_the_verifier_taps_and_vocabularies(exported):
    config = json.loads((exported / "config.json").read_text())
    read = vllm_reads(config)
    assert read["method"] == "eagle3" and read["num_speculative_tokens"] == 4
    assert read["target"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert config["speculators_config"]["default_proposal_method"] == "greedy"
    source = json.loads((SHIPPED / "config.json").read_text())
    head = Eagle3HeadConfig.from_config_dict(source)
    draft = read["draft"]
    assert draft["norm_before_residual"] is False  # written, since vLLM would assume true
    assert draft["vocab_size"] == source["vocab_size"] == 49152  # the target's vocabulary
    assert draft["draft_vocab_size"] == source["draft_vocab_size"] == 4096
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps"):
        assert draft[key] == source[key]
    assert draft["num_hidden_layers"] == 1 and draft["model_type"] == "llama"
    # the taps as HF hidden_states indices, the ones specbench's own loader reads from the source
    assert draft["eagle_aux_hidden_state_layer_ids"] == list(head.feature_layers) == [2, 15, 27]


def test_weights_renamed_unchanged_with_a_consistent_vocab_map(exported):
    src, dst = load_file(str(SHIPPED / "model.safetensors")), load_file(str(exported / "model.safetensors"))
    assert not any(k.startswith("midlayer.") for k in dst) and "layers.0.self_attn.q_proj.weight" in dst
    assert {k.replace("midlayer.", "layers.0.") for k in src} == set(dst)
    for key, value in src.items():
        other = dst[key.replace("midlayer.", "layers.0.")]
        assert other.dtype == value.dtype and torch.equal(other, value)
    d2t, t2d = dst["d2t"], dst["t2d"]
    config = json.loads((exported / "config.json").read_text())
    assert d2t.numel() == config["draft_vocab_size"] == int(t2d.sum())
    assert t2d.numel() == config["transformer_layer_config"]["vocab_size"]
    target_ids = torch.arange(d2t.numel()) + d2t  # draft id i is target id i + d2t[i]
    assert bool(t2d[target_ids].all()) and target_ids.unique().numel() == d2t.numel()


def test_loads_with_the_speculators_package(exported):
    """Needs the speculators package, installed or on $SPECBENCH_SPECULATORS_PATH (e.g. a folder from
    ``pip install --no-deps --target DIR speculators``): its config class reads the export and its
    EAGLE-3 model's state dict takes every exported tensor at its shape."""
    env = dict(os.environ)
    extra = env.get("SPECBENCH_SPECULATORS_PATH")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
    if importlib.util.find_spec("speculators") is None and not extra:
        pytest.skip("the speculators package is not installed (speculators 0.9.0 pins transformers<=5.19, specbench "
                    "5.24; set SPECBENCH_SPECULATORS_PATH to a --no-deps install); the export is checked against the "
                    "fields vLLM and speculators read instead")
    code = (
        "import json\n"
        "from safetensors.torch import load_file\n"
        "from speculators import SpeculatorModelConfig\n"
        "from speculators.models.eagle3 import Eagle3DraftModel\n"
        f"c = SpeculatorModelConfig.from_pretrained({str(exported)!r})\n"
        "sd = Eagle3DraftModel(c).state_dict()\n"
        f"w = load_file({str(exported / 'model.safetensors')!r})\n"
        "print(json.dumps({'verifier': c.speculators_config.verifier.name_or_path, 'draft': c.draft_vocab_size,"
        " 'target': c.transformer_layer_config.vocab_size, 'type': c.speculators_model_type,"
        " 'taps': c.eagle_aux_hidden_state_layer_ids, 'missing': sorted(set(sd) - set(w)),"
        " 'unexpected': sorted(set(w) - set(sd)),"
        " 'shapes': all(tuple(sd[k].shape) == tuple(v.shape) for k, v in w.items() if k in sd)}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0 and "No module named 'speculators'" in proc.stderr:
        pytest.skip(f"speculators does not import from SPECBENCH_SPECULATORS_PATH={extra}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"verifier": "HuggingFaceTB/SmolLM2-135M-Instruct", "draft": 4096, "target": 49152, "type": "eagle3",
                   "taps": [2, 15, 27], "unexpected": [], "shapes": True,
                   # filled from the verifier when served (speculators' converter without a drafter embedding)
                   "missing": ["embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"]}


def test_verifier_option(tmp_path):
    model = tmp_path / "my-target"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    out = tmp_path / "o"
    assert invoke("export", SHIPPED, out, "--verifier", model).exit_code == 0
    verifier = json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": str(model.absolute()), "architectures": ["LlamaForCausalLM"]}


@pytest.mark.parametrize("args, words", [
    ([DFLASH, "{tmp}/d"], "is a block drafter (the DFlash layout"),
    ([SHIPPED, "{tmp}/x", "--format", "onnx"], "unknown --format"),
    (["{tmp}", "{tmp}/y"], "has no config.json"),
    ([SHIPPED, "{tmp}/full"], "not an empty folder"),
    ([SHIPPED, "{tmp}/t", "--verifier", "tiny-llama"], "built in code"),
    ([SHIPPED, "{tmp}/k", "--tokens", "0"], "--tokens must be at least 1"),
])
def test_refusals_are_one_line(tmp_path, args, words):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "a").write_text("x")
    line = one_error_line(invoke("export", *[str(a).format(tmp=tmp_path) for a in args]))
    assert words in line, line
