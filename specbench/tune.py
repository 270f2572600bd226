"""`specbench tune`: the best node budget of one drafter per device, measured here and projected.

A budget sweep is a sweep (:mod:`specbench.sweep`): :func:`write_sweep` writes it as a sweep file
(``<results_dir>/tune_<target>_<task>_<drafter>.toml``, so ``specbench sweep`` can rerun or extend
it), and the sweep machinery runs it: finished cells are reused, interrupted ones resume, and one AR
baseline is shared by every budget. :func:`collect` then reads each cell's rows and computes, per
budget,

* tau (micro: tokens per target forward) — hardware-free;
* the measured decode speedup on this device (ratio of sums against the paired AR baseline; none
  with ``--no-baseline``);
* the projected decode speedup on each ``--hardware`` profile (:mod:`specbench.hardware.project`,
  the ratio of sums from the run's own per-step logs),

and, per device, the budget with the highest speedup (ties: the smaller budget). :func:`plot_tune`
draws tau and speedup against the budget with every device's optimum marked.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbench import report, runner, sweep
from specbench.errors import UserError
from specbench.outputs import check_folder, write_atomic

# the option a drafter's budget lives in, in order of preference (every budget counts the root,
# except ngram / draft-model's num_draft, which counts the drafts)
BUDGET_KEYS = ("budget", "total_tokens", "num_draft")
MEASURED = "measured"


@dataclass(frozen=True)
class TuneSpec:
    drafter: str
    task: str | None
    budgets: tuple[int, ...]
    hardware: tuple[str, ...] = ()
    target: str = "smollm2-135m"
    task_file: Path | None = None
    category: str | None = None
    limit: int = 10
    seed: int = 0
    max_new_tokens: int = 128
    temperature: float = 0.0
    options: tuple[str, ...] = ()  # fixed --set key=value, the same at every budget
    drafter_path: Path | None = None
    budget_key: str | None = None  # None: the drafter's own (BUDGET_KEYS)
    results_dir: Path = Path("results")
    baseline: bool = True
    device: str = "auto"
    dtype: str = "auto"
    executor: str = "local"


@dataclass
class TuneResult:
    spec: TuneSpec
    budget_key: str
    sweep_file: Path
    devices: list[str]  # "measured" (when a baseline was paired) then each profile
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per budget
    best: list[dict[str, Any]] = field(default_factory=list)  # one per device

    def as_json(self) -> dict[str, Any]:
        return {"drafter": self.spec.drafter, "target": self.spec.target, "task": task_label(self.spec),
                "budget_key": self.budget_key, "sweep_file": str(self.sweep_file),
                "budgets": self.rows, "best": self.best}


def parse_budgets(text: str) -> tuple[int, ...]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--budgets '{text}' must be comma-separated integers, e.g. 16,32,64,128") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"--budgets '{text}' must list positive integers, e.g. 16,32,64,128")
    if len(set(values)) != len(values):
        raise UserError(f"--budgets '{text}' lists a budget twice")
    return tuple(sorted(values))


def budget_key(spec: TuneSpec) -> str:
    """The drafter option the budget goes into; a one-line UserError when it has none."""
    from specbench.drafter import drafter_class

    fields = [f.name for f in dataclasses.fields(drafter_class(spec.drafter).Config)]
    if spec.budget_key is not None:
        if spec.budget_key not in fields:
            raise UserError(f"drafter '{spec.drafter}' has no option '{spec.budget_key}' for --budget-key; "
                            f"its options: {', '.join(fields) or 'none'}")
        return spec.budget_key
    for key in BUDGET_KEYS:
        if key in fields:
            return key
    raise UserError(f"drafter '{spec.drafter}' has no budget option ({', '.join(BUDGET_KEYS)}); "
                    f"name one with --budget-key (its options: {', '.join(fields) or 'none'})")


def task_label(spec: TuneSpec) -> str:
    return runner.task_name(runner.RunSpec(task=spec.task, task_file=spec.task_file, category=spec.category))


def file_stem(spec: TuneSpec) -> str:
    """The stem of the tune's sweep file and figure: tune_<target>_<task>_<drafter>."""
    return sweep.safe_name(f"tune_{spec.target}_{task_label(spec)}_{spec.drafter}")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def sweep_text(spec: TuneSpec, key: str) -> str:
    """The budget sweep as a sweep file (TOML)."""
    fixed: dict[str, Any] = {}
    for pair in spec.options:
        k, sep, v = pair.partition("=")
        if not sep or not k.strip():
            raise UserError(f"--set '{pair}' must be key=value")
        if k.strip() == key:
            raise UserError(f"--set {pair}: the budget option '{key}' is what --budgets varies; drop it")
        fixed[k.strip()] = v.strip()
    task: dict[str, Any] = {"limit": spec.limit, "max_new_tokens": spec.max_new_tokens}
    if spec.task_file is not None:
        task["file"] = str(spec.task_file)
    else:
        task["name"] = spec.task
    if spec.category is not None:
        task["category"] = spec.category
    entry: dict[str, Any] = {"drafter": spec.drafter, "set": {key: list(spec.budgets), **fixed},
                             "label": f"{spec.drafter}-{key}{{{key}}}"}
    if spec.drafter_path is not None:
        entry["path"] = str(spec.drafter_path)
    top = {"name": f"tune {spec.drafter} on {spec.target} · {task_label(spec)}", "results_dir": str(spec.results_dir),
           "executor": spec.executor, "targets": [spec.target], "tasks": [task], "temperatures": [spec.temperature],
           "seeds": [spec.seed], "limit": spec.limit, "max_new_tokens": spec.max_new_tokens, "baseline": spec.baseline,
           "device": spec.device, "dtype": spec.dtype}
    lines = ["# written by `specbench tune`; `specbench sweep THIS_FILE` reruns (or continues) the same cells"]
    lines += [f"{k} = {_toml(v)}" for k, v in top.items()]
    lines += ["", "[[drafters]]"] + [f"{k} = {_toml(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def write_sweep(spec: TuneSpec) -> tuple[sweep.Sweep, str, Path]:
    """Check ``spec``, write its sweep file and load it (every problem is one UserError)."""
    from specbench.hardware.profiles import get_profile

    if spec.limit < 0:
        raise UserError(f"--limit must be >= 0 (0 = all prompts), got {spec.limit}")
    for name in spec.hardware:
        get_profile(name)  # unknown profiles fail before any run
    key = budget_key(spec)
    text = sweep_text(spec, key)
    path = Path(spec.results_dir) / f"{file_stem(spec)}.toml"
    try:  # every cell checked before the file is written: a typo must not replace an earlier tune's sweep file
        plan = sweep.parse_sweep(text, path)
    except sweep.CellError as exc:
        raise UserError(exc.reason) from None  # in the options the user typed, not the generated file's cells
    check_folder(path.parent, "--results-dir", "the sweep file")
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise UserError(f"cannot write {path} ({exc.strerror or exc}); choose another --results-dir") from None
    return plan, key, path


def _budget_of(cell: sweep.Cell, key: str) -> int:
    for pair in cell.spec.options:
        k, _, v = pair.partition("=")
        if k == key:
            return int(v)
    raise AssertionError(f"cell {cell.name} has no {key}")


def _best(rows: list[dict], column: str) -> dict | None:
    """The row with the highest finite ``column``; ties go to the first (the smaller budget)."""
    best = None
    for row in rows:
        value = row.get(column)
        if value is None or not math.isfinite(value):
            continue
        if best is None or value > best[column]:
            best = row
    return best


def collect(plan: sweep.Sweep, spec: TuneSpec, key: str, sweep_file: Path) -> TuneResult:
    """Per budget: tau, measured and projected speedups; per device: the best budget."""
    from specbench import results
    from specbench.hardware.project import project_rows

    rows: list[dict[str, Any]] = []
    for cell in plan.cells:
        if not cell.out.exists():
            continue  # a failed cell: reported by the sweep, left out here
        df = results.read_results([cell.out])
        base = None
        if spec.baseline and not df.empty:
            first = df.iloc[0]
            meta = {c: first[c] for c in ("target", "task", "temperature", "seed", "device", "dtype", "max_new_tokens",
                                          "top_p", "top_k", "device_name") if c in df.columns}
            meta["keys"] = {(str(p), int(t)) for p, t in zip(df["prompt_id"], df["turn"])}
            base = report.find_baseline(Path(spec.results_dir), meta)
        summary = report.run_summary(df, base)
        row: dict[str, Any] = {"budget": _budget_of(cell, key), "file": str(cell.out), "n_prompts": summary["n_prompts"],
                               "tau": summary["tau_micro"], "mean_tree_size": _mean_tree(df),
                               "measured_decode_speedup_sum": summary["decode_speedup_sum"] if base is not None else None,
                               "measured_decode_speedup_mean": summary["decode_speedup_mean"] if base is not None else None,
                               "lossless": summary["lossless"], "projected": {}}
        for name in spec.hardware:
            p = project_rows(df, name)
            row["projected"][name] = {"decode_speedup_sum": p.speedup_sum, "decode_speedup_mean": p.speedup_mean}
        rows.append(row)
    rows.sort(key=lambda r: r["budget"])
    devices = ([MEASURED] if any(r["measured_decode_speedup_sum"] is not None for r in rows) else []) + list(spec.hardware)
    best = []
    for device in devices:
        flat = [{"budget": r["budget"], "speedup": speedup_of(r, device), "tau": r["tau"]} for r in rows]
        top = _best(flat, "speedup")
        best.append({"device": device, "kind": MEASURED if device == MEASURED else "projected",
                     "best_budget": None if top is None else top["budget"],
                     "decode_speedup_sum": None if top is None else top["speedup"],
                     "tau": None if top is None else top["tau"]})
    return TuneResult(spec, key, sweep_file, devices, rows, best)


def _mean_tree(df: pd.DataFrame) -> float | None:
    sizes = [int(n) for steps in df["tree_size_per_step"] for n in steps]
    return sum(sizes) / len(sizes) if sizes else None


def speedup_of(row: dict, device: str) -> float | None:
    """A budget row's decode speedup (ratio of sums) on ``device`` ("measured" or a profile); None if unknown."""
    if device == MEASURED:
        return row["measured_decode_speedup_sum"]
    value = row["projected"].get(device, {}).get("decode_speedup_sum")
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def plot_tune(result: TuneResult, path: Path, machine: str = "") -> Path:
    """tau (left) and decode speedup (right) against the budget; each device's optimum is a star."""
    from specbench.plots import _figure, _save

    fig, (ax_tau, ax_speed) = _figure(10.0, 4.4, ncols=2)
    budgets = [r["budget"] for r in result.rows]
    ax_tau.plot(budgets, [r["tau"] for r in result.rows], marker="o", color="0.2", linewidth=1.8)
    ax_tau.set_xlabel(f"budget ({result.budget_key})")
    ax_tau.set_ylabel("tau (tokens per target forward)")
    ax_tau.set_title("tau (hardware-free)", fontsize=10)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
    for i, device in enumerate(result.devices):
        ys = [speedup_of(r, device) for r in result.rows]
        xs = [b for b, y in zip(budgets, ys) if y is not None]
        ys = [y for y in ys if y is not None]
        if not ys:
            continue
        if device == MEASURED:
            label = f"measured ({machine})" if machine else "measured"
        else:
            label = f"{device} (projected)"
        color = colors[i % len(colors)]
        ax_speed.plot(xs, ys, marker="o", linewidth=1.8, color=color, label=label,
                      linestyle="-" if device == MEASURED else "--")
        best = next(b for b in result.best if b["device"] == device)
        if best["best_budget"] is not None:
            ax_speed.plot([best["best_budget"]], [best["decode_speedup_sum"]], marker="*", markersize=16,
                          color=color, markeredgecolor="black", linestyle="none", zorder=5)
            ax_speed.annotate(f"{best['best_budget']}", (best["best_budget"], best["decode_speedup_sum"]),
                              textcoords="offset points", xytext=(6, 6), fontsize=8, color=color)
    ax_speed.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    ax_speed.set_xlabel(f"budget ({result.budget_key})")
    ax_speed.set_ylabel("decode speedup over AR")
    ax_speed.set_title("speedup (★ = the best budget per device)", fontsize=10)
    for ax in (ax_tau, ax_speed):
        if len(budgets) > 1 and budgets[-1] / budgets[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(budgets)
        ax.set_xticklabels([str(b) for b in budgets])
    if ax_speed.get_legend_handles_labels()[0]:
        ax_speed.legend(fontsize=8, frameon=False)
    spec = result.spec
    n = max((r["n_prompts"] for r in result.rows), default=0)
    subtitle = (f"{spec.target} · {task_label(spec)} · {n} prompts · T={spec.temperature:g} · "
                "projected speedups are model estimates (specbench/hardware), not measurements")
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, f"{spec.drafter}: tau and speedup against the budget", subtitle, path)


__all__ = ["TuneResult", "TuneSpec", "budget_key", "collect", "file_stem", "parse_budgets", "plot_tune", "speedup_of",
           "sweep_text", "task_label", "write_sweep"]
