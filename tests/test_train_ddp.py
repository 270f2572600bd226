"""Data-parallel `specbench train` under torchrun: 2 CPU processes (gloo) take the same steps as one
process with the same global batches and shards (the loss trajectory, gradient norms, held-out
metrics and the saved weights agree within float tolerance); shards split a batch exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from specbench.cli import app
from specbench.train.features import FeatureCache
from specbench.train.trainer import TokenizedSet, split_shards

ARGS = ["train", "--drafter", "eagle3", "--target", "tiny-llama", "--data", "mbpp-train", "--budget-tokens", "1200",
        "--heldout-tokens", "200", "--no-regenerate", "--set", "epochs=1", "--set", "batch_tokens=512",
        "--set", "draft_vocab_size=64", "--set", "ttt_steps=3", "--set", "eval_every=3", "--device", "cpu"]


def test_split_shards_covers_the_batch_once():
    data = TokenizedSet([[1] * n for n in (5, 9, 2, 7, 3)], [[1] * 2, [1] * 9, [0, 1], [0] * 7, [1] * 3],
                        FeatureCache.__new__(FeatureCache))
    seqs = [4, 0, 3, 1, 2]
    parts = split_shards(data, seqs, 2)
    assert sorted(s for g, _ in parts for s in g) == sorted(seqs)
    assert all(g == [s for s in seqs if s in g] for g, _ in parts)  # each shard keeps the batch's order
    assert parts[0][0] == [0, 1, 2] and parts[1][0] == [4, 3]  # dealt longest first: seqs 1, 3, 0, 4, 2
    assert [w for _, w in parts] == pytest.approx([12 / 15, 3 / 15])  # loss-token shares
    assert split_shards(data, seqs, 1) == [(seqs, 1.0)]
    assert split_shards(data, [2], 3)[1:] == [([], 0.0), ([], 0.0)]


def log_of(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_torchrun_two_processes_take_the_steps_of_one(tmp_path, monkeypatch, wide_console):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache-one"))
    one, two = tmp_path / "one", tmp_path / "two"
    res = CliRunner().invoke(app, [*ARGS, "--set", "shards=2", "--out", str(one)])
    assert res.exit_code == 0, res.output

    env = {**os.environ, "OMP_NUM_THREADS": "1", "SPECBENCH_CACHE": str(tmp_path / "cache-two")}  # rank 0 builds its own
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "specbench", *ARGS, "--out", str(two)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("checkpoint: ") == 1  # rank 0 alone prints

    a, b = json.loads((one / "training.json").read_text()), json.loads((two / "training.json").read_text())
    assert a["job"]["recipe"]["shards"] == b["job"]["recipe"]["shards"] == 2  # torchrun's default: one per process
    assert b["hardware"]["processes"] == 2 and a["hardware"]["processes"] == 1
    assert a["steps"] == b["steps"] >= 4 and a["tokens_seen"] == b["tokens_seen"]
    la, lb = log_of(one), log_of(two)
    assert [r["step"] for r in la] == [r["step"] for r in lb] == list(range(1, a["steps"] + 1))  # one log, rank 0's
    for ra, rb in zip(la, lb):
        for key in ra:
            if key.startswith(("train/", "heldout/")) or key in ("lr", "tokens_seen"):
                assert rb[key] == pytest.approx(ra[key], rel=1e-4, abs=1e-6), (ra["step"], key)
    assert any("heldout/acc_0" in r for r in la[:-1])  # held-out evaluated mid-run, spread over the ranks
    assert la[-1]["train/loss"] < la[0]["train/loss"]  # it trained
    for key, value in a["heldout"].items():
        assert b["heldout"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    wa, wb = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    assert set(wa) == set(wb)
    for key in wa:
        torch.testing.assert_close(wb[key].float(), wa[key].float(), rtol=1e-2, atol=1e-3)  # fp16 files


def test_shards_must_spread_over_the_processes(tmp_path, monkeypatch, wide_console):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    res = CliRunner().invoke(app, [*ARGS, "--set", "shards=3", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "shards=3 cannot be spread over 2 processes" in res.output
    res = CliRunner().invoke(app, [*ARGS[:-2], "--device", "cuda:1", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "puts every process on one GPU" in res.output
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two processes, one GPU: NCCL cannot pair them
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    res = CliRunner().invoke(app, [*ARGS[:-2], "--device", "auto", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "2 processes on this node but 1 GPU(s)" in res.output
