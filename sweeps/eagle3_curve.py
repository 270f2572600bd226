"""tau against training data for EAGLE-3 heads, from `specbench sweep sweeps/eagle3_curve.toml`:
`python sweeps/eagle3_curve.py`.

Each cell of ``sweeps/eagle3_curve.toml`` pairs a `specbench train --out` directory (its
``--drafter-path``; its training.json gives the data budget, whether the answers were regenerated,
and the held-out accuracies) with the cell's result file (tau needs no baseline). Writes
reports/figures/eagle3-tau-vs-training-tokens.png and prints a markdown table.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specbench import report, results, sweep  # noqa: E402

SWEEP = Path(__file__).with_suffix(".toml")


def main() -> None:
    rows = []
    for cell in sweep.load_sweep(SWEEP).cells:
        run_dir, parquet = cell.spec.drafter_path, cell.out
        if not parquet.exists():
            print(f"skipping {cell.name}: {parquet} is missing (run `specbench sweep {SWEEP}`)")
            continue
        summary = json.loads((Path(run_dir) / "training.json").read_text())
        df = results.read_results([parquet])
        rows.append({
            "head": Path(run_dir).name,
            "regenerate": summary["job"]["regenerate"],
            "budget": summary["job"]["budget_tokens"],
            "epochs": summary["job"]["recipe"]["epochs"],
            "tokens_seen": summary["tokens_seen"],
            "acc_0": summary["heldout"]["acc_0"],
            "acc_2": summary["heldout"]["acc_2"],
            "tau": report.tau_micro(df),
            "p_accept": report.accept_at_least(df, 3),
            "n_prompts": int(df["prompt_id"].nunique()),
        })
    print("| head | regenerated | assistant tokens | epochs | held-out acc@1 | held-out acc@3 | humaneval prompts | tau | P(acc>=1) | P(acc>=2) | P(acc>=3) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        p = " | ".join(f"{x:.2f}" for x in r["p_accept"])
        print(f"| {r['head']} | {'yes' if r['regenerate'] else 'no'} | {r['budget']:,} | {r['epochs']} | {r['acc_0']:.3f} | "
              f"{r['acc_2']:.3f} | {r['n_prompts']} | {r['tau']:.2f} | {p} |")
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    groups = {}
    for r in rows:
        key = ("regenerated" if r["regenerate"] else "original answers") + f", {r['epochs']} epochs"
        groups.setdefault(key, []).append((r["budget"], r["tau"]))
    for (key, pts), marker in zip(sorted(groups.items()), "osD^v"):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=key)
    ax.set_xscale("log")
    ax.set_xlabel("training data (assistant tokens, log scale)")
    ax.set_ylabel("tau on humaneval (micro)")
    ax.set_title("EAGLE-3 head for smollm2-135m: tau vs training data", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out = Path("reports/figures/eagle3-tau-vs-training-tokens.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=150)
    print(f"\nfigure: {out}")


if __name__ == "__main__":
    main()
