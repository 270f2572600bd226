"""`specbench tune`: a budget sweep through the sweep machinery (reused on a rerun), tau and measured /
projected speedups per budget, the best budget per device, the figure, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbench import results, runner, sweep, tune
from specbench.hardware.project import project_rows
from clirun import invoke, one_error_line

PROMPTS = [{"id": "a", "prompt": "1 2 3 4 5 6"}, {"id": "b", "prompt": "ab ab ab ab ab ab"}]


@pytest.fixture(autouse=True, scope="module")
def _setup(wide_console):
    yield


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "rep.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def tune_args(tmp_path: Path, prompts: Path, *extra) -> list:
    return ["tune", "--drafter", "ngram", "--task-file", prompts, "--target", "tiny-qwen3", "--budgets", "4,1",
            "--limit", 0, "--max-new-tokens", 24, "--set", "min_n=1", "--hardware", "h100-sxm:engine",
            "--hardware", "a100:hf-eager", "--results-dir", tmp_path / "res", "--out-dir", tmp_path / "fig",
            "--format", "json", *extra]


def run_json(args) -> dict:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_tune_reports_each_budget_and_the_best_per_device_then_reuses(tmp_path, prompts, monkeypatch):
    args = tune_args(tmp_path, prompts)
    out = run_json(args)
    assert out["budget_key"] == "num_draft" and [r["budget"] for r in out["budgets"]] == [1, 4]
    assert [b["device"] for b in out["best"]] == ["measured", "h100-sxm:engine", "a100:hf-eager"]
    assert [b["kind"] for b in out["best"]] == ["measured", "projected", "projected"]
    for row in out["budgets"]:
        assert row["n_prompts"] == 2 and row["lossless"] is True
        df = results.read_results([Path(row["file"])])
        assert row["tau"] == pytest.approx(float(df["n_new_tokens"].sum() / df["n_steps"].sum()))
        assert row["measured_decode_speedup_sum"] > 0
        for name in ("h100-sxm:engine", "a100:hf-eager"):  # the projection of the cell's own rows
            assert row["projected"][name]["decode_speedup_sum"] == pytest.approx(project_rows(df, name).speedup_sum)
    assert out["budgets"][0]["mean_tree_size"] < out["budgets"][1]["mean_tree_size"]
    for best in out["best"]:  # the optimum is the argmax of the reported speedups
        speeds = {r["budget"]: tune.speedup_of(r, best["device"]) for r in out["budgets"]}
        assert best["decode_speedup_sum"] == pytest.approx(max(speeds.values()))
        assert speeds[best["best_budget"]] == pytest.approx(max(speeds.values()))
        ties = [b for b, v in speeds.items() if v == max(speeds.values())]
        assert best["best_budget"] == min(ties)  # a tie goes to the smaller budget
    assert Path(out["figure"]).is_file() and Path(out["figure"]).stat().st_size > 10_000
    # the written sweep file is a sweep: every cell is finished, one AR baseline was run for both
    plan = sweep.load_sweep(out["sweep_file"])
    assert [sweep.cell_state(c)[0] for c in plan.cells] == ["done", "done"]
    assert len(list((tmp_path / "res").glob("*.ar-baseline.parquet"))) == 1

    def no_runs(*a, **k):
        raise AssertionError("a finished budget was run again")

    monkeypatch.setattr(runner, "run", no_runs)
    again = run_json(args)
    assert again["budgets"] == out["budgets"] and again["best"] == out["best"]


def test_tune_without_baseline_projects_only(tmp_path, prompts):
    out = run_json([*tune_args(tmp_path, prompts), "--no-baseline", "--budgets", "2"])
    assert [b["device"] for b in out["best"]] == ["h100-sxm:engine", "a100:hf-eager"]
    assert out["budgets"][0]["measured_decode_speedup_sum"] is None
    assert out["best"][0]["best_budget"] == 2


def test_best_budget_picks_the_highest_and_the_smaller_on_ties():
    rows = [{"budget": 16, "s": 1.2}, {"budget": 32, "s": 1.5}, {"budget": 64, "s": 1.5}, {"budget": 128, "s": float("nan")}]
    assert tune._best(rows, "s")["budget"] == 32
    assert tune._best([{"budget": 8, "s": None}], "s") is None


def test_sweep_text_round_trips_through_the_sweep_loader(tmp_path, prompts):
    spec = tune.TuneSpec(drafter="eagle3", task=None, task_file=prompts, budgets=(16, 32), hardware=("h200:engine",),
                         target="tiny-qwen3", options=("path=random", "depth=3"), results_dir=tmp_path / "r")
    plan, key, path = tune.write_sweep(spec)
    assert key == "total_tokens" and path.is_file()
    opts = [c.spec.options for c in plan.cells]
    assert opts == [("total_tokens=16", "path=random", "depth=3"), ("total_tokens=32", "path=random", "depth=3")]
    assert all(c.spec.target == "tiny-qwen3" and c.spec.limit == 10 for c in plan.cells)


@pytest.mark.parametrize("extra, words", [
    (["--budgets", "16,x"], "comma-separated integers"),
    (["--budgets", "0,4"], "positive integers"),
    (["--budget-key", "nope"], "has no option 'nope'"),
    (["--drafter", "ar"], "has no budget option"),
    (["--hardware", "h999:engine"], "h999"),
    (["--set", "num_draft=3"], "is what --budgets varies"),
    (["--format", "xml"], "unknown --format"),
    (["--out-dir", "{tmp}/rep.jsonl/figures"], "cannot write the figure to folder"),  # under a file: before any run
    (["--results-dir", "{tmp}/rep.jsonl/res"], "cannot write the sweep file to folder"),
    (["--device", "gpu0"], "invalid --device 'gpu0'"),  # was: a sweep of failed cells, rc 1
    (["--dtype", "half"], "invalid --dtype 'half'"),
])
def test_tune_errors_are_one_line(tmp_path, prompts, extra, words):
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    line = one_error_line(invoke(*tune_args(tmp_path, prompts), *extra))
    assert words in line, line
    assert not list((tmp_path / "res").glob("*.parquet"))


def test_a_mistyped_option_leaves_the_earlier_tunes_sweep_file_as_it_was(tmp_path, prompts):
    """The generated sweep file is checked before it is written: the error is in the options typed (not the
    generated file's cell names), and the sweep file of an earlier tune with the same name is not replaced."""
    sweep_file = tmp_path / "res" / "tune_tiny-qwen3_file-rep_ngram.toml"  # the name this tune writes
    sweep_file.parent.mkdir()
    sweep_file.write_text("# an earlier tune\n")
    line = one_error_line(invoke(*tune_args(tmp_path, prompts), "--set", "nosuch=1"))
    assert line.startswith("error: unknown --set key 'nosuch'"), line
    assert sweep_file.read_text() == "# an earlier tune\n"
    assert [p.name for p in sweep_file.parent.iterdir()] == [sweep_file.name]
