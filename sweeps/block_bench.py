"""The 40k heads' block-drafter tables (reports/block-drafters.md) from `specbench sweep sweeps/block_bench.toml`: `python sweeps/block_bench.py`.

Reads the cells of ``sweeps/block_bench.toml`` (their files in ``results/block/``) and writes
``reports/block_bench.md`` (the tables of the block notes) and ``reports/figures/block-budget-sweep.png``
(tau and decode speedup against the node budget). Each cell is paired with the AR baseline of its
task (the one its sweep group ran first and the others reused).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specbench import report, results, sweep  # noqa: E402
from specbench.outputs import write_atomic  # noqa: E402

SWEEP = Path(__file__).with_suffix(".toml")
BUDGETS = (16, 32, 64, 128)
SWEEP_TASKS = ("math500", "humaneval")  # the budget sweep (CPU time: 2 tasks of 4)


def load(plan: sweep.Sweep) -> dict[tuple[str, str], dict]:
    """(cell label, task) -> summary (tau, speedups, draft cost), paired with the task's AR baseline."""
    files = sorted(plan.results_dir.glob("*.parquet"))
    everything = results.read_results(files)
    ar = everything[everything["drafter"] == report.BASELINE_DRAFTER].drop_duplicates(["task", "prompt_id", "turn"], keep="last")
    summaries = {}
    for cell in plan.cells:
        if not cell.out.exists():
            continue
        df = results.read_results([cell.out])
        baseline = ar[ar["task"] == cell.task_label].reset_index(drop=True)
        summaries[(cell.label, cell.task_label)] = report.run_summary(df, baseline if len(baseline) else None)
        summaries[(cell.label, cell.task_label)]["draft_s_per_step"] = report.draft_s_per_step(df)
    return summaries


def _fmt(x: float, spec: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def report_tables() -> None:
    plan = sweep.load_sweep(SWEEP)
    s = load(plan)
    limits = {c.task_label: c.spec.limit for c in plan.cells}
    max_new = plan.cells[0].spec.max_new_tokens
    tasks = [t for t in limits if any(k[1] == t for k in s)]
    lines = ["# Block drafters on smollm2-135m (CPU, greedy)", "",
             f"Written by `python sweeps/block_bench.py` from `results/block/` (`specbench sweep sweeps/block_bench.toml`; at most {max_new} new tokens; "
             + ", ".join(f"{t}: {n} prompts" for t, n in limits.items()) + "; mt-bench prompts have two turns).", ""]

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
    for label in dict.fromkeys(c.label for c in plan.cells):
        rows = [s[(label, t)] for t in tasks if (label, t) in s]
        label = f"{label} ({len(rows)} tasks)" if len(rows) != len(tasks) else label
        if not rows:
            continue
        mean = lambda key: sum(r[key] for r in rows if r[key] == r[key]) / max(1, sum(1 for r in rows if r[key] == r[key]))  # noqa: E731
        lines.append(f"| {label} | {_fmt(mean('drafter_forwards_per_step'), '.1f')} | {_fmt(1000 * mean('draft_s_per_step'), '.1f')} | "
                     f"{_fmt(100 * mean('draft_share'), '.1f')}% | {_fmt(mean('tau_micro'))} | {_fmt(mean('decode_speedup_sum'))}x |")
    lossless = all(r.get("lossless") in (True, None) for r in s.values())
    lines += ["", f"Every paired output equals the AR baseline's token for token: {'yes' if lossless else 'NO'}."]
    Path("reports").mkdir(exist_ok=True)
    write_atomic(Path("reports/block_bench.md"), "\n".join(lines) + "\n")
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
    report_tables()
