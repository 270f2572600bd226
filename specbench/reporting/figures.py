"""The report's figures. Each builder returns :class:`Figure` records (a matplotlib figure on an Agg
canvas, no pyplot) that :mod:`specbench.reporting.page` saves as PNG and PDF.

Per target (all its tasks in one figure): tau per task per drafter, decode speedup per task, tau
and speedup against a drafter's budget-like option, the learning curve of an adaptive drafter.
Per (target, task) the four figures of :mod:`specbench.plots` (per-depth acceptance at every depth,
accepted-length histogram, speedup and tau, time per step) are drawn by that module.

Every number comes from :mod:`specbench.report`; a *series* is one (drafter, config, run settings)
group as in ``report.compare`` (from :func:`specbench.plots.series_of`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure as MplFigure

from specbench import plots, report

DPI = plots.DPI  # saved figures use the house resolution
ADAPT_OPTION = "adapt"  # a drafter config option of this name marks an adaptive drafter (off / false = not adapting)
_OFF = ("off", "false", "none", "no", "0", "")


@dataclass(frozen=True)
class Figure:
    key: str  # file stem, unique in a report
    title: str
    caption: str  # one sentence: what is plotted, how to read it
    figure: MplFigure


def _new(width: float, height: float, ncols: int = 1) -> tuple[MplFigure, list]:
    """A figure with ``ncols`` axes in the house style (the one plots.py uses)."""
    return plots._figure(width, height, ncols)


def _finish(fig: MplFigure, title: str) -> MplFigure:
    fig.suptitle(title, fontsize=11, weight="bold")
    fig.tight_layout()
    return fig


def _shared(df: pd.DataFrame) -> str:
    """A second title line for a figure with speedups, when a run behind it shared the CPU."""
    return "\n" + plots.SHARED_CPU_SUBTITLE.removeprefix(" · ") if report.shared_cpu_note(df) is not None else ""


def _config(config: str) -> dict:
    try:
        parsed = json.loads(config)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _tasks(df: pd.DataFrame) -> list[str]:
    return sorted(df["task"].astype(str).unique())


# --------------------------------------------------------------------------------------------
# numbers


def per_task(series: list[plots.Series]) -> pd.DataFrame:
    """One row per (drafting series, task): tau (micro) with its 95% bootstrap interval over prompts
    (tau_lo, tau_hi) and decode speedup (ratio of sums; NaN with no paired AR row)."""
    baseline = plots.baseline_rows(series)
    records = []
    for s in series:
        if s.is_baseline:
            continue
        for task, rows in s.rows.groupby("task", sort=True):
            pairs = report.pair_with_baseline(rows, baseline)
            lo, hi = report.tau_interval(rows)
            records.append({"label": s.label, "task": str(task), "tau": report.tau_micro(rows), "tau_lo": lo,
                            "tau_hi": hi, "decode_speedup": report.speedups(pairs)["decode_speedup_sum"],
                            "n_paired": len(pairs), "color": s.color})
    return pd.DataFrame.from_records(records, columns=["label", "task", "tau", "tau_lo", "tau_hi", "decode_speedup",
                                                       "n_paired", "color"])


def budget_families(series: list[plots.Series]) -> list[tuple[str, str, list[tuple[float, plots.Series]]]]:
    """(drafter, option, [(value, series), ...]) for every set of >= 2 configs of one drafter that
    differ in exactly one numeric option (a budget, a depth, a draft length), sorted by value."""
    by_drafter: dict[str, list[plots.Series]] = {}
    for s in series:
        if not s.is_baseline:
            by_drafter.setdefault(s.drafter, []).append(s)
    families = []
    for drafter, group in sorted(by_drafter.items()):
        configs = [(s, _config(s.config)) for s in group]
        keys = sorted({k for _, c in configs for k in c})
        for option in keys:
            buckets: dict[str, list[tuple[float, plots.Series]]] = {}
            for s, c in configs:
                value = c.get(option)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                rest = json.dumps({k: v for k, v in c.items() if k != option}, sort_keys=True, default=str)
                buckets.setdefault(rest, []).append((float(value), s))
            for points in buckets.values():
                values = {v for v, _ in points}
                if len(values) >= 2 and len(values) == len(points):
                    families.append((drafter, option, sorted(points, key=lambda p: p[0])))
    return families


def adaptive_series(series: list[plots.Series]) -> list[plots.Series]:
    """Series of a drafter whose config has an ``adapt`` option, when some config of it adapts (the
    ones that do not stay in, for comparison)."""
    out = []
    drafters = {s.drafter for s in series if str(_config(s.config).get(ADAPT_OPTION, "off")).lower() not in _OFF}
    for s in series:
        if s.drafter in drafters and ADAPT_OPTION in _config(s.config):
            out.append(s)
    return out


def learning_curve(rows: pd.DataFrame) -> pd.DataFrame:
    """tau per (prompt, turn) in the order the run wrote them (columns index, tau)."""
    steps = rows["n_steps"].to_numpy(dtype=float)
    new = rows["n_new_tokens"].to_numpy(dtype=float)
    tau = np.where(steps > 0, new / np.where(steps > 0, steps, 1.0), np.nan)
    return pd.DataFrame({"index": np.arange(1, len(rows) + 1), "tau": tau})


# --------------------------------------------------------------------------------------------
# drawing


def _grouped_bars(ax, table: pd.DataFrame, column: str, tasks: list[str], fmt: str) -> None:
    labels = list(dict.fromkeys(table["label"]))
    width = 0.8 / max(1, len(labels))
    x = np.arange(len(tasks))
    for i, label in enumerate(labels):
        sub = table[table["label"] == label].set_index("task")
        values = np.array([float(sub[column].get(t, math.nan)) for t in tasks])
        offset = (i - (len(labels) - 1) / 2) * width
        ax.bar(x + offset, np.where(np.isfinite(values), values, 0.0), width=width,
                       color=sub["color"].iloc[0], label=label)
        tops = values
        if column == "tau":  # each value's label goes above its whisker
            lo, hi = ([float(sub[c].get(t, math.nan)) for t in tasks] for c in ("tau_lo", "tau_hi"))
            tops = plots.interval_whiskers(ax, x + offset, values, lo, hi, capsize=2, linewidth=0.8)
        if len(labels) * len(tasks) <= 24:
            for xi, value, top in zip(x + offset, values, tops):
                if np.isfinite(value):
                    ax.annotate(fmt.format(value), (xi, top), xytext=(0, 1), textcoords="offset points",
                                ha="center", va="bottom", fontsize=7, bbox=plots.LABEL_BOX)
    ax.set_xticks(x)
    ax.set_xticklabels(tasks, fontsize=9)
    ax.set_xlim(-0.6, len(tasks) - 0.4)


def _legend(ax, n: int) -> None:
    ax.legend(fontsize=7, title="drafter", title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False, ncol=1 if n <= 18 else 2)


def tau_and_speedup_by_task(target: str, df: pd.DataFrame, stem: str) -> list[Figure]:
    series = plots.series_of(df)
    table = per_task(series)
    tasks = _tasks(df)
    n = len(dict.fromkeys(table["label"]))
    width = min(16.0, 5.0 + 0.35 * n * len(tasks) + 2.5)
    out = []
    fig, (ax,) = _new(width, 4.4)
    if n:
        _grouped_bars(ax, table, "tau", tasks, "{:.2f}")
        ax.axhline(1.0, linestyle="--", color="0.4", linewidth=1.0, label="AR (τ = 1)")
        ax.set_ylabel("τ (committed tokens per target forward)")
        _legend(ax, n)
    else:
        ax.axis("off")
        ax.text(0.5, 0.5, "no drafter besides the AR baseline", ha="center", va="center", transform=ax.transAxes)
    out.append(Figure(f"tau_by_task_{stem}", f"τ per task and drafter — {target}",
                      "Acceptance length τ (tau micro: new tokens / target forwards) of every drafter setting on each task; "
                      "whiskers: its 95% bootstrap interval over prompts; the dashed line is AR (τ = 1).", _finish(fig, f"τ per task — {target}")))
    fig, (ax,) = _new(width, 4.4)
    paired = table[table["n_paired"] > 0]
    if len(paired):
        _grouped_bars(ax, paired, "decode_speedup", tasks, "{:.2f}×")
        ax.axhline(1.0, linestyle="--", color="0.4", linewidth=1.0, label="AR (1.0×)")
        ax.set_ylabel("decode speedup vs AR (×, ratio of sums)")
        _legend(ax, len(dict.fromkeys(paired["label"])))
    else:
        ax.axis("off")
        ax.text(0.5, 0.5, "no drafter row is paired with an AR baseline row", ha="center", va="center", transform=ax.transAxes)
    out.append(Figure(f"speedup_by_task_{stem}", f"Decode speedup per task — {target}",
                      "Measured decode speedup (prefill excluded, ratio of summed throughput) over the AR baseline on the "
                      "same prompts and machine; settings without a paired AR row are left out.",
                      _finish(fig, f"Decode speedup per task — {target}" + _shared(df))))
    return out


_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "D", "^", "v", "P", "X")


def budget_curves(target: str, df: pd.DataFrame, stem: str) -> list[Figure]:
    series = plots.series_of(df)
    families = budget_families(series)
    if not families:
        return []
    baseline = plots.baseline_rows(series)
    tasks = _tasks(df)
    fig, axes = _new(12.0, 4.6, ncols=2)
    lines = 0
    for f, (drafter, option, points) in enumerate(families):
        color = points[0][1].color
        for t, task in enumerate(tasks):
            xs, taus, speeds = [], [], []
            for value, s in points:
                rows = s.rows[s.rows["task"].astype(str) == task]
                if rows.empty:
                    continue
                xs.append(value)
                taus.append(report.tau_micro(rows))
                speeds.append(report.speedups(report.pair_with_baseline(rows, baseline))["decode_speedup_sum"])
            if len(xs) < 2:
                continue
            lines += 1
            style = dict(color=color, linestyle=_STYLES[t % len(_STYLES)], marker=_MARKERS[f % len(_MARKERS)], markersize=4)
            label = f"{drafter} ({option}) · {task}"
            axes[0].plot(xs, taus, label=label, **style)
            if np.isfinite(speeds).any():
                axes[1].plot(xs, speeds, label=label, **style)
    if not lines:
        return []
    ticks = sorted({v for _, _, points in families for v, _ in points})
    for ax, ylabel in ((axes[0], "τ"), (axes[1], "decode speedup vs AR (×)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("option value (log scale): " + ", ".join(sorted({o for _, o, _ in families})))
        ax.set_ylabel(ylabel)
        ax.axhline(1.0, color="0.5", linewidth=0.8)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return [Figure(f"budget_{stem}", f"τ and speedup against the budget — {target}",
                   "τ and decode speedup of every drafter whose settings differ in one numeric option (its node budget, "
                   "depth or draft length), one line per task.", _finish(fig, f"τ and speedup against the budget — {target}" + _shared(df)))]


def learning_curves(target: str, df: pd.DataFrame, stem: str) -> list[Figure]:
    out = []
    for task, group in df.groupby("task", sort=True):
        series = adaptive_series(plots.series_of(group))
        if not series:
            continue
        fig, (ax,) = _new(8.0, 4.2)
        for s in series:
            curve = learning_curve(s.rows)
            ax.plot(curve["index"], curve["tau"], color=s.color, alpha=0.35, linewidth=0.8)
            window = max(1, min(8, len(curve) // 4))
            ax.plot(curve["index"], curve["tau"].rolling(window, min_periods=1).mean(), color=s.color, linewidth=2.0,
                    label=f"{s.label} (mean of {window})")
        ax.set_xlabel("prompt (and turn) in run order")
        ax.set_ylabel("τ of that prompt")
        ax.legend(fontsize=7, frameon=False)
        out.append(Figure(f"learning_{stem}_{plots.sanitize(task)}", f"Learning curve of the adaptive drafter — {target} · {task}",
                          "τ of every prompt in the order the run met them (thin) and its running mean (thick): an adaptive "
                          "drafter that learns shows a rising curve.", _finish(fig, f"Learning curve — {target} · {task}")))
    return out


def per_target(df: pd.DataFrame) -> Iterable[tuple[str, str, pd.DataFrame]]:
    """(target, file-safe stem, rows) for each target, stems unique."""
    used: set[str] = set()
    for target, group in df.groupby("target", sort=True):
        stem, k = plots.sanitize(target), 2
        while stem in used:
            stem, k = f"{plots.sanitize(target)}-{k}", k + 1
        used.add(stem)
        yield str(target), stem, group


__all__ = ["Figure", "adaptive_series", "budget_curves", "budget_families", "learning_curve", "learning_curves",
           "per_target", "per_task", "tau_and_speedup_by_task"]
