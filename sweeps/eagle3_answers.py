"""Regenerated against original answers at 200k tokens (issue 10): `python sweeps/eagle3_answers.py`.

Reads ``results/eagle3-answers/`` (``specbench sweep sweeps/eagle3_answers.toml``: the original-answers
head) and the regenerated head's cells from ``results/specblock-speed/`` (``sweeps/specblock_speed.toml``'s
eagle3-16 cells: the same settings, prompts and token limit). Prints the markdown table of reports/eagle3.md: per task
and node budget, tau and P(acc >= d) of each head, the two heads' held-out accuracies from their
training cards (each on its own answer source's held-out data, so they do not compare across rows),
and checks that both heads' outputs are identical token for token (both are lossless).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specbench import report, results, sweep

HERE = Path(__file__).parent
GRID = HERE / "eagle3_answers.toml"
SPEED = HERE / "specblock_speed.toml"
SOURCES = ("original", "regenerated")
BUDGETS = (16,)


def _cells(plan: sweep.Sweep) -> dict:
    return {(c.label, c.task_label): c for c in plan.cells}


def main() -> None:
    grid = sweep.load_sweep(GRID)
    speed = _cells(sweep.load_sweep(SPEED))
    frames = {}
    heads = {"original": None, "regenerated": None}
    for cell in grid.cells:  # the original-answers head
        source, budget = cell.label.rsplit("-", 1)
        heads[source] = Path(cell.spec.drafter_path)
        if cell.out.exists():
            frames[(source, int(budget), cell.task_label)] = results.read_results([cell.out])
    for (label, task), cell in speed.items():  # the regenerated head: the SpecBlock speed grid's EAGLE-3 cells
        if label.startswith("eagle3-") and int(label.split("-")[1]) in BUDGETS:
            heads["regenerated"] = Path(cell.spec.drafter_path)
            if cell.out.exists():
                frames[("regenerated", int(label.split("-")[1]), task)] = results.read_results([cell.out])
    tasks = list(dict.fromkeys(c.task_label for c in grid.cells))

    print("| head | answers | assistant tokens | epochs | steps | held-out top-1 at depth 1 / 2 / 4 / 7 |")
    print("|---|---|---:|---:|---:|---|")
    for source in SOURCES:
        card = heads[source] / "training.json"
        if not card.exists():
            print(f"| {heads[source]} | {source} | - | - | - | not trained yet |")
            continue
        t = json.loads(card.read_text())
        h = t["heldout"]
        print(f"| {heads[source].name} | {source} | {t['train_loss_tokens']:,} | {t['job']['recipe']['epochs']} | {t['steps']} | "
              + " / ".join(f"{h[f'acc_{d}']:.3f}" for d in (0, 1, 3, 6)) + " |")

    print()
    print("| task | nodes | original tau | regenerated tau | regenerated / original | P(acc>=1/2/3/4) original | P(acc>=1/2/3/4) regenerated | same outputs |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    ratios: dict[int, list[float]] = {b: [] for b in BUDGETS}
    for task in tasks:
        for budget in BUDGETS:
            o, r = frames.get(("original", budget, task)), frames.get(("regenerated", budget, task))
            if o is None or r is None:
                print(f"| {task} | {budget} | " + ("-" if o is None else f"{report.tau_micro(o):.2f}") + " | "
                      + ("-" if r is None else f"{report.tau_micro(r):.2f}") + " | - | - | - | - |")
                continue
            to, tr = report.tau_micro(o), report.tau_micro(r)
            ratios[budget].append(tr / to)
            same = all(tuple(a) == tuple(b) for a, b in zip(o.sort_values(["prompt_id", "turn"])["output_ids"],
                                                            r.sort_values(["prompt_id", "turn"])["output_ids"]))
            acc = lambda df: "/".join(f"{100 * a:.0f}" for a in report.accept_at_least(df, 4))  # noqa: E731
            print(f"| {task} | {budget} | {to:.2f} | {tr:.2f} | {tr / to:.3f} | {acc(o)} | {acc(r)} | {'yes' if same else 'NO'} |")
    for budget in BUDGETS:
        if ratios[budget]:
            print(f"| **geometric mean over {len(ratios[budget])} tasks** | {budget} | | | "
                  f"**{float(np.exp(np.mean(np.log(ratios[budget])))):.3f}** | | | |")


if __name__ == "__main__":
    main()
