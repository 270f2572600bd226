"""SpecBlock's claims against EAGLE-3, from the two SpecBlock sweeps: `python sweeps/specblock_claims.py`.

Reads ``results/specblock/`` (``sweeps/specblock.toml``: every task, budgets 16 / 32 / 90, no AR
baseline: the hardware-free numbers; a cell it lacks is taken from the speed grid when that ran it) and ``results/specblock-speed/`` (``sweeps/specblock_speed.toml``:
the same tasks, one AR baseline per task, run on an idle machine: the wall-clock numbers), and writes
``reports/specblock_claims.md`` and ``reports/figures/specblock-adaptation.png`` (tau by prompt index
with and without online adaptation). Cells that have not run yet show as "-".

Per task and budget: tau, P(acc >= d) for d = 1..4, mean tree size, drafter calls per step, and the
projected H100 decode speedup (analytic ``h100-sxm:engine`` and ``h100-sxm:hf-eager`` profiles, from
the same per-step logs). Outputs of all cells of a task are checked to be identical token for token
(every drafter is lossless, so they must be; the speed grid also checks them against AR).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specbench import report, results, sweep  # noqa: E402
from specbench.outputs import write_atomic  # noqa: E402
from specbench.hardware.project import project_rows  # noqa: E402

HERE = Path(__file__).parent
GRID = HERE / "specblock.toml"
SPEED = HERE / "specblock_speed.toml"
BUDGETS = (16, 32, 90)
HARDWARE = ("h100-sxm:engine", "h100-sxm:hf-eager")
FAMILIES = (("eagle3", "EAGLE-3"), ("specblock", "SpecBlock"), ("specblock-90-bandit", "SpecBlock + bandit"))
OUT = Path("reports/specblock_claims.md")
FIGURE = Path("reports/figures/specblock-adaptation.png")


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def _label(family: str, budget: int) -> str:
    return family if family.endswith("bandit") else f"{family}-{budget}"


def _cells():
    """(budget, family, display name) of every table row: each family at each budget, the bandit at 90 only."""
    return [(b, f, n) for b in BUDGETS for f, n in FAMILIES if not (f.endswith("bandit") and b != 90)]


def load_cells(plan: sweep.Sweep) -> dict[tuple[str, str], "results.pd.DataFrame"]:
    out = {}
    for cell in plan.cells:
        if cell.out.exists():
            out[(cell.label, cell.task_label)] = results.read_results([cell.out])
    return out


def grid_summary(df) -> dict:
    acc = report.accept_at_least(df, 4)
    tree = np.concatenate([np.asarray(v) for v in df["tree_size_per_step"]])
    s = {"tau": report.tau_micro(df), "acc": acc + [float("nan")] * (4 - len(acc)), "tree": float(tree.mean()),
         "calls": report.drafter_forwards_per_step(df), "draft_ms": 1000 * report.draft_s_per_step(df),
         "prompts": int(df["prompt_id"].nunique())}
    for hw in HARDWARE:
        s[hw] = project_rows(df, hw).speedup_sum
    return s


def outputs_agree(frames: list) -> bool:
    """True iff every frame holds the same output ids for every (prompt, turn) they share."""
    seen: dict[tuple, tuple] = {}
    for df in frames:
        for pid, turn, ids in zip(df["prompt_id"], df["turn"], df["output_ids"]):
            key, val = (pid, int(turn)), tuple(int(t) for t in ids)
            if seen.setdefault(key, val) != val:
                return False
    return True


def adaptation_curve(df) -> list[float]:
    """Per-row tau in the run's prompt order (rows are written as each prompt finishes)."""
    return [int(n) / max(int(s), 1) for n, s in zip(df["n_new_tokens"], df["n_steps"])]


def main() -> None:
    grid_plan = sweep.load_sweep(GRID)
    speed_plan = sweep.load_sweep(SPEED)
    grid = load_cells(grid_plan)
    speed = load_cells(speed_plan)
    for key, df in speed.items():  # the speed grid's cells are the same runs (tau does not depend on the machine)
        grid.setdefault(key, df)
    tasks = list(dict.fromkeys(c.task_label for c in grid_plan.cells))
    lines = ["# SpecBlock against EAGLE-3 on smollm2-135m (equal data, training budget and node budget)", "",
             "Written by `python sweeps/specblock_claims.py` from `results/specblock/` (`specbench sweep sweeps/specblock.toml`) "
             "and `results/specblock-speed/` (`specbench sweep sweeps/specblock_speed.toml`). Both heads: 200,047 regenerated "
             "assistant tokens, 3 epochs. Greedy, at most 128 new tokens. Budgets count the root. Projected speedups use the "
             "analytic H100 profiles on the same per-step logs (see the README's hardware section for their stated error); "
             "a SpecBlock call is priced as one drafter forward, like an EAGLE-3 forward.", ""]

    summaries = {k: grid_summary(v) for k, v in grid.items()}
    lines += ["## tau, per-depth acceptance and drafting work, per task and budget", "",
              "| task | budget | drafter | prompts | tau | P(acc>=1/2/3/4) | mean tree | drafter calls / step | "
              + " | ".join(f"{hw} (projected)" for hw in HARDWARE) + " |",
              "|---|---:|---|---:|---:|---|---:|---:|" + "---:|" * len(HARDWARE)]
    for task in tasks:
        for budget, family, name in _cells():
            s = summaries.get((_label(family, budget), task))
            if s is None:
                lines.append(f"| {task} | {budget} | {name} | - | - | - | - | - | " + " | ".join("-" for _ in HARDWARE) + " |")
                continue
            lines.append(f"| {task} | {budget} | {name} | {s['prompts']} | {_fmt(s['tau'])} | "
                         + "/".join(_fmt(100 * a, ".0f") for a in s["acc"]) + f" | {_fmt(s['tree'], '.1f')} | "
                         f"{_fmt(s['calls'], '.1f')} | " + " | ".join(f"{_fmt(s[hw])}x" for hw in HARDWARE) + " |")

    lines += ["", "## Mean over tasks (tasks where both drafters ran)", "",
              "| budget | tasks | EAGLE-3 tau | SpecBlock tau | tau ratio | "
              + " | ".join(f"{hw}: SpecBlock / EAGLE-3" for hw in HARDWARE) + " |",
              "|---:|---:|---:|---:|---:|" + "---:|" * len(HARDWARE)]
    for budget in BUDGETS:
        both = [t for t in tasks if (f"eagle3-{budget}", t) in summaries and (f"specblock-{budget}", t) in summaries]
        if not both:
            lines.append(f"| {budget} | 0 | - | - | - | " + " | ".join("-" for _ in HARDWARE) + " |")
            continue
        e = [summaries[(f"eagle3-{budget}", t)] for t in both]
        b = [summaries[(f"specblock-{budget}", t)] for t in both]
        mean = lambda rows, key: float(np.mean([r[key] for r in rows]))  # noqa: E731
        lines.append(f"| {budget} | {len(both)} | {_fmt(mean(e, 'tau'))} | {_fmt(mean(b, 'tau'))} | {_fmt(mean(b, 'tau') / mean(e, 'tau'))} | "
                     + " | ".join(_fmt(mean(b, hw) / mean(e, hw)) for hw in HARDWARE) + " |")

    agree = {t: outputs_agree([df for (label, task), df in grid.items() if task == t]) for t in tasks}
    lines += ["", "Outputs of every cell of a task identical token for token: "
              + ", ".join(f"{t} {'yes' if ok else 'NO'}" for t, ok in agree.items() if any(k[1] == t for k in grid)) + "."]

    lines += ["", "## Wall clock on this CPU (per task, one AR baseline per task, idle machine)", ""]
    baselines = {}
    for path in sorted(speed_plan.results_dir.glob("*.ar-baseline.parquet")):
        df = results.read_results([path])
        df = df[df["drafter"] == report.BASELINE_DRAFTER]
        if len(df):
            baselines[str(df["task"].iloc[0])] = df
    speed_tasks = [t for t in dict.fromkeys(c.task_label for c in speed_plan.cells) if t in baselines]
    rows = {}
    if not speed_tasks:
        lines.append("Not run yet.")
    else:
        lines += ["| task | budget | drafter | prompts | tau | draft ms / step | drafter calls / step | draft share | decode speedup (sum / mean) | lossless |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
        for task in speed_tasks:
            for budget, family, name in _cells():
                df = speed.get((_label(family, budget), task))
                if df is None:
                    continue
                r = report.run_summary(df, baselines[task])
                r["draft_ms"] = 1000 * report.draft_s_per_step(df)
                rows[(family, budget, task)] = r
                lines.append(f"| {task} | {budget} | {name} | {r['n_prompts']} | {_fmt(r['tau_micro'])} | {_fmt(r['draft_ms'], '.1f')} | "
                             f"{_fmt(r['drafter_forwards_per_step'], '.1f')} | {_fmt(100 * r['draft_share'], '.1f')}% | "
                             f"{_fmt(r['decode_speedup_sum'])}x / {_fmt(r['decode_speedup_mean'])}x | "
                             f"{ {True: 'yes', False: 'NO', None: '-'}[r['lossless']]} |")

        def gain(a, b):  # SpecBlock's decode speedup over EAGLE-3's, in percent
            return 100 * (a["decode_speedup_sum"] / b["decode_speedup_sum"] - 1)

        lines += ["", "SpecBlock against EAGLE-3 at the same budget (decode speedup sum over sum, each paired with its task's AR baseline; "
                  "the last row per budget is the mean over the tasks):", "",
                  "| budget | task | SpecBlock decode speedup over EAGLE-3 | SpecBlock draft ms / EAGLE-3 draft ms | with the bandit (90) |",
                  "|---:|---|---:|---:|---:|"]
        for budget in BUDGETS:
            g, c, gb = [], [], []
            for task in speed_tasks:
                e, b = rows.get(("eagle3", budget, task)), rows.get(("specblock", budget, task))
                if e is None or b is None:
                    continue
                bandit = rows.get(("specblock-90-bandit", 90, task)) if budget == 90 else None
                g.append(gain(b, e))
                c.append(100 * b["draft_ms"] / e["draft_ms"])
                if bandit:
                    gb.append(gain(bandit, e))
                lines.append(f"| {budget} | {task} | {_fmt(g[-1], '+.1f')}% | {_fmt(c[-1], '.0f')}% | "
                             + (f"{_fmt(gb[-1], '+.1f')}%" if bandit else "-") + " |")
            if g:
                lines.append(f"| {budget} | **mean of {len(g)}** | **{_fmt(float(np.mean(g)), '+.1f')}%** | **{_fmt(float(np.mean(c)), '.0f')}%** | "
                             + (f"**{_fmt(float(np.mean(gb)), '+.1f')}%**" if gb else "-") + " |")

    # the adaptation's learning curve: tau by prompt index, off against bandit, per task
    pairs = [(t, grid[("specblock-90", t)], grid[("specblock-90-bandit", t)]) for t in tasks
             if ("specblock-90", t) in grid and ("specblock-90-bandit", t) in grid]
    if pairs:
        fig, axes = plt.subplots(1, len(pairs), figsize=(max(6.4, 3.2 * len(pairs)), 3.2), squeeze=False)
        lines += ["", "## Online adaptation (bandit over the rank head), budget 90", "",
                  "| task | tau off | tau bandit | updates taken (small / large) of decisions | update seconds |", "|---|---:|---:|---:|---:|"]
        for ax, (task, off, on) in zip(axes[0], pairs):
            x = np.arange(1, len(off) + 1)
            ax.plot(x, adaptation_curve(off), marker="o", ms=3, label="adapt=off")
            ax.plot(np.arange(1, len(on) + 1), adaptation_curve(on), marker="s", ms=3, label="adapt=bandit")
            ax.set_title(task, fontsize=9)
            ax.set_xlabel("prompt (turn) in run order")
            ax.grid(alpha=0.3)
            decisions = [d for log in (on["drafter_log"] if "drafter_log" in on else []) if isinstance(log, str) and log
                         for d in json.loads(log) if d.get("event") == "decision"]
            arms = [d.get("arm") for d in decisions]
            cost = sum(float(d.get("cost_s", 0.0) or 0.0) for d in decisions)
            lines.append(f"| {task} | {_fmt(report.tau_micro(off))} | {_fmt(report.tau_micro(on))} | "
                         f"{arms.count('small')} / {arms.count('large')} of {len(arms)} | {_fmt(cost, '.2f')} |")
        axes[0][0].set_ylabel("tau of the prompt")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("SpecBlock on smollm2-135m, budget 90: tau by prompt with and without online adaptation", fontsize=9)
        fig.tight_layout()
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(FIGURE, dpi=150)
        lines += ["", f"![tau by prompt index, adapt=off against adapt=bandit]({FIGURE.relative_to('reports')})"]
        print(f"wrote {FIGURE}")
    OUT.parent.mkdir(exist_ok=True)
    write_atomic(OUT, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
