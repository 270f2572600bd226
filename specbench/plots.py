"""Paper-style PNG figures of result files, one set per (target, task).

* ``acceptance_<target>_<task>.png``: per-depth acceptance P(accepted >= d) vs d, one line per
  drafter configuration.
* ``accepted_hist_<target>_<task>.png``: the share of steps per accepted length, grouped bars.
* ``speedup_<target>_<task>.png``: decode speedup (ratio of sums) and tau side by side, the AR
  baseline at 1.0 dashed, tau with whiskers for its 95% bootstrap interval over prompts; drafters with no paired baseline are left out (the subtitle names them).
* ``time_breakdown_<target>_<task>.png``: mean seconds per step (draft / verify / other), stacked.

Every number comes from :mod:`specbench.report`; this module only groups rows and draws. A series
is one (drafter, drafter_config, run settings) group, the same grouping as ``report.compare``, with
a (prompt, turn) run twice counted once. Figures are drawn on Agg canvases without pyplot, so
importing this module changes no global matplotlib state.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from specbench import report
from specbench.errors import UserError
from specbench.outputs import check_folder

DPI = 150
MAX_WIDTH_IN = 19.0  # the widest figure (2,850 px at DPI)
# behind a bar's value label: it stays readable where it sits on the dashed AR line (a 0.89x bar under 1.0x)
LABEL_BOX = {"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85}
SERIES_KEYS = ["drafter", "drafter_config", *report.SETTING_COLUMNS]

# Short names for run settings that vary inside one figure (they go into the series labels).
_SETTING_LABELS = {
    "temperature": "T",
    "top_p": "top-p",
    "top_k": "top-k",
    "seed": "seed",
    "max_new_tokens": "max-new",
    "device": "device",
    "device_name": "hw",
    "dtype": "dtype",
}
_PALETTE = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
    "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
]
_BASELINE_COLOR = "#9a9a9a"
_PHASES = (("draft", "draft_s", "#4c72b0"), ("verify", "verify_s", "#dd8452"), ("other", "other_s", "#b5b5b5"))


@dataclass(frozen=True)
class Series:
    """One line / bar group of a figure: the rows of one drafter configuration."""

    label: str
    drafter: str
    config: str
    rows: pd.DataFrame
    color: str

    @property
    def is_baseline(self) -> bool:
        return self.drafter == report.BASELINE_DRAFTER


# --------------------------------------------------------------------------------------------
# grouping and labels


def sanitize(name: Any) -> str:
    """A file-name-safe version of a target or task name (``org/model`` -> ``org_model``)."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._-")
    return text or "unnamed"


def _value_text(value: Any, limit: int = 24) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 5  # both ends: checkpoint names differ at the end (...-e5-v8k against ...-e7-v8k)
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


def _parse_config(config: str) -> dict[str, Any]:
    try:
        parsed = json.loads(config)
    except (TypeError, ValueError):
        return {"config": config}
    return parsed if isinstance(parsed, dict) else {"config": config}


def _differing_options(configs: list[str]) -> list[str]:
    """Option names whose value differs between these configs of one drafter (sorted)."""
    parsed = [_parse_config(c) for c in configs]
    keys = sorted({k for p in parsed for k in p})
    return [
        k for k in keys
        if len({json.dumps(p.get(k, "<unset>"), sort_keys=True, default=str) for p in parsed}) > 1
    ]


def series_of(df: pd.DataFrame) -> list[Series]:
    """The series of one (target, task) frame: the AR baseline first, then drafters by name.

    A label is the drafter name plus the options that differ from the drafter's other configs
    here and the run settings that vary in the frame, e.g. ``ngram (num_draft=4, T=0.7)``.
    A (prompt, turn) read twice counts once (the first row), except in the AR baseline's series,
    which keeps one row per baseline run so that each drafting run can pair with its own.
    """
    if df.empty:
        return []
    varying = [c for c in report.SETTING_COLUMNS if df[c].nunique(dropna=False) > 1]
    configs_by_drafter = {
        d: sorted(g["drafter_config"].astype(str).unique()) for d, g in df.groupby("drafter")
    }
    differing = {d: _differing_options(c) for d, c in configs_by_drafter.items()}

    groups = []
    for key, group in df.groupby(SERIES_KEYS, sort=True, dropna=False):
        fields = dict(zip(SERIES_KEYS, key))
        once = ["prompt_id", "turn"]
        if fields["drafter"] == report.BASELINE_DRAFTER and "run_id" in group.columns:
            once.append("run_id")  # every run's baseline: a drafting run pairs with its own (report.pair_with_baseline)
        group = group.drop_duplicates(once, keep="first").reset_index(drop=True)
        options = _parse_config(str(fields["drafter_config"]))
        # an option as compare writes it (a path by its last part), shortened in the middle past 24 characters
        parts = [f"{k}={_value_text(report.option_text(options.get(k, '-')))}" for k in differing[fields["drafter"]]]
        parts += [f"{_SETTING_LABELS[c]}={_value_text(fields[c])}" for c in varying]
        label = fields["drafter"] + (f" ({', '.join(parts)})" if parts else "")
        groups.append((fields["drafter"] != report.BASELINE_DRAFTER, fields["drafter"], label, fields, group))
    groups.sort(key=lambda g: (g[0], g[1], report.natural_key(g[2])))  # num_draft=2 before 10, as compare orders

    out: list[Series] = []
    seen: dict[str, int] = {}
    n_colored = 0
    for is_drafter, drafter, label, fields, group in groups:
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:  # cannot happen with distinct keys, but never merge two series
            label = f"{label} #{seen[label]}"
        if is_drafter:
            color = _PALETTE[n_colored % len(_PALETTE)]
            n_colored += 1
        else:
            color = _BASELINE_COLOR
        out.append(Series(label, drafter, str(fields["drafter_config"]), group, color))
    return out


def _drafting(series: list[Series]) -> list[Series]:
    return [s for s in series if not s.is_baseline]


def baseline_rows(series: list[Series]) -> pd.DataFrame | None:
    """The rows of every AR baseline series (None without one): what drafting series pair with."""
    frames = [s.rows for s in series if s.is_baseline]
    return pd.concat(frames, ignore_index=True) if frames else None


# --------------------------------------------------------------------------------------------
# the numbers behind each figure (all metrics from specbench.report)


def max_depth(series: list[Series]) -> int:
    """The deepest draft (tree depth or accepted length) any drafting series reached; at least 1."""
    deepest = 0
    for s in _drafting(series):
        for column in ("tree_depth_per_step", "accepted_per_step"):
            values = report._per_step(s.rows, column)
            if values.size:
                deepest = max(deepest, int(values.max()))
    return max(deepest, 1)


def acceptance_curves(series: list[Series]) -> tuple[list[int], dict[str, list[float]]]:
    """(depths 1..max_depth, {label: [P(accepted >= d) for each depth]}) of the drafting series."""
    depth = max_depth(series)
    curves = {s.label: report.accept_at_least(s.rows, depth) for s in _drafting(series)}
    return list(range(1, depth + 1)), curves


def accepted_fractions(series: list[Series]) -> pd.DataFrame:
    """Share of steps per accepted length (index 0..max, one column per drafting series)."""
    counts = {s.label: report.accepted_histogram(s.rows) for s in _drafting(series)}
    if not counts:
        return pd.DataFrame(index=pd.RangeIndex(0, name="accepted"))
    longest = max(len(c) for c in counts.values())
    index = pd.RangeIndex(max(longest, 1), name="accepted")
    out = {}
    for label, c in counts.items():
        c = c.reindex(index, fill_value=0).astype(float)
        total = c.sum()
        out[label] = c / total if total > 0 else c * math.nan
    return pd.DataFrame(out, index=index)


def speedup_bars(series: list[Series]) -> tuple[pd.DataFrame, list[str]]:
    """(one row per paired drafting series: label, decode_speedup_sum, tau, tau_lo, tau_hi (the 95%
    bootstrap interval over prompts, :func:`report.tau_interval`), n_paired; the labels left out for
    having no paired AR row)."""
    baseline = baseline_rows(series)
    records, omitted = [], []
    for s in _drafting(series):
        pairs = report.pair_with_baseline(s.rows, baseline)
        if pairs.empty:
            omitted.append(s.label)
            continue
        records.append({
            "label": s.label,
            "decode_speedup_sum": report.speedups(pairs)["decode_speedup_sum"],
            "tau": report.tau_micro(s.rows),
            **dict(zip(("tau_lo", "tau_hi"), report.tau_interval(s.rows))),
            "n_paired": int(len(pairs)),
        })
    columns = ["label", "decode_speedup_sum", "tau", "tau_lo", "tau_hi", "n_paired"]
    return pd.DataFrame.from_records(records, columns=columns), omitted


def time_breakdown(series: list[Series]) -> pd.DataFrame:
    """Mean seconds per step by phase (columns draft, verify, other), one row per series incl. AR."""
    records = {
        s.label: {phase: report.seconds_per_step(s.rows, column) for phase, column, _ in _PHASES}
        for s in series
    }
    return pd.DataFrame.from_dict(records, orient="index", columns=[p for p, _, _ in _PHASES])


# --------------------------------------------------------------------------------------------
# drawing


def caption(df: pd.DataFrame) -> str:
    """target · task · device (hardware) · temperature · prompts, for the subtitle of a figure."""
    devices = []
    for (device, name), _ in df.groupby(["device", "device_name"], sort=True, dropna=False):
        name = _value_text(name, 44)
        devices.append(f"{device} ({name})" if name and name != str(device) else str(device))
    temps = sorted({float(t) for t in df["temperature"]})
    temp = "T=" + ", ".join(f"{t:g}" for t in temps) + (" (greedy)" if temps == [0.0] else "")
    n_prompts = int(df["prompt_id"].nunique())
    return " · ".join([
        f"target {df['target'].iloc[0]}",
        f"task {df['task'].iloc[0]}",
        "device " + "; ".join(devices),
        temp,
        f"{n_prompts} prompt{'s' if n_prompts != 1 else ''}",
    ])


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    return fig, axes


def _save(fig: Figure, title: str, subtitle: str, path: Path) -> Path:
    width, height = fig.get_size_inches()
    lines = _wrap_fields(subtitle, max(40, int(width * 16)))
    fig.text(0.5, 1 - 0.18 / height, title, ha="center", va="top", fontsize=12, weight="bold")
    fig.text(0.5, 1 - 0.45 / height, "\n".join(lines), ha="center", va="top", fontsize=8.5,
             color="0.3", linespacing=1.3)
    header = 0.55 + 0.16 * len(lines)
    fig.tight_layout(rect=(0, 0, 1, 1 - header / height))
    if _slant_crowded_ticks(fig):
        fig.tight_layout(rect=(0, 0, 1, 1 - header / height))
    try:
        fig.savefig(path, dpi=DPI, format=Path(path).suffix.lstrip(".").lower() or "png", facecolor="white")
    except OSError as e:
        raise UserError(f"cannot write {path} ({e.strerror or e}); choose another --out-dir") from None
    return path


def _slot_in(tick_labels: list[str], least: float) -> float:
    """Inches a bar needs for its 8-pt tick label's longest line (about 0.065 in a character), at least ``least``;
    where the figure cannot grow that wide, :func:`_save` slants the labels that overlap."""
    longest = max((len(line) for label in tick_labels for line in label.splitlines()), default=0)
    return max(least, 0.065 * longest + 0.15)


def _slant_crowded_ticks(fig: Figure) -> bool:
    """Slant the x tick labels of every axis where two neighbours overlap as drawn; whether any did."""
    renderer = fig.canvas.get_renderer()
    slanted = False
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
        if any(left.x1 > right.x0 for left, right in zip(boxes, boxes[1:])):
            for t in labels:
                t.set_rotation(30)
                t.set_horizontalalignment("right")
                t.set_rotation_mode("anchor")
            slanted = True
    return slanted


def _wrap_fields(text: str, width: int) -> list[str]:
    """Wrap a `` · ``-separated caption between its fields where possible."""
    lines: list[str] = []
    for field in text.split(" · "):
        if lines and len(lines[-1]) + 3 + len(field) <= width:
            lines[-1] += " · " + field
        else:
            lines.extend(textwrap.wrap(field, width) or [""])
    return lines or [""]


def _empty(ax, message: str) -> None:
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="0.4", fontsize=11)


def _tick_label(label: str) -> str:
    """One option per line ("ngram\n(branches=1,\nnum_draft=7)"), so neighbouring ticks never overlap."""
    head, sep, opts = label.partition(" (")
    if not sep:
        return textwrap.fill(label, 14)
    return head + "\n(" + ",\n".join(o.strip() for o in opts.split(","))


def plot_acceptance(series: list[Series], subtitle: str, path: Path) -> Path:
    depths, curves = acceptance_curves(series)
    fig, (ax,) = _figure(7.0, 4.6)
    colors = {s.label: s.color for s in series}
    for label, values in curves.items():
        ax.plot(depths, values, marker="o", markersize=4, linewidth=1.8, color=colors[label], label=label)
    if curves:
        ax.set_xticks(depths)
        ax.set_xlim(0.7, depths[-1] + 0.3)
        ax.set_ylim(-0.02, 1.04)
        ax.set_xlabel("draft depth d (tokens)")
        ax.set_ylabel("P(accepted ≥ d)  (share of steps)")
        ax.legend(title="drafter", fontsize=8, title_fontsize=8, loc="best", framealpha=0.9)
    else:
        _empty(ax, "no drafter besides the AR baseline")
    return _save(fig, "Per-depth acceptance", subtitle, path)


def plot_accepted_hist(series: list[Series], subtitle: str, path: Path) -> Path:
    fractions = accepted_fractions(series)
    n_bins = len(fractions.index)
    fig, (ax,) = _figure(min(10.0, max(6.5, 2.5 + 0.3 * n_bins * max(1, len(fractions.columns)))), 4.6)
    colors = {s.label: s.color for s in series}
    if len(fractions.columns):
        width = 0.8 / len(fractions.columns)
        x = np.arange(n_bins)
        for i, label in enumerate(fractions.columns):
            offset = (i - (len(fractions.columns) - 1) / 2) * width
            ax.bar(x + offset, fractions[label].to_numpy(), width=width, color=colors[label], label=label)
        ax.set_xticks(x)
        ax.set_xticklabels([str(i) for i in fractions.index])
        ax.set_xlim(-0.6, n_bins - 0.4)
        ax.set_ylim(0, 1.04)
        ax.set_xlabel("accepted draft tokens per step (bonus token excluded)")
        ax.set_ylabel("fraction of steps")
        ax.legend(title="drafter", fontsize=8, title_fontsize=8, loc="best", framealpha=0.9)
    else:
        _empty(ax, "no drafter besides the AR baseline")
    return _save(fig, "Accepted length per step", subtitle, path)


def interval_whiskers(ax, x, values, lo, hi, capsize: float, linewidth: float, label: str | None = None) -> np.ndarray:
    """Whiskers from ``lo`` to ``hi`` on the bars at ``x`` (tau's bootstrap interval, where it is
    finite); returns where each bar's value label should sit: the whisker's top, or the bar's."""
    values = np.asarray(values, dtype=float)
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    has = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(values)
    if not has.any():
        return values
    ax.errorbar(np.asarray(x)[has], values[has], yerr=[values[has] - lo[has], hi[has] - values[has]], fmt="none",
                ecolor="0.2", elinewidth=linewidth, capsize=capsize, label=label)
    return np.where(has, hi, values)


def plot_speedup(series: list[Series], subtitle: str, path: Path) -> Path:
    bars, omitted = speedup_bars(series)
    n = len(bars)
    labels = [_tick_label(lab) for lab in bars["label"]]
    fig, axes = _figure(min(MAX_WIDTH_IN, max(8.0, 2.0 + 2 * n * _slot_in(labels, 0.8))), 4.6, ncols=2 if n else 1)
    colors = {s.label: s.color for s in series}
    if omitted:
        subtitle += " · no paired AR baseline, left out: " + ", ".join(omitted)
    if n:
        low, high = int(bars["n_paired"].min()), int(bars["n_paired"].max())
        subtitle += f" · {low if low == high else f'{low}–{high}'} rows paired with AR"
        x = np.arange(n)
        color = [colors[lab] for lab in bars["label"]]
        panels = (
            ("decode_speedup_sum", "Decode speedup vs AR", "decode speedup (×, ratio of sums)",
             "AR baseline (1.0×)", "{:.2f}×"),
            ("tau", "Acceptance length τ", "τ (committed tokens per target forward)",
             "AR (τ = 1)", "{:.2f}"),
        )
        for ax, (column, title, ylabel, base_label, fmt) in zip(axes, panels):
            values = bars[column].to_numpy(dtype=float)
            ax.bar(x, values, width=0.6, color=color)
            tops = values
            if column == "tau":
                tops = interval_whiskers(ax, x, values, bars["tau_lo"], bars["tau_hi"], capsize=4, linewidth=1.0,
                                         label="95% interval over prompts")
            for xi, value, top_i in zip(x, values, tops):
                ax.annotate("-" if not np.isfinite(value) else fmt.format(value),
                            (xi, top_i if np.isfinite(top_i) else 0.0), xytext=(0, 2),
                            textcoords="offset points", ha="center", va="bottom", fontsize=8, bbox=LABEL_BOX)
            ax.axhline(1.0, linestyle="--", color="0.35", linewidth=1.2, label=base_label)
            finite = tops[np.isfinite(tops)]
            top = max([1.0, *finite]) if finite.size else 1.0
            ax.set_ylim(0, top * 1.18)
            ax.set_xticks(x)
            ax.set_xticklabels(labels, fontsize=8)
            ax.set_xlim(-0.7, n - 0.3)
            ax.set_title(title, fontsize=10, pad=20)
            ax.set_ylabel(ylabel)
            # one row between the title and the bars, where no value label can be
            ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False,
                      borderaxespad=0.2)
    else:
        _empty(axes[0], "no drafter has a paired AR baseline")
    return _save(fig, "Speedup and acceptance length", subtitle, path)


def plot_time_breakdown(series: list[Series], subtitle: str, path: Path) -> Path:
    table = time_breakdown(series)
    n = len(table)
    baseline = {s.label for s in series if s.is_baseline}
    ticks = [_tick_label(lab) + ("\n(baseline)" if lab in baseline else "") for lab in table.index]
    fig, (ax,) = _figure(min(MAX_WIDTH_IN, max(6.0, 2.5 + n * _slot_in(ticks, 1.3))), 4.6)
    x = np.arange(n)
    bottom = np.zeros(n)
    for phase, _, color in _PHASES:
        values = table[phase].to_numpy(dtype=float) * 1000.0
        values = np.where(np.isfinite(values), values, 0.0)
        ax.bar(x, values, width=0.6, bottom=bottom, color=color, label=phase)
        bottom = bottom + values
    ax.bar_label(ax.containers[-1], labels=[f"{v:.1f} ms" for v in bottom], padding=2, fontsize=8)
    ax.set_ylim(0, max(bottom.max() if n else 0.0, 1e-9) * 1.18)
    ax.set_xticks(x)
    ax.set_xticklabels(ticks, fontsize=8)
    ax.set_xlim(-0.7, n - 0.3)
    ax.set_ylabel("mean time per step (ms)")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], title="phase", fontsize=8, title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(fig, "Time per decode step", subtitle, path)


# --------------------------------------------------------------------------------------------
# entry point


# The figures drawn from timings, and what their subtitle adds when a run behind them shared the CPU
# (report.shared_cpu_note): tau and acceptance do not depend on the machine's load, speedups do.
TIMED_FIGURES = ("speedup", "time_breakdown")
SHARED_CPU_SUBTITLE = " · TIMED ON A SHARED CPU: speedups and times unreliable"


def subtitle(rows: pd.DataFrame, kind: str) -> str:
    """The subtitle of a (target, task) figure of ``kind``: its :func:`caption`, plus the shared-CPU warning on
    the timed kinds when a run behind ``rows`` shared the CPU."""
    shared = kind in TIMED_FIGURES and report.shared_cpu_note(rows) is not None
    return caption(rows) + (SHARED_CPU_SUBTITLE if shared else "")


FIGURES = (
    ("acceptance", plot_acceptance),
    ("accepted_hist", plot_accepted_hist),
    ("speedup", plot_speedup),
    ("time_breakdown", plot_time_breakdown),
)


def make_figures(df: pd.DataFrame, out_dir: Path | str, allow_mixed: bool = False) -> list[Path]:
    """Write the four figures for every (target, task) in ``df`` to ``out_dir``; returns the paths.

    Data from several devices (or machines) is refused unless ``allow_mixed``, as in
    ``report.compare``; a setting that varies (device included) then shows in the series labels.
    """
    report._check_devices(df, allow_mixed)
    if df.empty:
        raise UserError("the results files hold no rows; nothing to plot")
    out_dir = Path(out_dir)
    check_folder(out_dir, "--out-dir", "figures")

    written: list[Path] = []
    used: set[str] = set()
    for (target, task), group in df.groupby(["target", "task"], sort=True, dropna=False):
        stem = f"{sanitize(target)}_{sanitize(task)}"
        base, k = stem, 2
        while stem in used:  # two names that sanitize alike
            stem, k = f"{base}-{k}", k + 1
        used.add(stem)
        series = series_of(group)
        for kind, draw in FIGURES:
            written.append(draw(series, subtitle(group, kind), out_dir / f"{kind}_{stem}.png"))
    return written


__all__ = [
    "Series",
    "acceptance_curves",
    "accepted_fractions",
    "caption",
    "interval_whiskers",
    "make_figures",
    "max_depth",
    "sanitize",
    "series_of",
    "speedup_bars",
    "subtitle",
    "time_breakdown",
]
