"""The block-drafter benchmark of the README: `python reports/block_bench.py run|report`.

``run`` calls `specbench run` for every (setting, task) below into ``results/block/`` (skipping
finished files, resuming interrupted ones), greedy, on the default target. The first run of each
task runs the AR baseline interleaved with it; the others reuse that baseline, so every speedup of
a task is against the same AR measurement of this session.

``report`` reads those files and writes ``reports/block_bench.md`` (the tables of the README) and
``reports/figures/block-budget-sweep.png`` (tau and decode speedup against the node budget).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specbench import report, results  # noqa: E402

OUT = Path("results/block")
TASKS = {"humaneval": 3, "math500": 3, "gsm8k": 3, "mt-bench": 2}  # prompts (mt-bench: two turns each)
MAX_NEW = 128
BUDGETS = (16, 32, 64, 128)
SWEEP_TASKS = ("math500", "humaneval")  # the budget sweep (CPU time: 2 tasks of 4)

# (label, drafter, --set options, tasks); budgets count the root. TreeFlash's own marginal tree
# (ar_approximation=false) IS dflash-marginal: its backbone is the frozen DFlash head, so it is not
# run twice.
ALL = tuple(TASKS)
SETTINGS: list[tuple[str, str, list[str], tuple[str, ...]]] = [
    ("ngram", "ngram", [], ALL),
    ("eagle3-60", "eagle3", [], ALL),
    ("eagle3-16", "eagle3", ["depth=5", "top_k=4", "total_tokens=16"], ALL),
    ("dflash-chain-16", "dflash", [], ALL),
    ("treeflash-16", "treeflash", ["budget=16"], ALL),
    ("treeflash-64", "treeflash", ["budget=64"], ALL),
    ("jetspec-16", "jetspec", ["budget=16"], ALL),
    ("dflash-marginal-16", "dflash", ["tree=marginal", "budget=16"], ALL),
    ("jetspec-kbest-16", "jetspec", ["budget=16", "tree=kbest"], ALL),
    ("dflash-marginal-64", "dflash", ["tree=marginal", "budget=64"], ALL),
    *[(f"jetspec-{b}", "jetspec", [f"budget={b}"], SWEEP_TASKS) for b in BUDGETS[1:]],
    *[(f"dflash-marginal-{b}", "dflash", ["tree=marginal", f"budget={b}"], SWEEP_TASKS) for b in (32, 128)],
]


def run() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for task, limit in TASKS.items():
        for label, drafter, options, tasks in SETTINGS:
            if task not in tasks:
                continue
            out = OUT / f"{label}-{task}.parquet"
            if out.exists():
                continue
            cmd = ["specbench", "run", "--drafter", drafter, "--task", task, "--limit", str(limit),
                   "--max-new-tokens", str(MAX_NEW), "--results-dir", str(OUT), "--out", str(out)]
            cmd += [x for o in options for x in ("--set", o)]
            if out.with_suffix(".partial.jsonl").exists():
                cmd.append("--resume")
            print("+", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)


def _label(path: Path) -> tuple[str, str]:
    stem = path.name.removesuffix(".parquet")
    for task in TASKS:
        if stem.endswith("-" + task):
            return stem.removesuffix("-" + task), task
    raise ValueError(path)


def load() -> dict[tuple[str, str], dict]:
    """(setting label, task) -> summary (tau, speedups, draft cost), paired with the task's AR baseline."""
    files = sorted(OUT.glob("*.parquet"))
    everything = results.read_results(files)
    ar = everything[everything["drafter"] == report.BASELINE_DRAFTER].drop_duplicates(["task", "prompt_id", "turn"], keep="last")
    summaries = {}
    for path in files:
        if path.name.endswith(".ar-baseline.parquet"):
            continue
        label, task = _label(path)
        df = results.read_results([path])
        baseline = ar[ar["task"] == task].reset_index(drop=True)
        summaries[(label, task)] = report.run_summary(df, baseline if len(baseline) else None)
        summaries[(label, task)]["draft_s_per_step"] = report.draft_s_per_step(df)
    return summaries


def _fmt(x: float, spec: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def report_tables() -> None:
    s = load()
    tasks = [t for t in TASKS if any(k[1] == t for k in s)]
    lines = ["# Block drafters on smollm2-135m (CPU, greedy)", "",
             f"Written by `python reports/block_bench.py report` from `results/block/` (at most {MAX_NEW} new tokens; "
             + ", ".join(f"{t}: {n} prompts" for t, n in TASKS.items()) + "; mt-bench prompts have two turns).", ""]

    lines += ["## tau at an equal node budget (16 nodes, root included)", "",
              "| drafter | tree | " + " | ".join(tasks) + " | mean |", "|---|---|" + "---:|" * (len(tasks) + 1)]
    equal = [("dflash-chain-16", "dflash", "chain (15 drafts)"), ("dflash-marginal-16", "dflash", "marginal best-first (DDTree)"),
             ("jetspec-16", "jetspec", "causal, accum-log-prob"),
             ("jetspec-kbest-16", "jetspec", "causal, marginal best-first (tree=kbest)"), ("treeflash-16", "treeflash", "two-stage lazy k-best"),
             ("eagle3-16", "eagle3", "dynamic tree, depth 5, top_k 4"), ("ngram", "ngram", "prompt lookup chain")]
    for label, drafter, tree in equal:
        vals = [s.get((label, t), {}).get("tau_micro") for t in tasks]
        have = [v for v in vals if v is not None]
        lines.append(f"| {drafter} | {tree} | " + " | ".join(_fmt(v) for v in vals) + f" | {_fmt(sum(have) / len(have) if have else None)} |")

    lines += ["", "## TreeFlash against its own marginal tree (64 nodes)", "",
              "| tree | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for label, name in (("dflash-marginal-64", "marginal (= treeflash ar_approximation=false)"), ("treeflash-64", "TreeFlash (correction on)")):
        lines.append(f"| {name} | " + " | ".join(_fmt(s.get((label, t), {}).get("tau_micro")) for t in tasks) + " |")

    lines += ["", "## tau and decode speedup against the budget", "",
              "| task | tree | " + " | ".join(f"{b} nodes" for b in BUDGETS) + " |", "|---|---|" + "---:|" * len(BUDGETS)]
    for t in [t for t in SWEEP_TASKS if t in tasks]:
        for fam, name in (("jetspec", "jetspec"), ("dflash-marginal", "marginal")):
            cells = []
            for b in BUDGETS:
                r = s.get((f"{fam}-{b}", t))
                cells.append("-" if r is None else f"{_fmt(r['tau_micro'])} / {_fmt(r['decode_speedup_sum'])}x")
            lines.append(f"| {t} | {name} | " + " | ".join(cells) + " |")

    lines += ["", "## Drafting cost per step", "",
              "| setting | drafter forwards / step | draft ms / step | draft share | tau (mean over tasks) | decode speedup (mean) |",
              "|---|---:|---:|---:|---:|---:|"]
    for label, *_ in SETTINGS:
        rows = [s[(label, t)] for t in tasks if (label, t) in s]
        label = f"{label} ({len(rows)} tasks)" if len(rows) != len(tasks) else label
        if not rows:
            continue
        mean = lambda key: sum(r[key] for r in rows if r[key] == r[key]) / max(1, sum(1 for r in rows if r[key] == r[key]))  # noqa: E731
        lines.append(f"| {label} | {_fmt(mean('drafter_forwards_per_step'), '.1f')} | {_fmt(1000 * mean('draft_s_per_step'), '.1f')} | "
                     f"{_fmt(100 * mean('draft_share'), '.1f')}% | {_fmt(mean('tau_micro'))} | {_fmt(mean('decode_speedup_sum'))}x |")
    lossless = all(r.get("lossless") in (True, None) for r in s.values())
    lines += ["", f"Every paired output equals the AR baseline's token for token: {'yes' if lossless else 'NO'}."]
    Path("reports/block_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for fam, name, marker in (("jetspec", "JetSpec (causal)", "o"), ("dflash-marginal", "marginal tree (DFlash head)", "s")):
        for key, ax in (("tau_micro", axes[0]), ("decode_speedup_sum", axes[1])):
            ys = []
            for b in BUDGETS:
                vals = [s[(f"{fam}-{b}", t)][key] for t in SWEEP_TASKS if (f"{fam}-{b}", t) in s]
                ys.append(sum(vals) / len(vals) if vals else float("nan"))
            ax.plot(BUDGETS, ys, marker=marker, label=name)
    for ax, title in ((axes[0], "tau (mean of math500, humaneval)"), (axes[1], "decode speedup vs AR (same mean)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(BUDGETS, [str(b) for b in BUDGETS])
        ax.set_xlabel("node budget (root included)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle("smollm2-135m on a 2-core CPU, greedy", fontsize=10)
    fig.tight_layout()
    out = Path("reports/figures/block-budget-sweep.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)
    print(f"wrote {out}")


if __name__ == "__main__":
    {"run": run, "report": report_tables}[sys.argv[1] if len(sys.argv) > 1 else "report"]()
