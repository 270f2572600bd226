"""Data-parallel `specbench run` under torchrun: 2 CPU processes (gloo) on tiny-llama give one parquet
with every prompt exactly once and the same rows as a single-process run (timings aside)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench import cli, distributed, runner

PROMPTS = [
    {"id": "a", "prompt": "List three colours."},
    {"id": "b", "turns": ["Name a prime.", "Now a bigger one."]},
    {"id": "c", "prompt": "1 2 3 4 5 6"},
    {"id": "d", "prompt": "Say hello in French."},
    {"id": "e", "prompt": "abc abc abc"},
]
TIMES = ["prefill_s", "decode_s", "draft_s", "verify_s", "other_s"]
# not compared: the timings, the load average sampled after each prompt, and the code's git sha (a shared checkout can move between the two runs)
NOT_COMPARED = [*TIMES, "specbench_sha", "load_1min"]


def args(task_file: Path, out: Path) -> list[str]:
    return ["run", "--target", "tiny-llama", "--task-file", str(task_file), "--drafter", "ngram", "--max-new-tokens", "8",
            "--no-warmup", "--results-dir", str(out.parent), "--out", str(out), "--limit", "0"]


def test_shards_cover_every_prompt_once(tmp_path):
    task_file = tmp_path / "p.jsonl"
    task_file.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    spec = runner.RunSpec(task=None, task_file=task_file)
    shards = [[p.id for p in runner.load_prompts(runner.RunSpec(task=None, task_file=task_file, shard=(r, 3)))] for r in range(3)]
    assert shards == [["a", "d"], ["b", "e"], ["c"]]
    assert sorted(sum(shards, [])) == [p.id for p in runner.load_prompts(spec)]
    world = distributed.World(rank=1, size=2, local_rank=1)
    assert distributed.part_path(tmp_path / "x.parquet", world) == tmp_path / "x.rank1-of-2.parquet"


def test_from_env(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.from_env() is None
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.from_env() == distributed.World(3, 4, 1)


def test_torchrun_two_processes_match_one(tmp_path, wide_console):
    task_file = tmp_path / "p.jsonl"
    task_file.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    one, two = tmp_path / "one" / "x.parquet", tmp_path / "two" / "x.parquet"
    result = CliRunner().invoke(cli.app, args(task_file, one))
    assert result.exit_code == 0, result.output

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "specbench",
         *args(task_file, two)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "results: " in proc.stdout and proc.stdout.count("tau (micro)") == 1  # rank 0 alone prints
    # the parts are merged and gone
    assert sorted(p.name for p in two.parent.iterdir()) == ["x.ar-baseline.parquet", "x.parquet"]

    for name in ("x.parquet", "x.ar-baseline.parquet"):
        a, b = pd.read_parquet(one.parent / name), pd.read_parquet(two.parent / name)
        keys = list(zip(b["prompt_id"], b["turn"]))
        assert len(keys) == len(set(keys)) == 6  # every (prompt, turn) exactly once
        assert list(zip(a["prompt_id"], a["turn"])) == keys  # in the single-process order
        assert list(a.columns) == list(b.columns)
        for column in a.columns:
            if column in NOT_COMPARED:
                continue
            left = [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in a[column]]
            right = [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in b[column]]
            assert left == right, f"{name}: column {column} differs"


def test_existing_out_refused_without_resume(tmp_path, monkeypatch):
    """The merged file is never overwritten: rank 0 decides and every rank gets the same one-line error."""
    out = tmp_path / "x.parquet"
    out.write_bytes(b"")

    class Dist:  # a one-process stand-in for torch.distributed
        @staticmethod
        def is_initialized():
            return False

        @staticmethod
        def broadcast_object_list(box, src):
            pass

    monkeypatch.setattr(distributed, "_init", lambda world: Dist)
    spec = runner.RunSpec(target="tiny-llama", task="humaneval", limit=1, out=out)
    with pytest.raises(distributed.UserError, match="exists; pass --resume"):
        distributed.run(spec, lambda s: None, None, distributed.World(0, 2, 0))


# ---------------------------------------------------------------- --device-map (targets bigger than one GPU)


def test_device_map_refused_on_a_cpu_only_machine(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(cli.app, ["run", "--target", "tiny-llama", "--device-map", "auto", "--limit", "1",
                                          "--results-dir", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "CPU only" in lines[0] and "--device-map" in lines[0]
    assert "Traceback" not in result.output and not (tmp_path / "r").exists()
    bad = CliRunner().invoke(cli.app, ["run", "--target", "tiny-llama", "--device-map", "everywhere", "--limit", "1"])
    assert bad.exit_code == 2 and "unknown --device-map 'everywhere'" in bad.stderr


def test_device_map_refused_for_a_built_in_target():
    from specbench.targets import load_target

    with pytest.raises(distributed.UserError, match="built in code"):
        load_target("tiny-llama", device_map="auto")


def test_placement_text():
    class Model:
        hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": 1}

    assert runner.placement("auto", Model()) == "auto: cuda:0, cuda:1"
    assert runner.placement("auto", object()) == "auto: unknown"


def test_device_map_on_a_gpu_is_recorded_and_lossless(tmp_path, wide_console):
    import torch

    if not torch.cuda.is_available():
        print("skipping: --device-map needs a CUDA GPU")
        pytest.skip("--device-map needs a CUDA GPU")
    from specbench.targets import build_tiny

    model, tok = build_tiny("tiny-llama")
    model_dir = tmp_path / "tiny-llama-dir"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    task_file = tmp_path / "p.jsonl"
    task_file.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:3]))
    outs = {}
    for name, extra in (("mapped", ["--device-map", "auto"]), ("plain", ["--device", "cuda"])):
        out = tmp_path / name / "x.parquet"
        result = CliRunner().invoke(cli.app, ["run", "--target", str(model_dir), "--task-file", str(task_file), "--drafter", "ngram",
                                              "--max-new-tokens", "12", "--no-warmup", "--dtype", "float32", "--results-dir",
                                              str(out.parent), "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        outs[name] = pd.read_parquet(out)
    mapped = outs["mapped"]
    if torch.cuda.device_count() == 1:
        assert set(mapped["device_map"]) == {"auto: cuda:0"}
    assert all(v.startswith("auto: cuda:") for v in mapped["device_map"])
    assert set(pd.read_parquet(tmp_path / "mapped" / "x.ar-baseline.parquet")["device_map"]) == set(mapped["device_map"])
    assert [list(x) for x in mapped["output_ids"]] == [list(x) for x in outs["plain"]["output_ids"]]


@pytest.mark.parametrize("load, warned", [(0.4, False), (9.0, True)])
def test_run_warns_when_other_processes_shared_the_cpu(tmp_path, wide_console, monkeypatch, load, warned):
    from specbench import results

    monkeypatch.setattr(results, "load_average", lambda: load)
    task_file = tmp_path / "p.jsonl"
    task_file.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:2]))
    out = tmp_path / "r" / "x.parquet"
    res = CliRunner().invoke(cli.app, args(task_file, out))
    assert res.exit_code == 0, res.output
    assert ("other processes shared the CPU" in res.output) is warned, res.output
    assert set(results.read_results([out])["load_1min"]) == {load}  # every row records its sample
    shown = CliRunner().invoke(cli.app, ["compare", str(out.parent / "*.parquet")])
    assert shown.exit_code == 0, shown.output
    assert ("runs were timed while other processes shared the CPU" in shown.output) is warned, shown.output
    # the note goes to stderr: machine-readable output stays parseable on a loaded machine
    as_json = CliRunner().invoke(cli.app, ["compare", str(out.parent / "*.parquet"), "-f", "json"])
    assert as_json.exit_code == 0, as_json.output
    assert {r["drafter"] for r in json.loads(as_json.stdout)} == {"ar", "ngram"}
    assert ("shared the CPU" in as_json.stderr) is warned, as_json.stderr
