"""Figures of result files: the numbers behind them, the PNGs written and the `plot` command."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench import plots, report
from specbench.cli import app
from specbench.errors import UserError
from rowfactory import synthetic_row
from specbench.results import RunWriter, read_results

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
KINDS = ("acceptance", "accepted_hist", "speedup", "time_breakdown")


def result_row(prompt_id: str, drafter: str, accepted: list[int], **overrides) -> dict:
    """One result row; each step commits accepted + 1 tokens; times are per-row totals."""
    n_new = sum(a + 1 for a in accepted)
    defaults = {
        "run_id": f"run-{drafter}", "target": "org/tiny model", "drafter": drafter, "drafter_config": "{}",
        "task": "mt_bench/writing", "max_new_tokens": 32, "prompt_ids": [1, 2, 3],
        "output_ids": list(range(n_new)), "tree_size_per_step": [4] * len(accepted),
        "tree_depth_per_step": [3] * len(accepted), "drafter_forwards_per_step": [3] * len(accepted),
        "prefill_s": 0.1, "decode_s": 1.0, "draft_s": 0.2, "verify_s": 0.7, "other_s": 0.1,
    }
    return synthetic_row(prompt_id, overrides.pop("turn", 0), accepted, **{**defaults, **overrides})


def ar_row(prompt_id: str, n_new: int, **overrides) -> dict:
    """An AR baseline row: one token per step, nothing drafted."""
    row = result_row(prompt_id, "ar", [0] * n_new, tree_size_per_step=[1] * n_new,
                     tree_depth_per_step=[0] * n_new, drafter_forwards_per_step=[0] * n_new,
                     draft_s=0.0, verify_s=1.8, other_s=0.2, decode_s=2.0)
    row.update(overrides)
    return row


def sample_rows() -> list[dict]:
    """AR on p0, p1; ngram with two configs; eagle3 without a baseline partner (other seed)."""
    ngram3 = json.dumps({"max_n": 3, "num_draft": 3}, sort_keys=True)
    ngram5 = json.dumps({"max_n": 3, "num_draft": 5}, sort_keys=True)
    return [
        # ngram num_draft=3: steps accepted [3, 1, 0] and [2, 0] -> 5 steps, 11 tokens
        result_row("p0", "ngram", [3, 1, 0], drafter_config=ngram3, decode_s=1.0),
        result_row("p1", "ngram", [2, 0], drafter_config=ngram3, decode_s=0.5),
        # the same (prompt, turn) run twice: counts once (the first row read)
        result_row("p1", "ngram", [3, 3], drafter_config=ngram3, decode_s=0.1),
        result_row("p0", "ngram", [5, 0, 0], drafter_config=ngram5, tree_depth_per_step=[5] * 3),
        result_row("p0", "eagle3", [1], seed=7),
        ar_row("p0", 7),
        ar_row("p1", 4),
    ]


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def write_results(rows: list[dict], path) -> None:
    writer = RunWriter(path, resume=False)
    writer.add(rows)
    writer.finish()


def check_png(path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_SIGNATURE
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    assert 400 <= image.shape[0] <= 3000 and 600 <= image.shape[1] <= 3000


# --------------------------------------------------------------------------------------------
# the numbers


def test_series_labels_name_the_differing_options_and_settings():
    series = plots.series_of(frame(sample_rows()))
    labels = [s.label for s in series]
    assert labels == [
        "ar (seed=0)",
        "eagle3 (seed=7)",
        "ngram (num_draft=3, seed=0)",
        "ngram (num_draft=5, seed=0)",
    ]
    assert series[0].is_baseline and not series[1].is_baseline
    # duplicates of a (prompt, turn) are dropped, as in report.compare
    assert len(series[2].rows) == 2
    assert len({s.color for s in series}) == 4


def test_series_order_numbers_by_value_as_compare_does():
    rows = [result_row("p0", "ngram", [1], drafter_config=json.dumps({"num_draft": n})) for n in (10, 2, 1)]
    labels = [s.label for s in plots.series_of(frame(rows))]
    assert labels == ["ngram (num_draft=1)", "ngram (num_draft=2)", "ngram (num_draft=10)"]


def test_checkpoint_paths_in_labels_keep_the_part_that_differs():
    """A path option reads as compare writes it (its last part), shortened in the middle, so two checkpoints whose
    names differ at the end stay two labels (they were 'path=drafters/checkpoints/je…' and '... #2')."""
    heads = ("jetspec-smollm2-135m-r200k-g1-e5-v8k", "jetspec-smollm2-135m-r200k-g1-e7-v8k")
    rows = [result_row("p0", "jetspec", [1], drafter_config=json.dumps({"path": f"drafters/checkpoints/{h}"}))
            for h in heads]
    labels = [s.label for s in plots.series_of(frame(rows))]
    assert labels == ["jetspec (path=jetspec-s…200k-g1-e5-v8k)", "jetspec (path=jetspec-s…200k-g1-e7-v8k)"]


def test_single_config_label_is_the_drafter_name():
    rows = [r for r in sample_rows() if r["drafter"] in ("ar", "eagle3")]
    rows = [dict(r, seed=0) for r in rows]
    assert [s.label for s in plots.series_of(frame(rows))] == ["ar", "eagle3"]


def test_acceptance_curves_are_per_depth_shares_of_steps():
    rows = [r for r in sample_rows() if r["drafter"] in ("ar", "ngram")]
    depths, curves = plots.acceptance_curves(plots.series_of(frame(rows)))
    assert depths == [1, 2, 3, 4, 5]  # the deepest draft: tree depth 5 of num_draft=5
    # num_draft=3, steps accepted 3, 1, 0, 2, 0
    assert curves["ngram (num_draft=3)"] == pytest.approx([3 / 5, 2 / 5, 1 / 5, 0.0, 0.0])
    assert curves["ngram (num_draft=5)"] == pytest.approx([1 / 3] * 5)
    assert "ar" not in curves  # the baseline drafts nothing
    # the same numbers as report's definition
    series = {s.label: s for s in plots.series_of(frame(rows))}
    assert curves["ngram (num_draft=3)"][:4] == report.accept_at_least(series["ngram (num_draft=3)"].rows, max_depth=4)


def test_accepted_fractions_sum_to_one():
    rows = [r for r in sample_rows() if r["drafter"] in ("ar", "ngram")]
    fractions = plots.accepted_fractions(plots.series_of(frame(rows)))
    assert list(fractions.index) == [0, 1, 2, 3, 4, 5]
    assert fractions["ngram (num_draft=3)"].tolist() == pytest.approx([0.4, 0.2, 0.2, 0.2, 0, 0])
    assert fractions["ngram (num_draft=5)"].tolist() == pytest.approx([2 / 3, 0, 0, 0, 0, 1 / 3])


def test_speedup_bars_leave_out_unpaired_drafters():
    bars, omitted = plots.speedup_bars(plots.series_of(frame(sample_rows())))
    assert omitted == ["eagle3 (seed=7)"]
    row = bars.set_index("label").loc["ngram (num_draft=3, seed=0)"]
    # drafter: 11 tokens in 1.5 s; baseline: 11 tokens in 4.0 s
    assert row["decode_speedup_sum"] == pytest.approx(4.0 / 1.5)
    assert row["tau"] == pytest.approx(11 / 5)
    assert row["n_paired"] == 2
    # the tau whiskers: resampling p0 (7 tokens / 3 steps) and p1 (4 / 2) can only move tau between them
    assert 2.0 <= row["tau_lo"] < row["tau"] < row["tau_hi"] <= 7 / 3
    assert (row["tau_lo"], row["tau_hi"]) == report.tau_interval(frame(sample_rows()[:2]))
    one_prompt = bars.set_index("label").loc["ngram (num_draft=5, seed=0)"]  # p0 only: no interval
    assert pd.isna(one_prompt["tau_lo"]) and pd.isna(one_prompt["tau_hi"])
    from specbench.reporting import figures  # the report's tau-by-task bars carry the same whiskers

    by_task = figures.per_task(plots.series_of(frame(sample_rows()))).set_index("label")
    assert (by_task.loc["ngram (num_draft=3, seed=0)", ["tau_lo", "tau_hi"]].tolist()
            == [row["tau_lo"], row["tau_hi"]])


def test_time_breakdown_is_seconds_per_step():
    table = plots.time_breakdown(plots.series_of(frame(sample_rows())))
    ar = table.loc["ar (seed=0)"]
    assert ar.tolist() == pytest.approx([0.0, 3.6 / 11, 0.4 / 11])
    ngram = table.loc["ngram (num_draft=3, seed=0)"]
    assert ngram.tolist() == pytest.approx([0.4 / 5, 1.4 / 5, 0.2 / 5])


def test_sanitize():
    assert plots.sanitize("org/tiny model") == "org_tiny_model"
    assert plots.sanitize("file:my prompts") == "file_my_prompts"
    assert plots.sanitize("../..") == "unnamed"


# --------------------------------------------------------------------------------------------
# the figures


def test_make_figures_writes_valid_pngs(tmp_path):
    rows = sample_rows() + [
        result_row("q0", "ngram", [1, 1], task="gsm8k"),
        ar_row("q0", 4, task="gsm8k"),
    ]
    paths = plots.make_figures(frame(rows), tmp_path / "figs")
    names = sorted(p.name for p in paths)
    assert names == sorted(
        f"{kind}_{stem}.png"
        for kind in KINDS
        for stem in ("org_tiny_model_gsm8k", "org_tiny_model_mt_bench_writing")
    )
    for path in paths:
        check_png(path)


def test_figures_without_drafters_or_baseline_still_render(tmp_path):
    only_ar = plots.make_figures(frame([ar_row("p0", 3)]), tmp_path / "ar")
    no_base = plots.make_figures(frame([result_row("p0", "ngram", [0, 2])]), tmp_path / "nb")
    for path in only_ar + no_base:
        check_png(path)


def test_mixed_devices_are_refused_unless_allowed(tmp_path):
    rows = sample_rows() + [dict(r, device="cuda", device_name="H200") for r in sample_rows()]
    with pytest.raises(UserError, match="mix devices"):
        plots.make_figures(frame(rows), tmp_path)
    paths = plots.make_figures(frame(rows), tmp_path, allow_mixed=True)
    assert len(paths) == 4
    labels = [s.label for s in plots.series_of(frame(rows))]
    assert "ngram (num_draft=3, seed=0, device=cuda, hw=H200)" in labels


def test_no_rows_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no rows"):
        plots.make_figures(read_results([]), tmp_path)


# --------------------------------------------------------------------------------------------
# the command


def test_plot_command(tmp_path):
    rows = sample_rows()
    write_results([r for r in rows if r["drafter"] != "ar"][:1], tmp_path / "a.parquet")
    write_results([r for r in rows if r["drafter"] == "ar"], tmp_path / "b.parquet")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "*.parquet"), "--out-dir", str(out)])
    assert result.exit_code == 0, result.output
    printed = result.output.split()
    assert len(printed) == 4
    for name in printed:
        assert name.startswith(str(out))
    for path in out.iterdir():
        check_png(path)


def test_timing_figures_say_when_the_cpu_was_shared(tmp_path, monkeypatch):
    """A run timed beside another process (load above its threads) gets a warning on stderr, and the two
    figures drawn from timings carry it in their subtitles; tau and acceptance figures do not."""
    rows = sample_rows()
    busy = [dict(r, load_1min=9.0) if r["drafter"] == "ar" else r for r in rows]  # the baseline shared the CPU
    subtitles = {}

    def recorder(kind):
        def draw(series, subtitle, path):
            subtitles[kind] = subtitle
            return path
        return draw

    monkeypatch.setattr(plots, "FIGURES", tuple((kind, recorder(kind)) for kind, _ in plots.FIGURES))
    for data, shared in ((rows, False), (busy, True)):
        plots.make_figures(frame(data), tmp_path)
        for kind in KINDS:
            assert (plots.SHARED_CPU_SUBTITLE in subtitles[kind]) == (shared and kind in ("speedup", "time_breakdown"))
    monkeypatch.undo()
    write_results([r for r in busy if r["drafter"] == "ngram"], tmp_path / "files" / "ngram.parquet")
    write_results([r for r in busy if r["drafter"] == "ar"], tmp_path / "files" / "ar.parquet")
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "files" / "*.parquet"), "--out-dir", str(tmp_path / "out")])
    assert result.exit_code == 0 and len(result.stdout.split()) == 4
    assert result.stderr.startswith("warning: 1 of") and "ar on mt_bench/writing (load 9.0" in result.stderr


def test_plot_command_errors_are_one_line(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["plot", str(tmp_path / "nothing-*.parquet")])
    assert missing.exit_code == 2 and "no results file matches" in missing.output
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    corrupt = runner.invoke(app, ["plot", str(bad), "--out-dir", str(tmp_path / "o")])
    assert corrupt.exit_code == 2 and "not a readable parquet file" in corrupt.output
    assert len(corrupt.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    good = tmp_path / "good.parquet"
    write_results([ar_row("p0", 3)], good)
    for command, flag in (("plot", "--out-dir"), ("report", "--out")):  # a folder under a file: one line, no traceback
        under = runner.invoke(app, [command, str(good), flag, str(bad / "figs")])
        assert under.exit_code == 2 and "Traceback" not in under.output, under.output
        assert len(under.output.strip().splitlines()) == 1
        assert "cannot write" in under.output and f"choose another {flag}" in under.output


def test_nan_metrics_do_not_break_a_figure(tmp_path):
    empty_steps = result_row("p0", "ngram", [], n_new_tokens=0, decode_s=0.0)
    paths = plots.make_figures(frame([empty_steps, ar_row("p0", 3)]), tmp_path)
    assert len(paths) == 4
    for path in paths:
        check_png(path)


def test_figures_pair_each_run_with_its_own_baseline_whatever_the_file_order():
    """Two sessions of the same prompts, each with its own interleaved AR baseline (the machine twice as fast
    on the first day): the speedup bars and the report's per-task speedups divide each run by its own
    baseline, in any order of the rows, as `compare` does."""
    from specbench.reporting import figures

    cfg = {d: json.dumps({"max_n": 3, "num_draft": d}, sort_keys=True) for d in (3, 5)}
    fast_day = [ar_row("p0", 6, run_id="a.ar-baseline", decode_s=1.0),
                result_row("p0", "ngram", [2, 2], run_id="a", drafter_config=cfg[3], decode_s=0.5)]
    slow_day = [ar_row("p0", 6, run_id="b.ar-baseline", decode_s=2.0),
                result_row("p0", "ngram", [2, 2], run_id="b", drafter_config=cfg[5], decode_s=0.8)]
    for rows in (fast_day + slow_day, slow_day + fast_day, slow_day[::-1] + fast_day[::-1]):
        series = plots.series_of(frame(rows))
        bars = plots.speedup_bars(series)[0].set_index("label")["decode_speedup_sum"]
        assert bars["ngram (num_draft=3)"] == pytest.approx(1.0 / 0.5)
        assert bars["ngram (num_draft=5)"] == pytest.approx(2.0 / 0.8)
        by_task = figures.per_task(series).set_index("label")["decode_speedup"]
        assert by_task["ngram (num_draft=3)"] == pytest.approx(1.0 / 0.5)
        assert by_task["ngram (num_draft=5)"] == pytest.approx(2.0 / 0.8)


def test_speedup_figure_legends_cover_no_value_label(tmp_path, monkeypatch):
    """Each panel's legend sits clear of every bar's value label, also when the leftmost bar is the tallest
    (the legend's corner) and another bar stands at the AR line (tau 1.00); neighbouring tick labels do not
    overlap either."""
    drawn = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, *a: (drawn.append(fig), save(fig, *a))[1])
    rows = []
    for i, accepted in enumerate(([4, 4, 4, 3], [0, 0, 0, 0], [1, 0, 2, 0], [2, 1, 1, 3])):
        config = json.dumps({"num_draft": i + 1}, sort_keys=True)
        rows += [result_row(p, "ngram", accepted, drafter_config=config, decode_s=0.5 + 0.1 * i) for p in ("p0", "p1")]
    rows += [ar_row("p0", 8), ar_row("p1", 8)]
    plots.plot_speedup(plots.series_of(frame(rows)), "subtitle", tmp_path / "speedup.png")
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    assert all(t.get_rotation() == 0 for ax in fig.axes for t in ax.get_xticklabels())  # room enough: level
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent(renderer)
        labels = [t for t in ax.texts if t.get_text()]
        assert len(labels) == 4
        for text in labels:
            assert not legend.overlaps(text.get_window_extent(renderer)), (ax.get_title(), text.get_text())
        ticks = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
        assert len(ticks) == 4
        for left, right in zip(ticks, ticks[1:]):
            assert left.x1 < right.x0, "neighbouring tick labels overlap"


def test_crowded_tick_labels_slant(tmp_path, monkeypatch):
    """Twelve settings do not fit side by side in the widest figure: their tick labels slant instead of overlapping."""
    drawn = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, *a: (drawn.append(fig), save(fig, *a))[1])
    rows = [result_row(p, "ngram", [1, 0], drafter_config=json.dumps({"max_n": 3, "num_draft": i}))
            for i in range(1, 13) for p in ("p0", "p1")] + [ar_row("p0", 4), ar_row("p1", 4)]
    plots.plot_speedup(plots.series_of(frame(rows)), "subtitle", tmp_path / "speedup.png")
    (fig,) = drawn
    assert fig.get_size_inches()[0] == plots.MAX_WIDTH_IN
    assert all(t.get_rotation() == 30 for ax in fig.axes for t in ax.get_xticklabels())
    check_png(tmp_path / "speedup.png")
