"""`specbench run --resume`: an interrupted run continues where it stopped and ends up identical to
an uninterrupted one. The interruption is a KeyboardInterrupt raised from the drafter session's
third prompt (monkeypatched ``_Session.run_prompt``), through typer's CliRunner on tiny-llama."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench import cli, runner

TARGET = "tiny-llama"
PROMPTS = [
    {"id": "p1", "prompt": "List three colours."},
    {"id": "p2", "turns": ["Name a prime.", "Now a bigger one."]},
    {"id": "p3", "prompt": "1 2 3 4 5 6"},
    {"id": "p4", "prompt": "Say hello in French."},
]
KEYS = sorted((p["id"], t) for p in PROMPTS for t in range(len(p.get("turns", [None]))))


@pytest.fixture(autouse=True, scope="module")
def _setup(wide_console):
    yield


@pytest.fixture
def task_file(tmp_path) -> Path:
    path = tmp_path / "four.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def invoke(*args):
    return CliRunner().invoke(cli.app, [str(a) for a in args])


def run_args(task_file: Path, res: Path, out: Path, *extra) -> list:
    return ["run", "--target", TARGET, "--task-file", task_file, "--drafter", "ngram", "--max-new-tokens", "8",
            "--no-warmup", "--results-dir", res, "--out", out, *extra]


def count_calls(monkeypatch, interrupt_at: int | None = None) -> dict[str, int]:
    """Count run_prompt calls per drafter; raise KeyboardInterrupt on ngram's ``interrupt_at``-th."""
    calls: dict[str, int] = {}
    original = runner._Session.run_prompt

    def wrapped(self, prompt):
        name = self.meta["drafter"]
        calls[name] = calls.get(name, 0) + 1
        if name == "ngram" and calls[name] == interrupt_at:
            raise KeyboardInterrupt
        return original(self, prompt)

    monkeypatch.setattr(runner._Session, "run_prompt", wrapped)
    return calls


def sidecar_of(out: Path) -> Path:
    return out.with_name(out.name + ".partial.jsonl")


def sidecar_keys(path: Path) -> list[tuple[str, int]]:
    rows = [json.loads(line)["row"] for line in path.read_text().splitlines() if line.strip()]
    return sorted((r["prompt_id"], r["turn"]) for r in rows)


def outputs(path: Path) -> dict[tuple[str, int], list[int]]:
    df = pd.read_parquet(path)
    keys = list(zip(df["prompt_id"], df["turn"]))
    assert len(keys) == len(set(keys)), "a (prompt, turn) appears twice"
    return {(p, int(t)): [int(x) for x in ids] for p, t, ids in zip(df["prompt_id"], df["turn"], df["output_ids"])}


def assert_refused(result, *words):
    assert isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr
    for word in words:
        assert word in errors[0], (word, errors[0])


def assert_interrupted(result):
    """Ctrl-C: exit status 130 and the hint to --resume, no traceback."""
    assert result.exit_code == 130, result.output
    assert "Traceback" not in result.output
    assert "interrupted" in result.stderr and "--resume" in result.stderr, result.stderr


def test_resume_with_baseline_matches_uninterrupted_run(tmp_path, task_file, monkeypatch):
    # the uninterrupted reference, in a results folder of its own (so nothing is reused from it)
    ref = tmp_path / "ref" / "ref.parquet"
    result = invoke(*run_args(task_file, ref.parent, ref))
    assert result.exit_code == 0, result.output
    ref_base = ref.with_name("ref.ar-baseline.parquet")
    assert sorted(outputs(ref)) == KEYS and sorted(outputs(ref_base)) == KEYS

    res = tmp_path / "res"
    out = res / "run.parquet"
    base = res / "run.ar-baseline.parquet"

    # interrupted while the drafter works on its 3rd prompt; the interleaved baseline has done 3
    with monkeypatch.context() as mp:
        calls = count_calls(mp, interrupt_at=3)
        result = invoke(*run_args(task_file, res, out))
    assert_interrupted(result)
    assert calls == {"ar": 3, "ngram": 3}
    assert not out.exists() and not base.exists()
    assert sidecar_keys(sidecar_of(out)) == [("p1", 0), ("p2", 0), ("p2", 1)]
    assert sidecar_keys(sidecar_of(base)) == [("p1", 0), ("p2", 0), ("p2", 1), ("p3", 0)]
    partial = {p: p.read_bytes() for p in (sidecar_of(out), sidecar_of(base))}

    # without --resume the unfinished run is not overwritten
    assert_refused(invoke(*run_args(task_file, res, out)), "--resume", "unfinished")
    # --resume with other sampling settings is refused, the partial rows untouched
    assert_refused(invoke(*run_args(task_file, res, out, "--resume", "--temperature", "0.5")),
                   "cannot resume", "temperature")
    assert_refused(invoke(*run_args(task_file, res, out, "--resume", "--max-new-tokens", "9")),
                   "cannot resume", "max_new_tokens")
    assert {p: p.read_bytes() for p in partial} == partial
    assert not out.exists()

    # --resume runs only what is missing: drafter p3, p4; baseline p4
    with monkeypatch.context() as mp:
        calls = count_calls(mp)
        result = invoke(*run_args(task_file, res, out, "--resume"))
    assert result.exit_code == 0, result.output
    assert calls == {"ar": 1, "ngram": 2}
    assert not sidecar_of(out).exists() and not sidecar_of(base).exists()
    assert "run.ar-baseline.parquet" in result.stdout
    assert outputs(out) == outputs(ref)
    assert outputs(base) == outputs(ref_base)
    assert outputs(out) == outputs(base)  # greedy: lossless
    df = pd.read_parquet(out)
    assert list(zip(df["prompt_id"], df["turn"])) == KEYS  # prompts in task order
    assert set(df["run_id"]) == {"run"}

    finished = {p: p.read_bytes() for p in (out, base)}
    # a finished run: again without --resume is refused; --resume with another temperature too
    assert_refused(invoke(*run_args(task_file, res, out)), str(out), "exists", "--resume")
    assert_refused(invoke(*run_args(task_file, res, out, "--resume", "--temperature", "0.5")),
                   "cannot resume", "temperature")
    assert {p: p.read_bytes() for p in finished} == finished
    assert sorted(p.name for p in res.iterdir()) == ["run.ar-baseline.parquet", "run.parquet"]

    # --resume of a finished run has nothing left to do
    with monkeypatch.context() as mp:
        calls = count_calls(mp)
        result = invoke(*run_args(task_file, res, out, "--resume"))
    assert result.exit_code == 0, result.output
    assert calls == {}
    assert outputs(out) == outputs(ref)


def test_resume_sampled_run_draws_what_the_uninterrupted_one_would(tmp_path, task_file, monkeypatch):
    sampled = ("--temperature", "1.0", "--top-k", "50", "--seed", "3", "--no-baseline")
    ref = tmp_path / "ref.parquet"
    result = invoke(*run_args(task_file, tmp_path, ref, *sampled))
    assert result.exit_code == 0, result.output

    out = tmp_path / "run.parquet"
    with monkeypatch.context() as mp:
        count_calls(mp, interrupt_at=3)
        result = invoke(*run_args(task_file, tmp_path, out, *sampled))
    assert_interrupted(result)
    assert sidecar_keys(sidecar_of(out)) == [("p1", 0), ("p2", 0), ("p2", 1)]

    with monkeypatch.context() as mp:
        calls = count_calls(mp)
        result = invoke(*run_args(task_file, tmp_path, out, "--resume", *sampled))
    assert result.exit_code == 0, result.output
    assert calls == {"ngram": 2}
    assert "AR baseline" not in result.output
    assert outputs(out) == outputs(ref)
    assert sorted(outputs(out)) == KEYS
    # a different seed really draws something else (so the equality above means something)
    other = tmp_path / "other.parquet"
    result = invoke(*run_args(task_file, tmp_path, other, *sampled[:-3], "--seed", "4", "--no-baseline"))
    assert result.exit_code == 0, result.output
    assert outputs(other) != outputs(ref)


@pytest.mark.parametrize("change", [("--top-p", "0.5"), ("--top-k", "7"), ("--dtype", "bfloat16")])
def test_resume_refuses_other_sampling_filter_or_dtype(tmp_path, task_file, monkeypatch, change):
    """top_p / top_k / dtype change what a run draws, like temperature: no silent mixing."""
    sampled = ("--temperature", "1.0", "--top-k", "50", "--no-baseline")
    out = tmp_path / "run.parquet"
    with monkeypatch.context() as mp:
        count_calls(mp, interrupt_at=2)
        result = invoke(*run_args(task_file, tmp_path, out, *sampled, "--max-new-tokens", "2"))
    assert_interrupted(result)
    partial = sidecar_of(out).read_bytes()
    result = invoke(*run_args(task_file, tmp_path, out, "--resume", *sampled, "--max-new-tokens", "2", *change))
    assert_refused(result, "cannot resume", change[0].removeprefix("--").replace("-", "_"))
    assert sidecar_of(out).read_bytes() == partial and not out.exists()


def test_resume_checks_the_baseline_rows_too(tmp_path, task_file, monkeypatch):
    """Interrupted in the drafter's first prompt: only the baseline has rows, and they are checked."""
    out = tmp_path / "run.parquet"
    with monkeypatch.context() as mp:
        calls = count_calls(mp, interrupt_at=1)
        result = invoke(*run_args(task_file, tmp_path, out, "--max-new-tokens", "2"))
    assert_interrupted(result)
    assert calls == {"ar": 1, "ngram": 1}
    base_sidecar = sidecar_of(tmp_path / "run.ar-baseline.parquet")
    assert not sidecar_of(out).exists() and sidecar_keys(base_sidecar) == [("p1", 0)]
    partial = base_sidecar.read_bytes()
    result = invoke(*run_args(task_file, tmp_path, out, "--resume", "--max-new-tokens", "2", "--temperature", "0.5"))
    assert_refused(result, "cannot resume", "temperature")
    assert base_sidecar.read_bytes() == partial
    assert sorted(p.name for p in tmp_path.iterdir()) == ["four.jsonl", base_sidecar.name]
