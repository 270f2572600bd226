"""The README's "At a glance" table and figure: `python sweeps/glance.py`.

Every row is one head at 16 tree nodes on the block sweeps' prompts (10 each of humaneval, math500 and gsm8k,
5 two-turn mt-bench, at most 128 new tokens, greedy), read from the committed result files of ONE sweep, named in
the row: its tau on each task, its CPU decode speedup against the AR baseline that sweep measured beside it (the
mean of the four tasks' ratios of sums, and gsm8k's), and the mean of the four tasks' projected decode speedups on
the H100 engine profile at Qwen3-8B's step cost (`specbench compare FILES --hardware h100-sxm:engine --as-target
qwen3-8b`). A sweep without AR baselines gives "-" for the CPU column; its projection needs none. The script
writes ``reports/figures/at-a-glance.png`` and the README's table between its marker lines;
``tests/test_sweep.py`` checks that the README's table is what the committed data gives. Bold marks the highest
value of each column.

It also writes the table of issue 10's five targets (between its own marker lines): for each, every head measured
against it (a tau from one committed result file, or a held-out top-1 from a head's ``training.json``), the best of
them and the verdict by the target's rule. A head still training (its result file not there yet) is listed as
"not measured yet" and does not count; nor does a replayed snapshot of a head that never shipped, shown beside them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specbench import report, results, sweep  # noqa: E402
from specbench.hardware.project import add_projections  # noqa: E402

_spec = importlib.util.spec_from_file_location("block_r200k", Path(__file__).with_name("block_r200k.py"))
base = importlib.util.module_from_spec(_spec)  # its readme_with_table replaces the lines between two markers
_spec.loader.exec_module(base)

SWEEPS = Path(__file__).parent
FIGURE = Path("reports/figures/at-a-glance.png")
TASKS = ("humaneval", "math500", "gsm8k", "mt-bench")
PROFILE, AS_TARGET = "h100-sxm:engine", "qwen3-8b"
BEGIN = "<!-- at-a-glance table: written by `python sweeps/glance.py`; do not edit by hand -->"
END = "<!-- end of the at-a-glance table -->"
TARGETS_BEGIN = "<!-- issue 10 targets table: written by `python sweeps/glance.py`; do not edit by hand -->"
TARGETS_END = "<!-- end of the issue 10 targets table -->"


class Row(NamedTuple):
    """One head: its display name, family (the figure's colour), and the sweep and cell label it is read from."""

    name: str
    family: str
    sweep: str  # sweeps/{sweep}.toml
    label: str  # the cell label in that sweep: its files are {results_dir}/{label}-{task}.parquet
    tag: str = ""  # its name on the figure (each family's first and best heads; the rest are unnamed dots)
    outputs_from: str = ""  # a tau-only sweep: the sweep whose AR baselines (on another machine) its outputs must equal


ROWS = (
    Row("EAGLE-3 (`eagle3-...-r200k`, depth 5, top-k 4)", "eagle3", "block_r200k", "eagle3-16", "EAGLE-3 200k"),
    Row("TreeFlash (`treeflash-...-r200k`)", "treeflash", "block_r200k", "treeflash-16", "TreeFlash 200k"),
    Row("DFlash, marginal tree (`dflash-...-r200k`, gamma 7)", "dflash", "block_r200k", "dflash-marginal-16"),
    Row("JetSpec (`jetspec-...-r200k`)", "jetspec", "block_r200k", "jetspec-16", "JetSpec, DFlash 200k"),
    Row("DFlash, gamma 1 (`dflash-...-r200k-g1`, trained on an H200)", "dflash", "block_g1", "dflash-marginal-16"),
    Row("TreeFlash on the gamma-1 backbone (`treeflash-...-r200k-g1bb`)", "treeflash", "block_g1", "treeflash-16"),
    Row("JetSpec, gamma 1 (`jetspec-...-r200k-g1`)", "jetspec", "block_g1", "jetspec-16"),
    Row("EAGLE-3 at 800k tokens (`eagle3-...-r800k`)", "eagle3", "eagle3_r800k", "eagle3-r800k-16", outputs_from="block_r200k"),
    Row("EAGLE-3 at 1.6M tokens, one epoch, bf16 (`eagle3-...-r1600k-e1-bf16`)", "eagle3", "eagle3_r1600k", "eagle3-r1600k-16",
        outputs_from="block_r200k"),
    Row("EAGLE-3 at 1.6M tokens, three epochs, bf16 (`eagle3-...-r1600k-bf16`)", "eagle3", "speed_best", "eagle3-r1600k-16", "EAGLE-3 1.6M"),
    Row("DFlash, gamma 1, 8,192-id draft vocabulary (`dflash-...-r200k-g1-v8k`)", "dflash", "block_vocab", "v8k-marginal-16"),
    Row("TreeFlash on the 8,192-id gamma-1 backbone (`treeflash-...-r200k-g1bb-v8k`)", "treeflash", "treeflash_vocab", "v8k-16"),
    Row("JetSpec, gamma 1, 8,192-id draft vocabulary (`jetspec-...-r200k-g1-v8k`)", "jetspec", "jetspec_vocab", "v8k-tree-16"),
    Row("DFlash, gamma 1, 8,192 ids, 5 epochs (`dflash-...-r200k-g1-e5-v8k`)", "dflash", "dflash_epochs", "e5-marginal-16"),
    Row("TreeFlash on that 5-epoch backbone (`treeflash-...-r200k-g1bb-e5-v8k`)", "treeflash", "treeflash_epochs", "e5-16"),
    Row("JetSpec, gamma 1, 8,192 ids, 5 epochs (`jetspec-...-r200k-g1-e5-v8k`)", "jetspec", "jetspec_epochs", "e5-tree-16"),
    Row("DFlash, gamma 1, 8,192 ids, 7 epochs (`dflash-...-r200k-g1-e7-v8k`)", "dflash", "dflash_e7", "e7-marginal-16"),
    Row("TreeFlash on that 7-epoch backbone (`treeflash-...-r200k-g1bb-e7-v8k`)", "treeflash", "treeflash_e7", "e7-16", "TreeFlash e7 backbone"),
    Row("JetSpec, gamma 1, 8,192 ids, 7 epochs (`jetspec-...-r200k-g1-e7-v8k`)", "jetspec", "jetspec_e7", "e7-tree-16", "JetSpec e7"),
    Row("DFlash, gamma 1, 8,192 ids, 10 epochs (`dflash-...-r200k-g1-e10-v8k`)", "dflash", "dflash_e10", "e10-marginal-16", "DFlash e10"),
)
COLOURS = {"eagle3": "tab:blue", "treeflash": "tab:green", "dflash": "tab:orange", "jetspec": "tab:red"}


@functools.lru_cache(maxsize=None)
def _plan(name: str) -> sweep.Sweep:
    """sweeps/{name}.toml, parsed once: several rows and targets read the same sweep."""
    return sweep.load_sweep(SWEEPS / f"{name}.toml")


def measure(row: Row) -> dict:
    """The row's numbers from its sweep's committed files: ``tau`` and ``cpu`` {task: value or None}, ``projected``
    {task: value} and ``lossless``: every task's outputs equal its AR baseline's, or, for a sweep without baselines,
    those of ``row.outputs_from``'s AR baselines from another machine (`compare --lossless-across-machines`; the CPU
    column stays empty); None with neither."""
    plan = _plan(row.sweep)
    cells = {c.task_label: c for c in plan.cells if c.label == row.label}
    if set(cells) != set(TASKS):
        raise SystemExit(f"sweeps/{row.sweep}.toml has no cell {row.label!r} for every task ({', '.join(TASKS)})")
    files = [cells[t].out for t in TASKS]
    if missing := [str(f) for f in files if not f.exists()]:
        raise SystemExit(f"{row.name}: result files not measured yet: {', '.join(missing)}")
    baselines = sorted(plan.results_dir.glob("*.ar-baseline.parquet"))
    df = results.read_results(files + baselines)
    frame = add_projections(df, report.compare(df, allow_mixed=True), [PROFILE], AS_TARGET)  # each task pairs on its machine
    frame = frame[frame["drafter"] != report.BASELINE_DRAFTER].set_index("task")
    if sorted(frame.index) != sorted(TASKS):
        raise SystemExit(f"{row.name}: expected one compare row per task, got {list(frame.index)}")

    def per_task(column: str) -> dict:
        return {t: (None if pd.isna(v := frame.loc[t, column]) else float(v)) for t in TASKS}

    cpu = per_task("decode_speedup_sum")
    # an unknown verdict (None/NaN: nothing to check) is not a yes
    lossless = None if any(v is None for v in cpu.values()) else bool(frame["lossless"].eq(True).all())
    if lossless is None and row.outputs_from:
        elsewhere = sorted(_plan(row.outputs_from).results_dir.glob("*.ar-baseline.parquet"))
        drafted = df[df["drafter"] != report.BASELINE_DRAFTER]  # the row's own files, already read
        check = report.compare(pd.concat([drafted, results.read_results(elsewhere)], ignore_index=True),
                               outputs_across_machines=True)
        check = check[check["drafter"] != report.BASELINE_DRAFTER]
        lossless = len(check) == len(TASKS) and bool(check["lossless"].eq(True).all())
    return {"tau": per_task("tau"), "cpu": cpu, "projected": per_task("projected_decode_speedup_sum"), "lossless": lossless}


def _mean(values: dict) -> float | None:
    return None if any(v is None for v in values.values()) else sum(values.values()) / len(values)


def _cell(x: float | None, best: float | None, spec: str, suffix: str = "") -> str:
    if x is None:
        return "-"
    text = format(x, spec) + suffix
    return f"**{text}**" if best is not None and format(x, spec) == format(best, spec) else text


def table(measured: list[tuple[Row, dict]]) -> list[str]:
    """The README's rows: tau per task, CPU mean (gsm8k), projected mean and the sweep, best of each column bold."""
    best_tau = {t: max(m["tau"][t] for _, m in measured) for t in TASKS}
    cpu_means = [_mean(m["cpu"]) for _, m in measured]
    best_cpu = max((c for c in cpu_means if c is not None), default=None)
    best_gsm8k = max((m["cpu"]["gsm8k"] for _, m in measured if m["cpu"]["gsm8k"] is not None), default=None)
    projected = [_mean(m["projected"]) for _, m in measured]
    best_projected = max(projected)
    lines = ["| drafter (head) | tau: humaneval / math500 / gsm8k / mt-bench | decode speedup, this CPU (gsm8k) | "
             "projected, H100 engine, Qwen3-8B's step cost | sweep |", "|---|---|---:|---:|---|"]
    for (row, m), cpu, proj in zip(measured, cpu_means, projected):
        taus = " / ".join(_cell(m["tau"][t], best_tau[t], ".2f") for t in TASKS)
        speed = "-" if cpu is None else (f"{_cell(cpu, best_cpu, '.2f', 'x')} "
                                          f"({_cell(m['cpu']['gsm8k'], best_gsm8k, '.2f', 'x')})")
        lines.append(f"| {row.name} | {taus} | {speed} | {_cell(proj, best_projected, '.2f', 'x')} | `{row.sweep}` |")
    return lines


def figure(measured: list[tuple[Row, dict]]) -> None:
    """Mean tau against the mean CPU decode speedup (left) and the projected H100 speedup (right), one point per
    head, coloured by family; 1x is break-even."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharex=True)
    for ax, key, ylabel in ((axes[0], "cpu", "decode speedup over AR, this CPU (mean of 4 tasks)"),
                            (axes[1], "projected", f"projected decode speedup, {PROFILE}, as {AS_TARGET}")):
        for row, m in measured:
            y = _mean(m[key])
            if y is None:
                continue
            x = _mean(m["tau"])
            ax.scatter(x, y, color=COLOURS[row.family], s=28, zorder=3)
            if row.tag:
                ax.annotate(row.tag, (x, y), xytext=(4, -3), textcoords="offset points", fontsize=7, ha="left", va="top")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.margins(x=0.15)  # room for the names right of the points
        ax.set_xlabel("tau, mean of the four tasks (16 nodes)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    for family, colour in COLOURS.items():
        axes[0].scatter([], [], color=colour, label=family)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Each head of the at-a-glance table at 16 nodes: tau against decode speedup (smollm2-135m, greedy; "
                 "no CPU point for heads timed without an AR baseline)",
                 fontsize=9)
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=150)
    plt.close(fig)


class Target(NamedTuple):
    """One of issue 10's targets: ``heads`` are (name, source) with source (sweep, label, task) for a tau or
    (checkpoint folder,) for the held-out depth-1 top-1 in its card; ``rule`` takes the best value (and the
    reference, for a target set against another head) and says whether it is reached. ``uncounted`` are
    (name, source, why) shown beside them but left out of the verdict: a snapshot of a head that never shipped,
    with source ("replay", replay .json, task, budget) for its replayed tau (`python -m specbench.replay`)."""

    claim: str
    asked: str
    heads: tuple
    reference: tuple | None = None  # (name, source) of the head the target is measured against
    margin: float = 0.0  # reached when best >= threshold (or reference - margin)
    threshold: float | None = None
    uncounted: tuple = ()


_CK = "drafters/checkpoints/"
TARGETS = (
    Target("EAGLE-3 tau on humaneval, 16 nodes (depth 5, top-k 4)", ">= 2.5", (
        ("200k tokens", ("block_r200k", "eagle3-16", "humaneval")),
        ("800k tokens", ("eagle3_r800k", "eagle3-r800k-16", "humaneval")),
        ("1.6M tokens, 3 epochs", ("speed_best", "eagle3-r1600k-16", "humaneval"))), threshold=2.5),
    Target("EAGLE-3 tau on humaneval, 60 nodes (depth 7, top-k 10)", ">= 3.0", (
        ("200k tokens", ("eagle3_vocab", "eagle3-60", "humaneval")),
        ("800k tokens", ("eagle3_r800k", "eagle3-r800k-60", "humaneval")),
        ("1.6M tokens, 3 epochs", ("eagle3_r1600k_e3", "eagle3-r1600k-e3-60", "humaneval"))), threshold=3.0),
    Target("DFlash held-out depth-1 top-1, 200k tokens", "within 0.05 of EAGLE-3's", (
        ("gamma 7", (_CK + "dflash-smollm2-135m-r200k",)), ("gamma 1", (_CK + "dflash-smollm2-135m-r200k-g1",)),
        ("gamma 1, 8k ids, 3 epochs", (_CK + "dflash-smollm2-135m-r200k-g1-v8k",)),
        ("5 epochs", (_CK + "dflash-smollm2-135m-r200k-g1-e5-v8k",)),
        ("7 epochs", (_CK + "dflash-smollm2-135m-r200k-g1-e7-v8k",)),
        ("10 epochs", (_CK + "dflash-smollm2-135m-r200k-g1-e10-v8k",))),
        reference=("EAGLE-3 200k", (_CK + "eagle3-smollm2-135m-r200k",)), margin=0.05),
    Target("DFlash marginal-tree tau on humaneval, 16 nodes, 200k tokens", "no lower than EAGLE-3's 16-node tau", (
        ("gamma 7", ("block_r200k", "dflash-marginal-16", "humaneval")),
        ("gamma 1", ("block_g1", "dflash-marginal-16", "humaneval")),
        ("gamma 1, 8k ids, 7 epochs", ("block_e7", "dflash-marginal-16", "humaneval")),
        ("10 epochs", ("speed_best", "dflash-e10-16", "humaneval"))),
        reference=("EAGLE-3 200k", ("speed_best", "eagle3-r200k-16", "humaneval"))),
    Target("JetSpec tau on math500, budget 64", ">= 2.5", (
        ("gamma 7", ("block_r200k", "jetspec-64", "math500")), ("gamma 1", ("block_g1", "jetspec-64", "math500")),
        ("gamma 1, 8k ids, 7 epochs", ("jetspec_e7", "e7-tree-64", "math500")),
        ("1.6M tokens, 3 epochs", ("jetspec_r1600k", "r1600k-tree-64", "math500"))), threshold=2.5,
        uncounted=(("1.6M tokens, 3 epochs, step 2,700 of 4,084",
                    ("replay", "reports/data/jetspec-r1600k/replay-step2700.json", "math500", "64"),
                    "replayed snapshot; the run was lost to a machine wipe at step ~2,800 and never shipped"),)),
)


def target_value(source: tuple) -> float | None:
    """A tau (micro, from the cell's committed result file) or a card's held-out depth-1 top-1; None when the
    file is not there yet (a head still training)."""
    if len(source) == 1:
        card = Path(source[0]) / "training.json"
        return json.loads(card.read_text())["heldout"]["acc_0"] if card.exists() else None
    if source[0] == "replay":  # a committed replay table: the row at that budget, that task's tau
        _, path, task, budget = source
        rows = [r for r in json.loads(Path(path).read_text())["rows"] if str(r["budget"]) == budget]
        if len(rows) != 1:
            raise SystemExit(f"{path} has no single row at budget {budget}")
        return float(rows[0][f"tau_{task}"])
    sweep_name, label, task = source
    plan = _plan(sweep_name)
    cells = [c for c in plan.cells if c.label == label and c.task_label == task]
    if len(cells) != 1:
        raise SystemExit(f"sweeps/{sweep_name}.toml has no cell {label!r} on {task}")
    if not cells[0].out.exists():
        return None
    frame = report.compare(results.read_results([cells[0].out]))
    return float(frame.loc[frame["drafter"] != report.BASELINE_DRAFTER, "tau"].iloc[0])


def targets_table() -> list[str]:
    """One row per target: what was asked, every head's value, the best and the verdict by the target's rule."""
    lines = ["| target | asked | measured (each head) | best | verdict |", "|---|---|---|---:|---|"]
    spec = lambda source: ".3f" if len(source) == 1 else ".2f"  # noqa: E731  (top-1 to 3 places, tau to 2)
    for t in TARGETS:
        values = [(name, source, target_value(source)) for name, source in t.heads]
        parts = [f"{name}: {'not measured yet' if v is None else format(v, spec(source))}" for name, source, v in values]
        measured = [(v, name) for name, _, v in values if v is not None]
        best, best_name = max(measured)
        if t.reference is not None:
            ref = target_value(t.reference[1])
            parts.append(f"{t.reference[0]}: {format(ref, spec(t.reference[1]))}")
            bar = ref - t.margin
        else:
            bar = t.threshold
        parts += [f"{name}: {format(target_value(source), spec(source))} ({why}; not counted)"
                  for name, source, why in t.uncounted]
        shown = format(best, spec(t.heads[0][1]))
        verdict = "**not reached**" if best < bar else ("**reached** (at equality)" if best == bar else "**reached**")
        lines.append(f"| {t.claim} | {t.asked} | {'; '.join(parts)} | {shown} ({best_name}) | {verdict} |")
    return lines


def readme_with_table(text: str, lines: list[str], begin: str = BEGIN, end: str = END) -> str:
    return base.readme_with_table(text, lines, begin, end)


def main(argv: list[str]) -> int:
    """No arguments: write the table, figure and README table; ``-h``/``--help`` prints the usage; anything else
    is a one-line error and 2."""
    if argv in (["-h"], ["--help"]):
        print("usage: python sweeps/glance.py   (writes the README's at-a-glance table and " + str(FIGURE) + ")")
        return 0
    if argv:
        print(f"error: python sweeps/glance.py takes no arguments (got {' '.join(argv)!r}); its rows are in ROWS",
              file=sys.stderr)
        return 2
    measured = [(row, measure(row)) for row in ROWS]
    if broken := [row.name for row, m in measured if m["lossless"] is not True]:  # an unchecked row counts too
        raise SystemExit(f"not shown lossless against an AR baseline: {', '.join(broken)}")
    lines, goals = table(measured), targets_table()
    print("\n".join(lines + [""] + goals))
    figure(measured)
    print(f"wrote {FIGURE}")
    for rows, begin, end in ((lines, BEGIN, END), (goals, TARGETS_BEGIN, TARGETS_END)):
        if (doc := base.write_table(rows, begin, end)) is not None:
            print(f"wrote the table between {begin!r} and its end marker into {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
