"""Two heads of one family side by side on one sweep: `python sweeps/pairs.py NAME` (`--list` names them).

Each pair is a :class:`Comparison` in :data:`COMPARISONS`, named after its sweep file ``sweeps/NAME.toml``
(``specbench sweep sweeps/NAME.toml``: both heads at each setting, alternating, every task's cells paired
with one AR baseline measured in the same run). The script reads that sweep's result files and the two
heads' ``training.json`` cards and writes ``reports/NAME.md``, ``reports/figures/NAME.png`` (with "-" for
"_") and the table between the pair's marker lines in the block notes, ``reports/block-drafters.md``
(``tests/test_sweep.py`` checks that each such table is what the committed data gives). Cells that have not run yet show as "-". The pairs: a
reduced draft vocabulary against the full one (``block_vocab``: DFlash gamma 1; ``treeflash_vocab``;
``jetspec_vocab``), and more training epochs against fewer (``dflash_epochs``, ``treeflash_epochs``,
``jetspec_epochs``: 3 against 5; ``dflash_e7``, ``treeflash_e7``, ``jetspec_e7``: 5 against 7; ``dflash_e10``: 7
against 10); and eight times the data (``jetspec_r1600k``: the 7-epoch 200k JetSpec head against 3 epochs on 1.6M
tokens).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specbench import report, results, sweep  # noqa: E402
from specbench.outputs import write_atomic  # noqa: E402

_spec = importlib.util.spec_from_file_location("block_r200k", Path(__file__).with_name("block_r200k.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

SWEEPS = Path(__file__).parent
DEPTHS = (1, 2, 3, 4, 8)
_fmt = base._fmt
summaries = base.summaries


class Comparison(NamedTuple):
    """One family's two heads on one sweep (full and reduced vocabulary, or fewer and more epochs); its sweep
    file, report, figure and README markers follow from ``name``."""

    name: str  # the sweep file's stem: sweeps/{name}.toml
    heads: tuple  # (label prefix in the sweep file, display name, checkpoint folder), the baseline head first
    settings: tuple  # (label suffix in the sweep file, display name): cell f"{prefix}-{suffix}"
    title: str
    intro: str
    short: tuple = ("full", "8k")  # the two heads' names in the table's column headers and the summary line
    heading: str = "A reduced draft vocabulary against the full one"  # the report's title, before `title`
    contrast: str = "{a} draft vocabulary against {b}"  # the figure's subtitle, from the heads' display names

    @property
    def sweep(self) -> Path:
        return SWEEPS / f"{self.name}.toml"

    @property
    def out(self) -> Path:
        return Path("reports") / f"{self.name}.md"

    @property
    def figure(self) -> Path:
        return Path("reports/figures") / f"{self.name.replace('_', '-')}.png"

    @property
    def command(self) -> str:
        return f"python sweeps/pairs.py {self.name}"

    @property
    def begin(self) -> str:  # the marker lines around the generated table (in the block notes)
        return f"<!-- {self.name} table: written by `{self.command}`; do not edit by hand -->"

    @property
    def end(self) -> str:
        return f"<!-- end of the {self.name} table -->"


def _ckpt(name: str) -> Path:
    return Path("drafters/checkpoints") / name


_EPOCHS = dict(heading="More training steps against fewer", contrast="{a} against {b}")
_BACKBONE = dict(settings=(("16", "16 nodes"),), title="TreeFlash on the 8,192-id DFlash gamma-1 backbone at 200k tokens",
                 heading="A better-trained backbone against the first one", contrast="{a} against {b}")
_V8K_DFLASH = dict(title="DFlash gamma 1, 8,192-id draft vocabulary, at 200k tokens",
                   intro="Both heads: every anchor, 200,047 regenerated assistant tokens, gamma 1, bf16, "
                         "`draft_vocab_size=8192`; only `epochs` differs.")
_TREEFLASH_STAGE = ("Both heads: TreeFlash's correction trained for 3 epochs (bf16, every anchor, 200,047 regenerated "
                    "assistant tokens) on a frozen 8,192-id DFlash gamma-1 backbone; only the backbone's epochs differ ")
_V8K_JETSPEC = dict(title="JetSpec gamma 1, 8,192-id draft vocabulary, at 200k tokens",
                    intro="Both heads: every anchor, 200,047 regenerated assistant tokens, gamma 1, bf16, "
                          "`draft_vocab_size=8192`; only `epochs` differs; the soft labels are the target's "
                          "distribution restricted to the 8,192 ids.")
_DFLASH_MARGINAL16, _DFLASH_CHAIN16 = ("marginal-16", "marginal tree, 16 nodes"), ("chain-16", "chain (block 16)")
_JETSPEC_TREE16, _JETSPEC_TREE64 = ("tree-16", "cumulative-log-prob tree, 16 nodes"), ("tree-64", "cumulative-log-prob tree, 64 nodes")

_DFLASH_8K, _TREEFLASH_8K, _JETSPEC_8K = ("dflash-smollm2-135m-r200k-g1", "treeflash-smollm2-135m-r200k-g1bb",
                                          "jetspec-smollm2-135m-r200k-g1")  # each 8,192-id head is {stem}[-e{n}]-v8k
_STEPS = {3: 511, 5: 849, 7: 1186, 10: 1692}  # optimizer steps of the 200k-token recipe at each epoch count


def _epoch_pair(stem: str, a: int, b: int, backbone: bool = False) -> dict:
    """``heads`` and ``short`` of one family's 8,192-id heads trained ``a`` and ``b`` epochs (the 3-epoch head's
    folder has no ``-e3``); ``backbone``: TreeFlash's heads, named after their DFlash backbone's epochs."""
    def head(n: int) -> tuple:
        name = f"{n}-epoch backbone" if backbone else f"{n} epochs ({_STEPS[n]:,} steps)"
        return f"e{n}", name, _ckpt(f"{stem}{'' if n == 3 else f'-e{n}'}-v8k")
    word = " backbone" if backbone else ""
    return dict(heads=(head(a), head(b)), short=(f"{a}-epoch{word}", f"{b}-epoch{word}"))


COMPARISONS = {c.name: c for c in (
    Comparison(
        "block_vocab",
        heads=(("full", "full (49,152 ids)", _ckpt("dflash-smollm2-135m-r200k-g1")),
               ("v8k", "8,192 ids", _ckpt("dflash-smollm2-135m-r200k-g1-v8k"))),
        settings=(_DFLASH_MARGINAL16, _DFLASH_CHAIN16, ("marginal-64", "marginal tree, 64 nodes")),
        title="DFlash gamma 1 at 200k tokens",
        intro="Both heads: every anchor, 200,047 regenerated assistant tokens, gamma 1, bf16, 3 epochs; only "
              "`draft_vocab_size` differs."),
    Comparison(
        "treeflash_vocab",
        heads=(("full", "full (49,152 ids)", _ckpt("treeflash-smollm2-135m-r200k-g1bb")),
               ("v8k", "8,192 ids", _ckpt("treeflash-smollm2-135m-r200k-g1bb-v8k"))),
        settings=(("16", "16 nodes"),),
        title="TreeFlash on the gamma-1 backbone at 200k tokens",
        intro="Both heads: TreeFlash's correction trained on a frozen DFlash gamma-1 backbone (full vocabulary, or "
              "its 8,192-id twin), every anchor, 200,047 regenerated assistant tokens, bf16, 3 epochs."),
    Comparison(
        "jetspec_vocab",
        heads=(("full", "full (49,152 ids)", _ckpt("jetspec-smollm2-135m-r200k-g1")),
               ("v8k", "8,192 ids", _ckpt("jetspec-smollm2-135m-r200k-g1-v8k"))),
        settings=(_JETSPEC_TREE16, ("chain-16", "chain (width 1, 16 nodes)"), _JETSPEC_TREE64),
        title="JetSpec gamma 1 at 200k tokens",
        intro="Both heads: every anchor, 200,047 regenerated assistant tokens, gamma 1, bf16, 3 epochs; only "
              "`draft_vocab_size` differs."),
    Comparison("dflash_epochs", settings=(_DFLASH_MARGINAL16, _DFLASH_CHAIN16), **_epoch_pair(_DFLASH_8K, 3, 5),
               **_V8K_DFLASH, **_EPOCHS),
    Comparison("treeflash_epochs", intro=_TREEFLASH_STAGE + "(3 or 5).", **_epoch_pair(_TREEFLASH_8K, 3, 5, backbone=True),
               **_BACKBONE),
    Comparison("jetspec_epochs", settings=(_JETSPEC_TREE16, _JETSPEC_TREE64), **_epoch_pair(_JETSPEC_8K, 3, 5),
               **_V8K_JETSPEC, **_EPOCHS),
    Comparison("dflash_e7", settings=(_DFLASH_MARGINAL16,), **_epoch_pair(_DFLASH_8K, 5, 7), **_V8K_DFLASH, **_EPOCHS),
    Comparison("treeflash_e7", intro=_TREEFLASH_STAGE + "(5 or 7).", **_epoch_pair(_TREEFLASH_8K, 5, 7, backbone=True),
               **_BACKBONE),
    Comparison("jetspec_e7", settings=(_JETSPEC_TREE16, _JETSPEC_TREE64), **_epoch_pair(_JETSPEC_8K, 5, 7),
               **_V8K_JETSPEC, **_EPOCHS),
    Comparison("dflash_e10", settings=(_DFLASH_MARGINAL16,), **_epoch_pair(_DFLASH_8K, 7, 10), **_V8K_DFLASH, **_EPOCHS),
    Comparison(
        "jetspec_r1600k",
        heads=(("r200k", "200k tokens, 7 epochs (1,186 steps)", _ckpt("jetspec-smollm2-135m-r200k-g1-e7-v8k")),
               ("r1600k", "1.6M tokens, 3 epochs (4,084 steps)", _ckpt("jetspec-smollm2-135m-r1600k-g1-v8k"))),
        settings=(_JETSPEC_TREE16, _JETSPEC_TREE64), short=("200k", "1.6M"),
        heading="Eight times the data against more epochs on the shared set", contrast="{a} against {b}",
        title="JetSpec gamma 1, 8,192-id draft vocabulary",
        intro="Both heads: every anchor of regenerated assistant tokens (the 1.6M-token set extends the shared 200k "
              "one, as for the 1.6M EAGLE-3 head), gamma 1, bf16, `draft_vocab_size=8192`; the 200k head trained 7 "
              "epochs, the 1.6M head 3."),
)}


def card(folder: Path) -> dict | None:
    """The head's training.json (held-out metrics, root probe, cost), or None before it is trained."""
    path = folder / "training.json"
    return json.loads(path.read_text()) if path.exists() else None


def heads_table(cards: dict[str, dict | None], heads: tuple) -> list[str]:
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


def cells_table(tasks: list[str], s: dict, comp: Comparison) -> list[str]:
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


def summary_line(tasks: list[str], s: dict, comp: Comparison) -> str:
    """The two heads' ratios over every cell both have: tau and draft time per step, second head over first."""
    short = comp.short
    both = [(first, second) for _, _, first, second in _pairs(tasks, s, comp) if first is not None and second is not None]
    if not both:
        return "No cell has both heads yet."
    taus = [second["tau_micro"] / first["tau_micro"] for first, second in both]
    drafts = [second["draft_ms"] / first["draft_ms"] for first, second in both]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    paired = ""
    if all("rows" in c for cells in both for c in cells):  # the result rows, from summaries()
        _, lo, hi = report.tau_ratio_interval([(first["rows"], second["rows"]) for first, second in both])
        paired = "" if lo != lo else f"; 95% paired bootstrap interval over prompts {lo:.3f} to {hi:.3f}"
    return (f"Over the {len(taus)} cell{'s' if len(taus) != 1 else ''} both heads ran, the {short[1]} head's tau is "
            f"{mean(taus):.3f}x the {short[0]} head's "
            f"(range {min(taus):.3f} to {max(taus):.3f}{paired}) and its drafting time per step {mean(drafts):.2f}x "
            f"(range {min(drafts):.2f} to {max(drafts):.2f}).")


def readme_table(tasks: list[str], s: dict, cards: dict[str, dict | None], comp: Comparison) -> list[str]:
    return heads_table(cards, comp.heads) + [""] + cells_table(tasks, s, comp) + ["", summary_line(tasks, s, comp)]


def readme_with_table(text: str, table: list[str], begin: str, end: str) -> str:
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


def main(comp: Comparison) -> None:
    plan = sweep.load_sweep(comp.sweep)
    tasks, s = summaries(plan)
    cards = {prefix: card(folder) for prefix, _, folder in comp.heads}
    lines = [f"# {comp.heading}: {comp.title} (CPU, greedy)", "",
             f"Written by `{comp.command}` from `{plan.results_dir}/` (`specbench sweep sweeps/{comp.sweep.name}`) "
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
    write_atomic(comp.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    if (doc := base.write_table(readme_table(tasks, s, cards, comp), comp.begin, comp.end)) is not None:
        print(f"wrote the table between {comp.begin!r} and its end marker into {doc}")


def cli(argv: list[str]) -> int:
    """``NAME ...`` writes each pair's report; ``--list`` prints the names; a wrong name is one line and 2."""
    if argv in (["-h"], ["--help"]):
        print(f"usage: python sweeps/pairs.py NAME [NAME ...] | --list\npairs: {', '.join(COMPARISONS)}")
        return 0
    if not argv:
        print(f"error: name a pair (python sweeps/pairs.py NAME); pairs: {', '.join(COMPARISONS)}", file=sys.stderr)
        return 2
    if argv == ["--list"]:
        print("\n".join(f"{c.name}: {c.heading.lower()}, {c.title}" for c in COMPARISONS.values()))
        return 0
    if unknown := [a for a in argv if a not in COMPARISONS]:
        print(f"error: no pair named {', '.join(map(repr, unknown))}; pairs: {', '.join(COMPARISONS)}", file=sys.stderr)
        return 2
    for name in argv:
        main(COMPARISONS[name])
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
