"""The training pipeline: TTT unroll against the inference path, feature cache, regeneration cache,
trainer (loss goes down, resume equals an uninterrupted run), a trained head stays lossless, and
`specbench train` end to end with its errors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from drafters.ar import ARDrafter
from drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafters.eagle3.checkpoint import load_eagle3
from drafters.eagle3.model import random_head
from drafters.eagle3.train import Eagle3Recipe, Eagle3Training, draft_vocabulary, reference_unroll, ttt_unroll
from specbench.cli import app
from specbench.decode import generate
from specbench.drafter import Sampling
from specbench.errors import UserError
from specbench.targets import load_target
from specbench.tasks import load_task, render_chat
from specbench.train.features import FeatureCache, build_feature_cache
from specbench.train.regenerate import RegenCache, RegenConfig, cache_path, regenerate, target_digest
from specbench.train.trainer import STATE_FILE, TokenizedSet, collate, evaluate, plan_batches, train

TARGETS = ["tiny-llama", "tiny-qwen3"]


@pytest.fixture(scope="module")
def targets():
    return {name: load_target(name, device="cpu", dtype="float32") for name in TARGETS}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))


# --------------------------------------------------------------------------- the TTT unroll


@pytest.mark.parametrize("name", TARGETS)
def test_ttt_unroll_equals_inference_path(targets, name):
    """Every (row, step) output of the batched unroll equals the drafter's own KV-cached chain."""
    target = targets[name]
    head = random_head(target, draft_vocab_size=64, seed=1, std=0.2)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.vocab_size, (2, 11), generator=g)
    feats = torch.randn(2, 11, 3 * target.hidden_size, generator=g)
    embed = target.model.get_input_embeddings().weight.detach()
    with torch.no_grad():
        fast = ttt_unroll(head, embed, tokens, feats, steps=5)
    for b in range(2):
        slow = reference_unroll(head, embed, tokens[b], feats[b], steps=5)
        for i in range(5):
            torch.testing.assert_close(fast[i][b], slow[i], atol=2e-4, rtol=1e-4, msg=f"seq {b} step {i}")


def test_ttt_sees_no_future_features_or_tokens(targets):
    """Row j at step i reads features 0..j and tokens up to x[j+1+i], nothing later (no leak)."""
    target = targets["tiny-llama"]
    head = random_head(target, seed=2, std=0.2)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, target.vocab_size, (1, 12), generator=g)
    feats = torch.randn(1, 12, 3 * target.hidden_size, generator=g)
    embed = target.model.get_input_embeddings().weight.detach()
    steps, m = 4, 6
    with torch.no_grad():
        base = ttt_unroll(head, embed, tokens, feats, steps)
        f2 = feats.clone()
        f2[0, m] += 1.0
        moved_f = ttt_unroll(head, embed, tokens, f2, steps)
        t2 = tokens.clone()
        t2[0, m] = (t2[0, m] + 1) % target.vocab_size
        moved_t = ttt_unroll(head, embed, t2, feats, steps)
    for i in range(steps):
        changed_f = (moved_f[i][0] - base[i][0]).abs().amax(-1) > 1e-6  # [R]
        changed_t = (moved_t[i][0] - base[i][0]).abs().amax(-1) > 1e-6
        rows = torch.arange(changed_f.numel())
        assert torch.equal(changed_f, rows >= m), f"step {i}: features of position {m} reach rows {rows[changed_f].tolist()}"
        # token x[m] is read by row j at step i iff m <= j + 1 + i (through step 0 when m <= j + 1)
        assert torch.equal(changed_t, rows + 1 + i >= m), f"step {i}: token {m} reaches rows {rows[changed_t].tolist()}"


def test_draft_vocabulary_most_frequent_sorted():
    ids = [[5, 5, 5, 7, 7, 9, 1], [7, 3, 3]]
    mask = [[1, 1, 1, 1, 1, 1, 0], [1, 1, 1]]  # token 1 is not an assistant token
    assert draft_vocabulary(ids, mask, 3, 20).tolist() == [3, 5, 7]
    assert draft_vocabulary(ids, mask, 6, 20).tolist() == [0, 1, 3, 5, 7, 9]  # padded with the lowest unused ids


# --------------------------------------------------------------------------- data for the trainer


def prompts_of(target, n: int, length: int = 40) -> list[torch.Tensor]:
    tok = target.tokenizer
    texts = [p.turns[0][:length] for p in load_task("humaneval")[:n // 2]] + [p.turns[0][:length] for p in load_task("gsm8k")[: n - n // 2]]
    return [torch.tensor(render_chat(tok, [{"role": "user", "content": t}])) for t in texts]


def self_distilled(target, n: int, max_new: int = 24) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt + the target's greedy answer) sequences with the loss on the answer."""
    ids, masks = [], []
    for prompt in prompts_of(target, n):
        out = generate(target, ARDrafter(target), prompt, max_new, Sampling()).output_ids
        ids.append(prompt.tolist() + out)
        masks.append([0] * prompt.numel() + [1] * len(out))
    return ids, masks


def tokenized_set(target, training, ids, masks, where: Path) -> TokenizedSet:
    cache = build_feature_cache(target, ids, training.cache_layers, where, target_digest=target_digest(target),
                                data_fingerprint=str(hash(json.dumps(ids))), batch_tokens=256)
    return TokenizedSet(ids, masks, cache)


TINY_RECIPE = dict(draft_vocab_size=96, batch_tokens=256, lr=3e-3, epochs=4, eval_every=1000, save_every=5, ttt_steps=4)


# --------------------------------------------------------------------------- feature cache


def test_feature_cache_matches_target_and_resumes(targets, tmp_path):
    target = targets["tiny-llama"]
    ids = [[1, 5, 9, 33, 2], [4, 4, 8], [7, 3, 3, 3, 3, 3, 9], [6, 2]]
    layers = (3, 0, 2)

    class Stop(Exception):
        pass

    calls = []

    def interrupt(done, total):
        calls.append(done)
        if len(calls) == 2:  # after the first batch is written
            raise Stop

    digest = target_digest(target)
    with pytest.raises(Stop):
        build_feature_cache(target, ids, layers, tmp_path, target_digest=digest, data_fingerprint="d", batch_tokens=8,
                            progress=interrupt)
    assert not list(tmp_path.glob("*/meta.json"))  # unfinished
    done_before = np.load(next(tmp_path.glob("*/done.npy")))
    assert 0 < done_before.sum() < len(ids)
    cache = build_feature_cache(target, ids, layers, tmp_path, target_digest=digest, data_fingerprint="d", batch_tokens=8)
    assert cache.layers == (0, 2, 3) and cache.hidden.dtype == np.float16 and isinstance(cache.hidden, np.memmap)
    for s, seq in enumerate(ids):
        with torch.no_grad():
            out = target.model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        want = torch.stack([out.hidden_states[i][0] for i in (0, 2, 3)], dim=1)  # [T, 3, H]
        got = torch.from_numpy(np.asarray(cache.hidden[cache.rows(s)], dtype=np.float32))
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
        assert np.array_equal(cache.argmax[cache.rows(s)], out.logits[0].argmax(-1).numpy())
    # the same layers in another order share the cache; another layer set gets its own
    again = build_feature_cache(target, ids, (2, 3, 0), tmp_path, target_digest=digest, data_fingerprint="d")
    assert again.path == cache.path
    other = build_feature_cache(target, ids, (1,), tmp_path, target_digest=digest, data_fingerprint="d")
    assert other.path != cache.path and FeatureCache.open(other.path).layers == (1,)


def reference_states(target, seq: list[int], layers) -> torch.Tensor:
    with torch.no_grad():
        out = target.model(input_ids=torch.tensor([seq]), output_hidden_states=True)
    return torch.stack([out.hidden_states[i][0] for i in layers], dim=1)  # [T, n_layers, H] float32


def test_feature_cache_guards_the_fp16_range(tmp_path):
    """Tapped states beyond float16's range (synthetic outliers in a tiny target) are cached in
    bfloat16, never as inf: from the first batch (a scaled MLP) or part-way (one token's scaled
    embedding row, met in the last batch: the rows written in float16 are converted). A target whose
    states are not finite, and a cache holding a non-finite value, are refused in one line."""
    ids = [[5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15, 16], [17, 18, 19, 20, 21, 99]]  # 99 only in the longest
    layers = (0, 2, 3)
    scaled_mlp = load_target("tiny-llama", device="cpu", dtype="float32")
    scaled_row = load_target("tiny-llama", device="cpu", dtype="float32")
    with torch.no_grad():
        scaled_mlp.model.model.layers[1].mlp.down_proj.weight.mul_(1e6)
        scaled_row.model.get_input_embeddings().weight[99].mul_(1e7)
    for name, target in (("mlp", scaled_mlp), ("row", scaled_row)):
        want = [reference_states(target, seq, layers) for seq in ids]
        assert torch.isinf(torch.cat(want).half()).any() and torch.isfinite(torch.cat(want)).all()  # fp16 would overflow
        if name == "row":
            assert all(torch.isfinite(w.half()).all() for w in want[:-1])  # only the last batch overflows
        cache = build_feature_cache(target, ids, layers, tmp_path / name, target_digest=name, data_fingerprint="d",
                                    batch_tokens=8)
        assert cache.dtype == "bfloat16" and cache.hidden.dtype == np.uint16
        assert json.loads((cache.path / "meta.json").read_text())["dtype"] == "bfloat16"
        for s, w in enumerate(want):
            got = torch.from_numpy(cache.states(cache.rows(s)))
            torch.testing.assert_close(got, w, rtol=8e-3, atol=1e-4)  # bfloat16's precision, no inf
        training = Eagle3Training(target, Eagle3Recipe(**TINY_RECIPE), ids, [[1] * len(x) for x in ids])
        batch = collate(TokenizedSet(ids, [[1] * len(x) for x in ids], cache), [3])
        assert torch.isfinite(batch.hidden).all() and batch.hidden.abs().max() > 65504 and training.cache_layers

    # states in range stay float16
    plain = load_target("tiny-llama", device="cpu", dtype="float32")
    assert build_feature_cache(plain, ids, layers, tmp_path / "plain", target_digest="p", data_fingerprint="d").dtype == "float16"
    # a target that is not finite: one line
    with torch.no_grad():
        plain.model.get_input_embeddings().weight[13].fill_(float("nan"))
    with pytest.raises(UserError, match="non-finite hidden states") as info:
        build_feature_cache(plain, ids, layers, tmp_path / "nan", target_digest="n", data_fingerprint="d")
    assert "\n" not in str(info.value)
    # a float16 cache holding inf (written before the guard) is refused when read
    old = FeatureCache.open(next((tmp_path / "plain").iterdir()))
    raw = np.load(old.path / "hidden.npy", mmap_mode="r+")
    raw[0, 0, 0] = np.inf
    raw.flush()
    del raw
    with pytest.raises(UserError, match="non-finite states"):
        FeatureCache.open(old.path).states(slice(0, 2))


# --------------------------------------------------------------------------- trainer


def test_plan_batches_deterministic_and_complete():
    lengths = [5, 90, 33, 12, 61, 7, 7, 100, 3] * 20
    a = plan_batches(lengths, 200, seed=1, epoch=0)
    assert a == plan_batches(lengths, 200, seed=1, epoch=0)
    assert a != plan_batches(lengths, 200, seed=1, epoch=1)
    assert sorted(s for b in a for s in b) == list(range(len(lengths)))
    assert all(len(b) == 1 or max(lengths[s] for s in b) * len(b) <= 200 for b in a)


def test_training_lowers_loss_and_resume_is_exact(targets, tmp_path):
    target = targets["tiny-llama"]
    ids, masks = self_distilled(target, 8)
    recipe = Eagle3Recipe(**{**TINY_RECIPE, "epochs": 8})
    training = Eagle3Training(target, recipe, ids, masks)
    data = tokenized_set(target, training, ids, masks, tmp_path / "features")
    before = evaluate(training, data)
    whole = train(training, data, data, tmp_path / "whole", "k")
    after = evaluate(training, data)
    assert whole.steps == sum(len(plan_batches([len(x) for x in ids], 256, 0, e)) for e in range(8))
    # soft CE against a random tiny target is bounded below by its (high, ~4 nats) entropy
    assert after["loss_0"] < before["loss_0"] - 0.3, (before, after)
    assert after["acc_0"] > before["acc_0"] + 0.15, (before, after)
    log = [json.loads(line) for line in (tmp_path / "whole" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, whole.steps + 1))

    # the same run stopped after 3 steps and resumed gives the same weights bit for bit
    resumed = Eagle3Training(target, recipe, ids, masks)
    part = train(resumed, data, data, tmp_path / "resumed", "k", stop_after=3)
    assert part.steps == 3
    checkpointed = torch.load(tmp_path / "resumed" / STATE_FILE, weights_only=False)["seconds"]
    fresh = Eagle3Training(target, recipe, ids, masks)  # a new process would start from scratch weights
    rest = train(fresh, data, data, tmp_path / "resumed", "k")
    assert rest.resumed_from == 3 and rest.steps == whole.steps
    # training time adds up over the calls: the first call's checkpointed steps (its time up to the
    # checkpoint, not the held-out evaluation after it) count in the second call's total
    assert part.seconds_all_calls == part.seconds and 0 < checkpointed <= part.seconds
    assert rest.seconds_all_calls == pytest.approx(checkpointed + rest.seconds, rel=1e-12)
    for (k, v), (k2, v2) in zip(training.module.state_dict().items(), fresh.module.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    # another recipe in the same directory is refused
    from specbench.errors import UserError

    other = Eagle3Training(target, Eagle3Recipe(**{**TINY_RECIPE, "lr": 1e-3}), ids, masks)
    with pytest.raises(UserError, match="another recipe or data"):
        train(other, data, data, tmp_path / "resumed", "k")


def test_bf16_training_keeps_the_gradient_and_float32_weights(targets, tmp_path):
    """precision=bf16 runs the TTT unroll and the head's lm_head under bfloat16 autocast: the same
    float32 weights get nearly the fp32 gradient and the loss stays float32; a wrong precision is refused."""
    target = targets["tiny-llama"]
    ids, masks = self_distilled(target, 4)
    results = {}
    for precision in ("fp32", "bf16"):
        training = Eagle3Training(target, Eagle3Recipe(**TINY_RECIPE, precision=precision), ids, masks)
        data = tokenized_set(target, training, ids, masks, tmp_path / "features")
        batch = collate(data, list(range(len(ids))))
        training.module.train()
        loss, metrics = training.loss(batch)
        assert loss.dtype == torch.float32
        loss.backward()
        g = [p.grad for p in training.module.parameters() if p.grad is not None]
        assert g and all(x.dtype == torch.float32 and torch.isfinite(x).all() for x in g)
        assert all(p.dtype == torch.float32 for p in training.module.parameters())
        results[precision] = (float(loss.detach()), torch.cat([x.flatten() for x in g]).double())
    (v32, g32), (v16, g16) = results["fp32"], results["bf16"]
    assert v16 == pytest.approx(v32, rel=2e-2)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) > 0.99
    assert not torch.equal(g16, g32)  # the bfloat16 path really ran
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        Eagle3Recipe(precision="fp16")


@pytest.mark.parametrize("name", TARGETS)
def test_briefly_trained_head_is_lossless_and_accepts(targets, tmp_path, name):
    target = targets[name]
    ids, masks = self_distilled(target, 8)
    training = Eagle3Training(target, Eagle3Recipe(**{**TINY_RECIPE, "epochs": 20}), ids, masks)
    data = tokenized_set(target, training, ids, masks, tmp_path / "features")
    train(training, data, data, tmp_path / "run", "k")
    training.save(tmp_path / "head")
    head = load_eagle3(tmp_path / "head", target)
    assert head.lm_head.weight.shape[0] == 96
    torch.testing.assert_close(head.d2t, training.module.d2t)
    drafter = Eagle3Drafter(target, Eagle3Config(path=str(tmp_path / "head"), depth=4, top_k=4, total_tokens=16))
    accepted = []
    for prompt, seq in zip(prompts_of(target, 8), ids):
        ref = seq[prompt.numel():]
        gen = generate(target, drafter, prompt, 24, Sampling())
        assert gen.output_ids == ref
        accepted += [s.accepted for s in gen.steps]
    # trained on exactly these continuations: most steps accept drafts (a random head accepts ~none)
    assert np.mean(accepted) > 1.0, accepted


# --------------------------------------------------------------------------- regeneration


def test_regenerate_is_cached_resumable_and_extends(targets, tmp_path):
    from datasets import Dataset

    from specbench.train.data import conversation_features

    target = targets["tiny-llama"]
    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"question {i} " * 3},
                                         {"role": "assistant", "content": "old answer"}]} for i in range(12)]
    ds = Dataset.from_list(rows, features=conversation_features())
    cfg = RegenConfig(max_new_tokens=6, batch_size=4)
    small, st = regenerate(ds, target, tmp_path, budget_tokens=15, max_length=256, cfg=cfg)
    assert st.n_generated > 0 and st.loss_tokens >= 15 and st.new_tokens > 0
    assert all(r["messages"][-1]["content"] != "old answer" for r in small)
    again, st2 = regenerate(ds, target, tmp_path, budget_tokens=15, max_length=256, cfg=cfg)
    assert st2.n_generated == 0 and again.to_list() == small.to_list()
    # a torn last line (an interrupt mid-write) is ignored, and that answer is generated again
    path = cache_path(tmp_path, target, cfg)
    path.write_text(path.read_text() + '{"id": "c1", "answ')
    assert len(RegenCache(path).rows) == st.n_generated
    bigger, st3 = regenerate(ds, target, tmp_path, budget_tokens=40, max_length=256, cfg=cfg)
    assert bigger.to_list()[: len(small)] == small.to_list()  # a larger budget extends a smaller one
    assert st3.n_generated <= len(bigger) - len(small) + 1 + cfg.batch_size
    assert len(RegenCache(path).rows) == st.n_generated + st3.n_generated  # the torn row was answered again


# --------------------------------------------------------------------------- the command


def cli(*args):
    return CliRunner().invoke(app, ["train", *args])


TINY_CLI = ["--target", "tiny-llama", "--data", "mbpp-train", "--budget-tokens", "1200", "--heldout-tokens", "200", "--no-regenerate",
            "--set", "epochs=1", "--set", "batch_tokens=512", "--set", "draft_vocab_size=64", "--set", "ttt_steps=3"]


def test_cli_train_end_to_end_and_rerun(targets, tmp_path, wide_console):
    out = tmp_path / "head"
    res = cli(*TINY_CLI, "--out", str(out))
    assert res.exit_code == 0, res.output
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    card = (out / "TRAINING.md").read_text()
    assert "## Command" in card and "| 1 |" in card and "mbpp-train" in card
    summary = json.loads((out / "training.json").read_text())
    assert summary["finished"] and summary["train_loss_tokens"] >= 1200 and summary["steps"] > 0
    assert set(summary["heldout"]) >= {"acc_0", "acc_1", "acc_2", "loss_0", "in_vocab"}
    assert 0.0 <= summary["heldout"]["in_vocab"] < 1.0  # 64 draft ids cannot cover a random target's greedy tokens
    assert "The draft vocabulary holds the target's greedy token at" in card
    assert "threads, float32 target, training precision fp32, torch" in card  # the target's dtype and the recipe's arithmetic
    # no path of this machine in what ships: --out as the folder's name, caches as $SPECBENCH_CACHE/...
    from specbench.fetch import cache_root

    for text in (card, (out / "training.json").read_text()):
        assert str(tmp_path) not in text and str(cache_root()) not in text and str(Path.home()) not in text
    assert all(v.startswith("$SPECBENCH_CACHE/features/") for v in summary["feature_cache"].values())
    head = load_eagle3(out, targets["tiny-llama"])
    assert next(head.parameters()).dtype == torch.float32  # saved in fp16, loaded in the target's dtype
    # the card names its weights by the sha256 a benchmark row records for them
    from specbench.drafter import drafter_class, parse_config

    cls = drafter_class("eagle3")
    drafter = cls(targets["tiny-llama"], parse_config(cls.Config, [f"path={out}"]))
    assert summary["checkpoint_sha256"] == drafter.checkpoint.sha256
    assert summary["seconds"]["train_all_calls"] > 0 and "Training alone took" in card
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("fc.weight").dtype == torch.float16
    assert_snapshot_is_the_checkpoint(out, tmp_path / "snap", targets["tiny-llama"])
    # rerunning the finished command resumes at the end: nothing more is trained
    res = cli(*TINY_CLI, "--out", str(out))
    assert res.exit_code == 0, res.output
    again = json.loads((out / "training.json").read_text())
    assert again["resumed_from_step"] == summary["steps"] == again["steps"]
    # so does a rerun that only checkpoints more often (bookkeeping, not what is trained)
    res = cli(*TINY_CLI, "--set", "save_every=3", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert json.loads((out / "training.json").read_text())["resumed_from_step"] == summary["steps"]
    # other settings in the same directory: one line, exit 2
    res = cli(*[a if a != "1200" else "1500" for a in TINY_CLI], "--out", str(out))
    assert res.exit_code == 2 and "other settings (budget_tokens)" in res.output and "Traceback" not in res.output


def assert_snapshot_is_the_checkpoint(run: Path, dest: Path, target) -> None:
    """``pipeline.snapshot`` of a finished run (its last state is the final step) writes the very tensors
    the run shipped, vocabulary maps included (its placeholder data would give other maps)."""
    from safetensors.torch import load_file

    from specbench.errors import UserError
    from specbench.train.pipeline import snapshot

    record = snapshot(run, dest, lambda name: target)
    assert record["step"] == json.loads((run / "training.json").read_text())["steps"]
    shipped, snap = load_file(run / "model.safetensors"), load_file(dest / "model.safetensors")
    assert shipped.keys() == snap.keys() and all(torch.equal(shipped[k], snap[k]) for k in shipped)
    assert json.loads((dest / "config.json").read_text()) == json.loads((run / "config.json").read_text())
    with pytest.raises(UserError, match="no readable training.json"):
        snapshot(dest, dest / "again", lambda name: target)


def test_an_unfinished_run_passed_as_a_checkpoint_points_to_snapshot_head(tmp_path, wide_console):
    """A training folder that has only its resumable state is not a checkpoint yet: one line saying how to get one."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.pt").write_bytes(b"state")
    res = CliRunner().invoke(app, ["run", "--drafter", "eagle3", "--set", f"path={run}", "--target", "tiny-llama",
                                   "--task", "humaneval", "--limit", "1", "--out", str(tmp_path / "r.parquet")])
    assert res.exit_code == 2 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert "is a training run that has not finished" in res.output
    assert f"python scripts/snapshot-head {run} DEST" in res.output
    (run / "trainer_state.pt").unlink()  # an empty folder: the plain message
    res = CliRunner().invoke(app, ["run", "--drafter", "eagle3", "--set", f"path={run}", "--target", "tiny-llama",
                                   "--task", "humaneval", "--limit", "1", "--out", str(tmp_path / "r.parquet")])
    assert res.exit_code == 2 and "has no config.json" in res.output and "snapshot-head" not in res.output


def test_bf16_on_a_cpu_that_emulates_it_is_warned_about(monkeypatch, tmp_path, wide_console):
    """precision=bf16 on a CPU without native bfloat16 trains several times slower than fp32 (11.4x for a JetSpec
    step on an AVX2 EPYC): `train` measures a matmul in both and says so before the run starts."""
    from drafters.common import precision
    from specbench.errors import UserError
    from specbench.train import pipeline

    ratio = precision.bf16_matmul_ratio(repeats=1)
    assert math.isfinite(ratio) and ratio > 0
    monkeypatch.setattr(precision, "bf16_matmul_ratio", lambda repeats=3: 6.0)
    note = precision.slow_bf16_note("bf16", "cpu")
    assert "6.0x a float32 one" in note and "--set precision=fp32" in note
    assert precision.slow_bf16_note("bf16-head", torch.device("cpu")) is not None
    monkeypatch.setattr(precision, "bf16_matmul_ratio", lambda repeats=3: 0.3)  # native bfloat16: it pays
    assert precision.slow_bf16_note("bf16", "cpu") is None

    def unmeasured(repeats=3):
        raise AssertionError("measured where nothing asks for bfloat16 on a CPU")
    monkeypatch.setattr(precision, "bf16_matmul_ratio", unmeasured)
    assert precision.slow_bf16_note("fp32", "cpu") is None and precision.slow_bf16_note("bf16", "cuda") is None

    def stop(*a, **k):
        raise UserError("stopped before training")
    monkeypatch.setattr(pipeline, "run_training", stop)
    monkeypatch.setattr(precision, "bf16_matmul_ratio", lambda repeats=3: 6.0)
    res = cli(*TINY_CLI, "--set", "precision=bf16", "--device", "cpu", "--out", str(tmp_path / "head"))
    assert res.exit_code == 2 and "warning: precision=bf16: a bfloat16 matmul takes 6.0x" in res.output
    res = cli(*TINY_CLI, "--set", "precision=bf16", "--device", "gpu", "--out", str(tmp_path / "head"))
    assert res.exit_code == 2 and "invalid --device 'gpu'" in res.output and "Traceback" not in res.output
    monkeypatch.setattr(precision, "bf16_matmul_ratio", unmeasured)
    res = cli(*TINY_CLI, "--device", "cpu", "--out", str(tmp_path / "head"))  # fp32: no measurement, no warning
    assert res.exit_code == 2 and "warning" not in res.output and "stopped before training" in res.output


def test_a_folder_being_trained_is_refused_to_a_second_process(monkeypatch, tmp_path, wide_console):
    """Two `specbench train` on one --out (a resume rerun while the first still trains) would both write its
    checkpoints: the second is refused in one line naming the first's pid, before it loads anything; once the first
    has let go (as when its process ends), the same command goes on."""
    from specbench.errors import UserError
    from specbench.train import pipeline

    out = tmp_path / "head"
    reached = []

    def load_target(name, *args):
        reached.append(name)
        raise UserError("stopped at the target")
    monkeypatch.setattr("specbench.targets.load_target", load_target)
    with pipeline.exclusive_run(out):  # another open file description: flock refuses it even in this process
        res = cli(*TINY_CLI, "--device", "cpu", "--out", str(out))
        assert res.exit_code == 2 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
        assert f"--out '{out}' is being trained by another process (pid {os.getpid()})" in res.output
        assert reached == [] and not (out / "training.json").exists()
        with pytest.raises(UserError, match="being trained by another process"):
            with pipeline.exclusive_run(out):
                pass
    res = cli(*TINY_CLI, "--device", "cpu", "--out", str(out))
    assert res.exit_code == 2 and "stopped at the target" in res.output and reached == ["tiny-llama"]


def test_recorded_command_has_no_local_paths(monkeypatch, tmp_path):
    from specbench.train.pipeline import portable_command, portable_path

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    assert portable_command("specbench train --drafter dflash --set epochs=6 --out /work/runs/dflash") == \
        "specbench train --drafter dflash --set epochs=6 --out dflash"
    assert portable_command("specbench train --out=/a/b/head --data 'x y'") == "specbench train --out=head --data 'x y'"
    assert portable_command("specbench train --out heads/r200k") == "specbench train --out heads/r200k"  # relative: kept
    assert portable_path(tmp_path / "cache" / "features" / "k") == "$SPECBENCH_CACHE/features/k"
    assert portable_path(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")


@pytest.mark.parametrize("args,words", [
    (["--drafter", "ngram"], "has no training recipe"),
    (["--set", "nope=1"], "unknown --set key 'nope'"),
    (["--set", "lr=-1"], "invalid drafter options"),
    (["--data", "wikipedia"], "unknown training set 'wikipedia'"),
    (["--budget-tokens", "0"], "must be positive"),
])
def test_cli_train_user_errors(tmp_path, wide_console, args, words):
    res = cli("--target", "tiny-llama", "--out", str(tmp_path / "o"), *args)
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_cli_train_out_is_a_file(tmp_path, wide_console):
    f = tmp_path / "f"
    f.write_text("x")
    res = cli("--target", "tiny-llama", "--out", str(f))
    assert res.exit_code == 2 and "is a file" in res.output
    res = cli("--target", "tiny-llama", "--out", str(f / "head"))  # under a file: one line, no traceback
    assert res.exit_code == 2 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert "cannot write the checkpoint to folder" in res.output and "choose another --out" in res.output
    assert f.read_text() == "x"


def test_collate_pads_and_reads_cache(targets, tmp_path):
    target = targets["tiny-llama"]
    ids, masks = [[1, 2, 3], [4, 5, 6, 7, 8]], [[0, 1, 1], [0, 0, 1, 1, 1]]
    training = Eagle3Training(target, Eagle3Recipe(**TINY_RECIPE), ids, masks)
    data = tokenized_set(target, training, ids, masks, tmp_path)
    batch = collate(data, [0, 1])
    assert batch.tokens.shape == (2, 5) and batch.valid.sum() == 8 and batch.loss_mask.sum() == 5
    assert batch.hidden.shape == (2, 5, len(training.cache_layers), target.hidden_size)
    assert torch.equal(batch.hidden[0, 3:], torch.zeros_like(batch.hidden[0, 3:]))


def test_run_eagle3_without_a_head_for_the_target_is_one_line(tmp_path, wide_console):
    res = CliRunner().invoke(app, ["run", "--drafter", "eagle3", "--target", "tiny-llama", "--limit", "1",
                                   "--out", str(tmp_path / "r.parquet")])
    assert res.exit_code == 2, res.output
    assert "no trained eagle3 drafter ships for target 'tiny-llama'" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r.parquet").exists()


def test_shipped_smollm2_head_is_package_data():
    """The trained default head ships in the released layout, fp16, at most 16 MB, with its card."""
    from safetensors import safe_open

    from drafters.eagle3.drafter import shipped_head

    path = shipped_head("smollm2-135m")
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (49152, 576, 1)
    assert cfg["specbench"]["target_num_hidden_layers"] == 30
    assert (path / "model.safetensors").stat().st_size <= 16 * 2**20
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        dtypes = {k: f.get_tensor(k).dtype for k in f.keys()}
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert all(dt == torch.float16 for k, dt in dtypes.items() if k not in ("d2t", "t2d")), dtypes
    ids = torch.arange(d2t.numel()) + d2t
    assert int(t2d.sum()) == d2t.numel() == cfg["draft_vocab_size"] and bool(t2d[ids].all())
    card = (path / "TRAINING.md").read_text()
    assert "specbench train" in card and "## Final held-out metrics" in card


def test_default_heads_are_the_shared_budget_ones():
    """Issue 10: `--drafter <family>` on the default target loads the head that defaults.toml names, and every
    family's default was trained on the same (at least 200k) regenerated assistant tokens; a target
    without an entry falls back to `<family>-<target>`."""
    import tomllib

    from drafters.common.loading import default_checkpoint_name, shipped_checkpoint

    root = Path(__file__).parent.parent / "drafters" / "checkpoints"
    table = tomllib.loads((root / "defaults.toml").read_text())["smollm2-135m"]
    assert set(table) == {"eagle3", "dflash", "jetspec", "treeflash", "specblock"}
    budgets = set()
    for family, folder in table.items():
        path = shipped_checkpoint(family, "smollm2-135m")
        assert path.name == folder and (path / "config.json").is_file()
        info = json.loads((path / "training.json").read_text())
        assert info["regenerate"].get("train"), f"{folder} was not trained on the target's own answers"
        budgets.add((info["train_loss_tokens"], info["train_conversations"]))
    assert len(budgets) == 1 and next(iter(budgets))[0] >= 200_000, budgets
    assert default_checkpoint_name("eagle3", "tiny-llama") == "eagle3-tiny-llama"


def test_shipped_cards_hold_no_local_paths():
    """Issue 10: no path of the machine a head was trained on in its TRAINING.md or training.json."""
    import re

    root = Path(__file__).parent.parent / "drafters" / "checkpoints"
    files = sorted(root.glob("*/TRAINING.md")) + sorted(root.glob("*/training.json"))
    assert len(files) >= 10
    local = re.compile(r"(?<![\w$.])/(?:work|root|home|tmp|Users|mnt|data)/")
    for f in files:
        assert not local.search(f.read_text()), f"{f} names a local path"


def test_resume_key_ignores_only_bookkeeping():
    from specbench.train.trainer import _config_key, _same_run

    class Fake:  # the key reads only the recipe and the family's class name
        def __init__(self, recipe):
            self.recipe = recipe

    base = _config_key(Fake(Eagle3Recipe(**TINY_RECIPE)), "k", 1)
    checkpointed_often = _config_key(Fake(Eagle3Recipe(**{**TINY_RECIPE, "save_every": 7})), "k", 1)
    assert base != checkpointed_often and _same_run(base, checkpointed_often)
    assert not _same_run(base, _config_key(Fake(Eagle3Recipe(**{**TINY_RECIPE, "lr": 1e-3})), "k", 1))
    assert not _same_run(base, _config_key(Fake(Eagle3Recipe(**TINY_RECIPE)), "other data", 1))
    # a block run's chunk sizes group the same rows differently (memory, speed), so it resumes with others
    from drafters.block.train import BlockRecipe

    block = _config_key(Fake(BlockRecipe(anchor_chunk=128, logit_chunk=512)), "k", 1)
    assert _same_run(block, _config_key(Fake(BlockRecipe(anchor_chunk=64, logit_chunk=2048)), "k", 1))
    assert not _same_run(block, _config_key(Fake(BlockRecipe(anchor_chunk=64, block_size=8)), "k", 1))
