"""SpecBlock: training view == inference view, the released layout, the tree, the rank loss, adaptation.

(Greedy / sampled losslessness and the fitted-training check come from tests/test_conformance.py.)
"""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafters.specblock import SpecBlockDrafter, SpecBlockOptions
from drafters.specblock.checkpoint import read_specblock, save_specblock
from drafters.specblock.model import rank_labels, sdpa
from drafters.specblock.train import (
    SpecBlockRecipe, SpecBlockTraining, block_attention, block_mask, ordinal_smooth, unroll,
)
from specbench.decode import generate
from specbench.drafter import Sampling, drafter_class, parse_config
from specbench.errors import UserError
from specbench.targets import load_target
from specbench.train.pipeline import training_card
from specbench.train.trainer import Batch


@pytest.fixture(scope="module")
def target():
    return load_target("tiny-llama", device="cpu", dtype="float32")


def drafter(target, *opts: str) -> SpecBlockDrafter:
    return SpecBlockDrafter(target, parse_config(SpecBlockOptions, ["path=random", *opts]))


def features_of(target, seq: torch.Tensor, layers) -> torch.Tensor:
    with torch.no_grad():
        out = target.model(input_ids=seq[None], use_cache=False, output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # [T, 3H]


# --------------------------------------------------------------------------- training view == inference view


def test_unrolled_blocks_equal_the_drafters_cached_calls(target):
    """Block 1 and block 2 of the training unroll, all rows at once, equal the drafter's own calls: rows
    appended one at a time to the draft KV cache, and a block-2 leaf with the inference mask."""
    d = drafter(target, "seed=3")
    model = d.model
    k = model.config.slots
    seq = torch.tensor(target.tokenizer.encode("the cat sat on the mat. a dog ran"))[:14]
    feats = features_of(target, seq, d.feature_layers)
    m = 3
    b1, b2 = unroll(model, seq[None], feats[None], [m])
    t = seq.numel()
    for i in range(t - 1 - m):  # row i: token x_{i+1} at position i + 1
        committed = d.cache.length(0)
        own = torch.arange(k)[None, :] <= torch.arange(k)[:, None]
        mask = torch.cat([torch.ones(k, committed, dtype=torch.bool), own], dim=1)
        out = d._call(feats[i : i + 1], seq[i + 1 : i + 2], torch.tensor([i + 1]), mask, draft_condition=False)
        torch.testing.assert_close(out.logits[0, 0], b1.logits[0, i], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.rank_logits[0, 0], b1.rank_logits[0, i], atol=1e-4, rtol=1e-4)
        # a block-2 leaf from slot m - 1 of this row, fed x_{i+1+m}: sees rows < i, row i's slots < m, itself
        n = d.cache.length(0)
        root_vis = torch.arange(k) < m
        leaf_mask = torch.cat([torch.ones(k, n - k, dtype=torch.bool), root_vis.expand(k, k), own], dim=1)
        leaf = d._call(out.hidden[0, 0, m - 1 : m], seq[i + 1 + m : i + 2 + m], torch.tensor([i + 1]), leaf_mask, True)
        for layer in d.cache.layers:
            layer.crop(n)
        torch.testing.assert_close(leaf.logits[0, 0], b2.logits[0, i], atol=1e-4, rtol=1e-4)


def test_block_mask_by_hand():
    # 2 rows x 2 slots; block 2 after M = 1
    m1 = block_mask(2, 2, [], "cpu").int().tolist()
    assert m1 == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    m2 = block_mask(2, 2, [1], "cpu").int().tolist()
    # block-1 part: earlier rows' slots, own row's slots < 1 ; own part: own row, slots <= k
    assert m2 == [[1, 0, 0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 1, 1, 0, 0],
                  [1, 1, 1, 0, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("rows, k, ms, chunk, heads, kv_heads", [
    (7, 4, [], 3, 4, 2), (7, 4, [2], 3, 4, 2), (9, 4, [1, 3], 4, 4, 1), (5, 2, [2, 1], 128, 2, 2), (13, 4, [4, 4], 5, 6, 3),
])
def test_block_attention_equals_the_dense_masked_attention(rows, k, ms, chunk, heads, kv_heads):
    """The chunked training attention (block 1 causal, later blocks same-row only) gives the dense
    masked attention's output and gradients, for chunk sizes that do and do not divide the rows."""
    gen = torch.Generator().manual_seed(rows * 10 + len(ms))
    q = torch.randn(2, heads, rows * k, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    blocks = [tuple(torch.randn(2, kv_heads, rows * k, 8, dtype=torch.float64, generator=gen, requires_grad=True)
                    for _ in range(2)) for _ in range(len(ms) + 1)]
    leaves = [q] + [t for kv in blocks for t in kv]
    dense = sdpa(q, torch.cat([kk for kk, _ in blocks], 2), torch.cat([v for _, v in blocks], 2), block_mask(rows, k, ms, "cpu"))
    fast = block_attention(q, blocks, k, ms, chunk_rows=chunk)
    torch.testing.assert_close(fast, dense)
    w = torch.randn(dense.shape, dtype=torch.float64, generator=gen)
    for a, b in zip(torch.autograd.grad((fast * w).sum(), leaves), torch.autograd.grad((dense * w).sum(), leaves)):
        torch.testing.assert_close(a, b)


def test_rank_labels_and_ordinal_smoothing():
    logits = torch.arange(30.0).flip(0)[None].expand(5, -1)  # draft id j has rank j + 1
    assert rank_labels(logits, torch.tensor([0, 1, 3, 4, 12])).tolist() == [0, 1, 1, 2, 3]
    soft = ordinal_smooth(torch.tensor([1]))[0]
    raw = torch.tensor([1 / 3**2, 1.0, 1 / 2**2, 1 / 3**2])  # under-estimating (c < t) decays faster
    torch.testing.assert_close(soft, raw / raw.sum())


# --------------------------------------------------------------------------- the tree


def test_tree_respects_budget_and_makes_two_calls(target):
    d = drafter(target, "budget=20", "beam_width=3")
    prompt = torch.tensor(target.tokenizer.encode("abc abc abc abc abc"))
    gen = generate(target, d, prompt, 12, Sampling())
    assert all(s.tree_size <= 20 and s.drafter_forwards == 2 for s in gen.steps)
    assert max(s.tree_size for s in gen.steps) == 20  # the random model's tree fills the budget
    assert all(layer.length == d.n_rows * d.k_model for layer in d.cache.layers)  # block 2 rolled back


# --------------------------------------------------------------------------- the released layout


def upstream_checkpoint(path, target, draft_vocab: int = 40, k: int = 4, with_maps_in_weights: bool = True):
    """A checkpoint written the way upstream's save_pretrained does, with key names and shapes taken from
    SpecForge ``_llama3_specblock_base.py`` / ``llama3_specblock.py`` (not from specbench's model)."""
    tc = target.model.config
    h, inter, heads, kv = tc.hidden_size, tc.intermediate_size, tc.num_attention_heads, tc.num_key_value_heads
    hd = h // heads
    g = torch.Generator().manual_seed(0)
    w = lambda *shape: torch.randn(*shape, generator=g) * 0.05  # noqa: E731
    state = {
        "input_layer.condition_proj.weight": w(h, 3 * h), "input_layer.condition_norm.weight": torch.ones(h),
        "input_layer.token_norm.weight": torch.ones(h), "input_layer.position_queries.weight": w(k, h),
        "input_layer.query_norm.weight": torch.ones(h), "input_layer.fuse.weight": w(h, 3 * h),
        "norm.weight": torch.ones(h), "lm_head.weight": w(draft_vocab, h),
        "rank_head.0.weight": w(256, h + 15), "rank_head.2.weight": w(4, 256), "shift_proj.0.weight": w(h, 2 * h),
    }
    for layer in range(2):
        p = f"layers.{layer}."
        state |= {p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
                  p + "self_attn.q_proj.weight": w(heads * hd, h), p + "self_attn.k_proj.weight": w(kv * hd, h),
                  p + "self_attn.v_proj.weight": w(kv * hd, h), p + "self_attn.o_proj.weight": w(h, heads * hd),
                  p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
                  p + "mlp.down_proj.weight": w(h, inter)}
    ids = torch.randperm(tc.vocab_size, generator=g)[:draft_vocab].sort().values
    d2t = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(tc.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    if with_maps_in_weights:
        state |= {"d2t": d2t, "t2d": t2d}
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"))
    torch.save({"d2t": d2t, "t2d": t2d}, path / "vocab_mapping.pt")
    config = {"architectures": ["LlamaForCausalLMSpecBlockShift"], "model_type": "llama", "hidden_size": h,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
              "num_hidden_layers": 2, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "rope_scaling": None, "max_position_embeddings": 2048, "vocab_size": tc.vocab_size,
              "draft_vocab_size": draft_vocab, "tie_word_embeddings": False, "torch_dtype": "float32",
              "diffspec_draft_token_num": k, "rank_classes": 4, "num_ttt_blocks": 3}
    (path / "config.json").write_text(json.dumps(config))
    return state, ids


def test_upstream_layout_loads_and_saves_back(target, tmp_path):
    state, ids = upstream_checkpoint(tmp_path / "up", target)
    model, identity = read_specblock(tmp_path / "up", target)
    assert identity.sha256 and model.config.slots == 4 and model.config.draft_vocab_size == 40
    assert torch.equal(model.to_target_ids(torch.arange(40)), ids)
    assert torch.equal(model.input_layer.embed_tokens.weight, target.model.get_input_embeddings().weight)
    loaded = model.state_dict()
    for key, value in state.items():
        assert torch.equal(loaded[key].to(value.dtype), value), key
    save_specblock(model, tmp_path / "back")
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == ["config.json", "model.safetensors", "vocab_mapping.pt"]
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(back) == set(state) and not any("embed" in key for key in back)
    assert all(torch.equal(back[key], state[key].to(back[key].dtype)) for key in state)
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    for key in ("draft_vocab_size", "diffspec_draft_token_num", "rank_classes", "num_ttt_blocks", "target_hidden_size",
                "num_hidden_layers", "hidden_size", "vocab_size"):
        assert key in cfg, key
    maps = torch.load(tmp_path / "back" / "vocab_mapping.pt", weights_only=True)
    assert torch.equal(maps["d2t"], state["d2t"]) and torch.equal(maps["t2d"], state["t2d"])
    again, _ = read_specblock(tmp_path / "back", target)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
    # the drafter runs it, losslessly
    d = SpecBlockDrafter(target, parse_config(SpecBlockOptions, [f"path={tmp_path / 'back'}", "budget=12"]))
    prompt = torch.tensor(target.tokenizer.encode("the cat sat on the mat"))
    ar = drafter_class("ar")(target, None)
    assert generate(target, d, prompt, 10, Sampling()).output_ids == generate(target, ar, prompt, 10, Sampling()).output_ids


def test_maps_only_in_vocab_mapping_pt(target, tmp_path):
    _, ids = upstream_checkpoint(tmp_path / "up", target, with_maps_in_weights=False)
    model, _ = read_specblock(tmp_path / "up", target)
    assert torch.equal(model.to_target_ids(torch.arange(40)), ids)


class Evil:
    def __reduce__(self):
        return (print, ("unpickled!",))


# the hostile vocab_mapping.pt below is a plain pickle (protocol 4); torch's weights-only unpickler
# warns about the protocol before it refuses the file, which is what the test checks
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
def test_refusals_are_one_line(target, tmp_path):
    upstream_checkpoint(tmp_path / "up", target)
    other = load_target("tiny-qwen3", device="cpu", dtype="float32")
    cfg = json.loads((tmp_path / "up" / "config.json").read_text())
    (tmp_path / "up" / "config.json").write_text(json.dumps(dict(cfg, vocab_size=cfg["vocab_size"] + 1)))
    with pytest.raises(UserError, match="made for a different target") as err:
        read_specblock(tmp_path / "up", target)
    assert "\n" not in str(err.value)
    (tmp_path / "up" / "config.json").write_text(json.dumps(cfg))
    if other.hidden_size != target.hidden_size or other.vocab_size != target.vocab_size:
        with pytest.raises(UserError, match="different target"):
            read_specblock(tmp_path / "up", other)
    # vocab_mapping.pt must be plain tensors: a pickle that would run code is refused, not run
    with open(tmp_path / "up" / "vocab_mapping.pt", "wb") as fh:
        pickle.dump({"d2t": Evil(), "t2d": Evil()}, fh)
    with pytest.raises(UserError, match="vocab_mapping.pt"):
        read_specblock(tmp_path / "up", target)
    # a map that disagrees with the weights
    maps = {"d2t": torch.zeros(40, dtype=torch.long), "t2d": torch.zeros(cfg["vocab_size"], dtype=torch.bool)}
    maps["t2d"][:40] = True
    torch.save(maps, tmp_path / "up" / "vocab_mapping.pt")
    with pytest.raises(UserError, match="differs"):
        read_specblock(tmp_path / "up", target)


# --------------------------------------------------------------------------- training


def test_training_reports_per_slot_accuracy_and_rank_confusion(target):
    seqs = [torch.tensor(target.tokenizer.encode(t)) for t in ("the cat sat on the mat.", "abc abc abc abc abc abc")]
    ids = [s.tolist() for s in seqs]
    trainable = SpecBlockTraining(target, parse_config(SpecBlockRecipe, ["blocks=3"]), ids, [[1] * len(x) for x in ids])
    from test_conformance import greedy_batch

    batch: Batch = greedy_batch(target, seqs, trainable.cache_layers)
    assert trainable.cache_layers == (2, 3, 4) or len(trainable.cache_layers) <= 4  # EAGLE-3's taps + final
    from drafters.eagle3.train import Eagle3Training, Eagle3Recipe

    eagle = Eagle3Training(target, parse_config(Eagle3Recipe, []), ids, [[1] * len(x) for x in ids])
    assert trainable.cache_layers == eagle.cache_layers  # the same feature cache
    loss, metrics = trainable.loss(batch)
    loss.backward()
    assert {f"acc_{k}" for k in range(4)} <= set(metrics) and "chain_tau" in metrics and "rank_loss" in metrics
    assert {"b2_acc_0", "b3_acc_3", "b2_loss_1"} <= set(metrics) and not any(k.startswith("acc_b") for k in metrics)
    confusion = sum(metrics[f"rank_confusion_{t}_{p}"][0] for t in range(4) for p in range(4))
    assert confusion == metrics["rank_acc"][1] > 0
    card = training_card({"job": {"drafter": "specblock", "target": "tiny-llama", "data": ["x"], "holdout_fraction": 0.02,
                                  "budget_tokens": 1, "recipe": {"epochs": 1}, "regenerate": False},
                          "hardware": {}, "seconds": {"all_calls": 1, "features_this_call": 0, "train_this_call": 1,
                                                      "regenerate_this_call": 0},
                          "train_loss_tokens": 1, "train_conversations": 1, "train_tokens": 1, "heldout_loss_tokens": 1,
                          "heldout_conversations": 1, "steps": 1, "tokens_seen": 1,
                          "heldout": {k: v[0] / v[1] if v[1] else float("nan") for k, v in metrics.items()}})
    assert "| 4 |" in card and "Rank head confusion" in card and "| rank 1 |" in card
    assert trainable.module.rank_head[0].weight.grad is not None
    assert trainable.module.input_layer.embed_tokens.weight.grad is None  # the frozen target embedding


# --------------------------------------------------------------------------- online adaptation


@pytest.mark.parametrize("mode", ["always", "bandit"])
def test_adaptation_is_lossless_and_logged(target, mode):
    d = drafter(target, "budget=16", "beam_width=3", f"adapt={mode}", "adapt_every=2", "adapt_lr=0.05")
    ar = drafter_class("ar")(target, None)
    before = [p.detach().clone() for p in d.model.rank_head.parameters()]
    prompts = [torch.tensor(target.tokenizer.encode(t)) for t in
               ("the cat sat on the mat. the cat sat on", "abc abc abc abc abc", "one two three one two three")]
    log = []
    for prompt in prompts:  # one drafter over the run's prompts: the adapted state carries over
        out = generate(target, d, prompt, 16, Sampling()).output_ids
        assert out == generate(target, ar, prompt, 16, Sampling()).output_ids
        log += d.take_log()
    decisions = [r for r in log if r["event"] == "decision"]
    outcomes = [r for r in log if r["event"] == "outcome"]
    assert decisions and outcomes and {r["decision"] for r in outcomes} <= {r["decision"] for r in decisions}
    assert all({"arm", "cost_s", "tau_before", "step", "generation"} <= set(r) for r in decisions)
    assert {r["generation"] for r in decisions} != {0}  # decisions continue across prompts
    updated = [r for r in decisions if r["arm"] != "skip"]
    assert updated and all(r["cost_s"] > 0 for r in updated)
    if mode == "always":
        assert all(r["arm"] == "large" for r in decisions if r["buffer"])
    assert any(not torch.equal(a, b) for a, b in zip(before, d.model.rank_head.parameters()))
    assert d.take_log() == []


def test_adaptation_off_logs_nothing(target):
    assert drafter(target).take_log() is None


def test_run_stores_the_adaptation_log_in_the_results(tmp_path):
    """`specbench run` with adaptation: the drafter's decisions land in the rows' drafter_log, outputs equal ar's."""
    import pandas as pd
    from typer.testing import CliRunner

    from specbench import cli

    out = tmp_path / "sb.parquet"
    result = CliRunner().invoke(cli.app, [
        "run", "--target", "tiny-llama", "--drafter", "specblock", "--set", "path=random", "--set", "budget=12",
        "--set", "adapt=bandit", "--set", "adapt_every=2", "--task", "humaneval", "--limit", "2",
        "--max-new-tokens", "12", "--results-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(out)
    logs = [json.loads(x) for x in rows["drafter_log"]]
    decisions = [r for log in logs for r in log if r["event"] == "decision"]
    assert decisions and all("arm" in r and "tau_before" in r for r in decisions)
    base = pd.read_parquet(tmp_path / "sb.ar-baseline.parquet")
    assert [list(x) for x in rows.sort_values("prompt_id")["output_ids"]] == \
        [list(x) for x in base.sort_values("prompt_id")["output_ids"]]


def test_grow_by_hand():
    from drafters.specblock.tree import beam, grow
    from specbench.tree import TreeBuilder

    logp = torch.log_softmax(torch.tensor([[6.0, 5, 4, 3, 2, 1], [1, 6, 5, 4, 3, 2], [1, 2, 6, 5, 4, 3]]), dim=-1)
    ident = lambda ids: ids  # noqa: E731
    b = TreeBuilder(99)
    leaves = grow(b, 0, logp, [0, 1, 3], (2, 4, 6, 4), ident, slot0_topk=3)
    # chain 0 -> 1 -> 2, then alternatives: slot 0 two (ids 1, 2), slot 1 three (2, 3, 4), slot 2 three (3, 4, 5)
    assert b.tokens == [99, 0, 1, 2, 1, 2, 2, 3, 4, 3, 4, 5]
    assert b.parents == [-1, 0, 1, 2, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len(leaves) == 11 and {lf.slot for lf in leaves} == {0, 1, 2}  # every slot branched: no hitchhike
    assert abs(b.scores[3] - float(logp[0, 0] + logp[1, 1] + logp[2, 2])) < 1e-6
    # give-up at slot 1 with topk 0: branching stops there, and the chain end is not expanded
    b = TreeBuilder(99)
    leaves = grow(b, 0, logp, [0, 3, 0], (2, 4, 6, 0), ident, slot0_topk=2)
    assert len(b.tokens) == 1 + 3 + 1 and [lf.slot for lf in leaves] == [0, 0]
    # a confident chain (all rank 1) with slot 0 alone branching: the chain end hitchhikes
    b = TreeBuilder(99)
    leaves = grow(b, 0, logp, [0, 0, 0], (1, 4, 6, 4), ident, slot0_topk=2)
    assert [lf.slot for lf in leaves] == [0, 0, 2]
    assert [lf.node for lf in beam(leaves, 2)] == sorted((lf.node for lf in leaves), key=lambda n: -b.scores[n])[:2]


def test_bandit_updates_only_when_the_gain_beats_the_cost(target):
    from drafters.specblock.adapt import Adapter

    d = drafter(target, "adapt=bandit")
    a = Adapter(d.model, d.config)
    a.buffer.append((torch.zeros(d.model.config.hidden_size + 15), 0))
    a.step_times = [0.1] * 16
    assert a._choose(1.5)[0] == "small"  # untried arms first
    a.rewards = {"skip": [0.2, 0.0, 0.1], "small": [0.1, 0.1], "large": [0.6, 0.5]}
    a.costs = {"skip": [0.0], "small": [0.01], "large": [0.05]}
    arm, gain = a._choose(1.5)
    assert arm == "large" and gain > 0
    a.costs["large"] = [1e6]  # the same gain at a cost it cannot repay
    assert a._choose(1.5)[0] in ("skip", "small")
    a.rewards["small"] = [-0.5, -0.6]  # worse than skipping's drift
    assert a._choose(1.5) == ("skip", 0.0)


def test_shipped_smollm2_checkpoint_is_package_data_in_the_released_layout():
    """The SpecBlock head trained for the default target ships in upstream's layout (no embedding,
    d2t/t2d in the weights and in vocab_mapping.pt), fp16, under 25 MiB, with a card that has the
    held-out per-slot accuracy and the rank head's confusion matrix and no local paths."""
    from safetensors import safe_open

    from drafters.specblock.drafter import shipped

    path = shipped("smollm2-135m")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMSpecBlockShift"] and cfg["num_hidden_layers"] == 2
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["target_hidden_size"]) == (49152, 576, 576)
    assert (cfg["draft_vocab_size"], cfg["diffspec_draft_token_num"], cfg["rank_classes"], cfg["num_ttt_blocks"]) == (4096, 4, 4, 3)
    assert (path / "model.safetensors").stat().st_size <= 25 * 2**20  # 23.4 MiB: two layers, shift_proj, a 4,096-row head
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        floats = [f.get_tensor(k) for k in keys if k not in ("d2t", "t2d")]
        assert floats and all(t.dtype == torch.float16 for t in floats)
    assert not any("embed" in k for k in keys)
    assert {"d2t", "t2d", "norm.weight", "lm_head.weight", "rank_head.0.weight", "rank_head.2.weight"} <= keys
    assert all(k.split(".")[0] in ("input_layer", "layers", "shift_proj", "norm", "lm_head", "rank_head", "d2t", "t2d")
               for k in keys)
    maps = torch.load(path / "vocab_mapping.pt", weights_only=True)
    assert maps["d2t"].shape == (4096,) and maps["t2d"].shape == (49152,) and int(maps["t2d"].sum()) == 4096
    card = (path / "TRAINING.md").read_text()
    assert "specbench train --drafter specblock" in card and "## Final held-out metrics" in card
    assert "confusion" in card.lower() and "/work/" not in card and "/tmp/" not in card
