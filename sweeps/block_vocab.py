"""A reduced draft vocabulary next to the full one, at 200k tokens: `python sweeps/block_vocab.py`.

Reads ``reports/data/block-vocab/`` (``specbench sweep sweeps/block_vocab.toml``: the DFlash gamma-1 head
with the target's full vocabulary and the same recipe with ``draft_vocab_size=8192``, every cell of a task
paired with one AR baseline measured in the same run) and the two heads' ``training.json`` cards, and
writes ``reports/block_vocab.md``, ``reports/figures/block-vocab.png`` and the README's table between
its marker lines (``tests/test_sweep.py`` checks that the README's table is what this
data gives). Cells that have not run yet show as "-". Another family's pair of heads passes its own
:class:`Comparison` to :func:`main` (``sweeps/treeflash_vocab.py``, ``sweeps/jetspec_vocab.py``), and so
does a pair that differs in training epochs (``sweeps/dflash_epochs.py``, ``sweeps/treeflash_epochs.py``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specbench import report, results, sweep  # noqa: E402

_spec = importlib.util.spec_from_file_location("block_r200k", Path(__file__).with_name("block_r200k.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

README = Path("README.md")
DEPTHS = (1, 2, 3, 4, 8)
_fmt = base._fmt
summaries = base.summaries


class Comparison(NamedTuple):
    """One family's two heads on one sweep (full and reduced vocabulary, or fewer and more epochs), and where
    its report goes."""

    sweep: Path
    out: Path
    figure: Path
    begin: str  # the README's marker lines around the generated table
    end: str
    heads: tuple  # (label prefix in the sweep file, display name, checkpoint folder), full head first
    settings: tuple  # (label suffix in the sweep file, display name): cell f"{prefix}-{suffix}"
    title: str
    intro: str
    short: tuple = ("full", "8k")  # the two heads' names in the table's column headers and the summary line
    heading: str = "A reduced draft vocabulary against the full one"  # the report's title, before `title`
    contrast: str = "{a} draft vocabulary against {b}"  # the figure's subtitle, from the heads' display names


DFLASH = Comparison(
    sweep=Path(__file__).with_suffix(".toml"), out=Path("reports/block_vocab.md"),
    figure=Path("reports/figures/block-vocab.png"),
    begin="<!-- draft-vocabulary table: written by `python sweeps/block_vocab.py`; do not edit by hand -->",
    end="<!-- end of the draft-vocabulary table -->",
    heads=(("full", "full (49,152 ids)", Path("drafters/checkpoints/dflash-smollm2-135m-r200k-g1")),
           ("v8k", "8,192 ids", Path("drafters/checkpoints/dflash-smollm2-135m-r200k-g1-v8k"))),
    settings=(("marginal-16", "marginal tree, 16 nodes"), ("chain-16", "chain (block 16)"),
              ("marginal-64", "marginal tree, 64 nodes")),
    title="DFlash gamma 1 at 200k tokens",
    intro="Both heads: every anchor, 200,047 regenerated assistant tokens, gamma 1, bf16, 3 epochs; only "
          "`draft_vocab_size` differs.")
COMPARISON = DFLASH  # this script's comparison (tests/test_sweep.py reads each script's COMPARISON)


def card(folder: Path) -> dict | None:
    """The head's training.json (held-out metrics, root probe, cost), or None before it is trained."""
    path = folder / "training.json"
    return json.loads(path.read_text()) if path.exists() else None


def heads_table(cards: dict[str, dict | None], heads: tuple = DFLASH.heads) -> list[str]:
    """One row per head: held-out top-1 by depth, chain tau, root probe, training time and machine."""
    lines = ["| head | held-out top-1, depths " + " / ".join(map(str, DEPTHS)) + " | chain tau | root probe (true / shuffled) "
             "| training | trained on |", "|---|---|---:|---|---:|---|"]
    for prefix, name, _ in heads:
        c = cards.get(prefix)
        if c is None:
            lines.append(f"| {name} | - | - | - | - | - |")
            continue
        held, probe, hw = c["heldout"], c["root_probe"], c["hardware"]
        accs = " / ".join(_fmt(held.get(f"acc_{d - 1}"), ".3f") for d in DEPTHS)
        verdict = "flagged: ignores its root" if probe["ignores_root"] else "uses its root"
        where = hw["device_name"] if hw.get("device", "cpu") != "cpu" else f"{hw['cpu_model']}, {hw['threads']} threads"
        lines.append(f"| {name} | {accs} | {_fmt(held.get('chain_tau'))} | {_fmt(probe['acc_true_roots'], '.3f')} / "
                     f"{_fmt(probe['acc_shuffled_roots'], '.3f')} ({verdict}) | {c['seconds']['train_all_calls'] / 60:.1f} min | {where} |")
    return lines


def _pairs(tasks: list[str], s: dict, comp: Comparison):
    """(setting name, task, first head's cell, second head's cell) for every setting and task with a cell."""
    (first, _, _), (second, _, _) = comp.heads
    for key, name in comp.settings:
        for t in tasks:
            a, b = s.get((f"{first}-{key}", t)), s.get((f"{second}-{key}", t))
            if a is not None or b is not None:
                yield name, t, a, b


def cells_table(tasks: list[str], s: dict, comp: Comparison = DFLASH) -> list[str]:
    """One row per (setting, task): tau, draft ms per step and decode speedup of both heads, and losslessness."""
    both = " / ".join(comp.short)
    lines = [f"| setting | task | tau, {both} | draft ms per step, {both} | decode speedup over AR, {both} | lossless |",
             "|---|---|---:|---:|---:|---|"]
    for name, t, first, second in _pairs(tasks, s, comp):

        def pair(field: str, spec: str = ".2f", suffix: str = "") -> str:
            return " / ".join("-" if c is None else _fmt(c[field], spec) + suffix for c in (first, second))

        ok = [c["lossless"] for c in (first, second) if c is not None]
        lossless = "-" if not ok or None in ok else ("yes" if all(ok) else "**NO**")
        lines.append(f"| {name} | {t} | {pair('tau_micro')} | {pair('draft_ms', '.1f')} | {pair('decode_speedup_sum', '.2f', 'x')} | {lossless} |")
    return lines


def summary_line(tasks: list[str], s: dict, comp: Comparison = DFLASH) -> str:
    """The two heads' ratios over every cell both have: tau and draft time per step, second head over first."""
    short = comp.short
    both = [(first, second) for _, _, first, second in _pairs(tasks, s, comp) if first is not None and second is not None]
    if not both:
        return "No cell has both heads yet."
    taus = [second["tau_micro"] / first["tau_micro"] for first, second in both]
    drafts = [second["draft_ms"] / first["draft_ms"] for first, second in both]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return (f"Over the {len(taus)} cell{'s' if len(taus) != 1 else ''} both heads ran, the {short[1]} head's tau is "
            f"{mean(taus):.3f}x the {short[0]} head's "
            f"(range {min(taus):.3f} to {max(taus):.3f}) and its drafting time per step {mean(drafts):.2f}x "
            f"(range {min(drafts):.2f} to {max(drafts):.2f}).")


def readme_table(tasks: list[str], s: dict, cards: dict[str, dict | None], comp: Comparison = DFLASH) -> list[str]:
    return heads_table(cards, comp.heads) + [""] + cells_table(tasks, s, comp) + ["", summary_line(tasks, s, comp)]


def readme_with_table(text: str, table: list[str], begin: str = DFLASH.begin, end: str = DFLASH.end) -> str:
    return base.readme_with_table(text, table, begin, end)


def figure(tasks: list[str], s: dict, comp: Comparison) -> bool:
    """Tau, draft ms per step and decode speedup of both heads, per task, one column per setting."""
    keys = [(k, n) for k, n in comp.settings if any((f"{p}-{k}", t) in s for p, _, _ in comp.heads for t in tasks)]
    if not keys:
        return False
    metrics = (("tau_micro", "tau"), ("draft_ms", "draft ms / step"), ("decode_speedup_sum", "decode speedup over AR"))
    fig, axes = plt.subplots(len(metrics), len(keys), figsize=(max(6.4, 3.4 * len(keys)), 7.2), squeeze=False, sharex=True)
    width = 0.38
    for j, (key, name) in enumerate(keys):
        for i, (field, ylabel) in enumerate(metrics):
            ax = axes[i][j]
            for k, (prefix, head, _) in enumerate(comp.heads):
                ys = [s[(f"{prefix}-{key}", t)][field] if (f"{prefix}-{key}", t) in s else float("nan") for t in tasks]
                ax.bar([x + (k - 0.5) * width for x in range(len(tasks))], ys, width, label=head)
            if field == "decode_speedup_sum":
                ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xticks(range(len(tasks)), tasks, fontsize=7)
            ax.grid(axis="y", alpha=0.3)
            if j == 0:
                ax.set_ylabel(ylabel)
        axes[0][j].set_title(name, fontsize=9)
    axes[0][0].legend(fontsize=7)
    contrast = comp.contrast.format(a=comp.heads[0][1], b=comp.heads[1][1])
    fig.suptitle(f"{comp.title}:\n{contrast} (smollm2-135m, CPU, greedy)", fontsize=9)
    fig.tight_layout()
    comp.figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(comp.figure, dpi=150)
    plt.close(fig)
    return True


def main(comp: Comparison = DFLASH) -> None:
    plan = sweep.load_sweep(comp.sweep)
    tasks, s = summaries(plan)
    cards = {prefix: card(folder) for prefix, _, folder in comp.heads}
    script = f"sweeps/{comp.sweep.with_suffix('.py').name}"
    lines = [f"# {comp.heading}: {comp.title} (CPU, greedy)", "",
             f"Written by `python {script}` from `{plan.results_dir}/` (`specbench sweep sweeps/{comp.sweep.name}`) "
             f"and the heads' `training.json`. {comp.intro} At most 128 new tokens; each decode speedup is against its "
             "task's AR baseline from the same run.", "", "## The heads", ""]
    lines += heads_table(cards, comp.heads)
    lines += ["", "## Every cell", ""] + cells_table(tasks, s, comp) + ["", summary_line(tasks, s, comp)]
    files = sorted(plan.results_dir.glob("*.parquet"))
    if files:
        df = results.read_results(files)
        machines = sorted(set(df["cpu_model"].astype(str))) if "cpu_model" in df else []
        if machines:
            lines += ["", "Measured on: " + ", ".join(machines) + "."]
        if (note := report.shared_cpu_note(df)) is not None:
            lines += ["", f"**Warning:** {note}"]
    if figure(tasks, s, comp):
        lines += ["", f"![tau, draft time and decode speedup of both heads]({comp.figure.relative_to('reports')})"]
        print(f"wrote {comp.figure}")
    comp.out.parent.mkdir(exist_ok=True)
    comp.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if README.exists():
        text = README.read_text()
        if comp.begin in text:
            README.write_text(readme_with_table(text, readme_table(tasks, s, cards, comp), comp.begin, comp.end))
            print(f"wrote the table between {comp.begin!r} and its end marker into {README}")


if __name__ == "__main__":
    main()
