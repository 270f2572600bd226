"""The block claims tables of issue 10: `python sweeps/block_r200k.py [r200k|g1|e7]` (default r200k).

One table per set of block heads, each named in ``TABLES``: ``r200k`` the 200k-token heads (gamma 7),
``g1`` the gamma-1 heads, ``e7`` the 7-epoch heads with the 8,192-id draft vocabulary. Every table has the
same cells (``specbench sweep sweeps/block_<name>.toml``: every cell of a task paired with one AR
baseline measured in the same run), rules, report and figure. For table NAME this reads
``reports/data/block-NAME/`` and writes ``reports/block_NAME.md``, ``reports/figures/block-NAME-budget.png``
(tau and decode speedup against the node budget, one panel per task) and the table between that table's
own marker lines in the README or the note under ``reports/`` that holds them (``tests/test_sweep.py`` checks
that each such table is what its data gives). Cells that have not run yet show as "-", and a claim with a missing cell says so instead of a
verdict, unless a measured cell already fails it. Each verdict states its rule; none is decided by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specbench import report, results, sweep  # noqa: E402
from specbench.outputs import write_atomic  # noqa: E402

BUDGETS = (16, 32, 64, 128)
# (label prefix, display name) of the families that run at every budget
CURVES = (("dflash-marginal", "DFlash, marginal tree"), ("jetspec", "JetSpec, causal tree"), ("treeflash", "TreeFlash"))
# the 16-node extras: (label, display name)
AT16 = (("dflash-chain-16", "DFlash, chain"), ("jetspec-chain-16", "JetSpec, chain (width 1)"),
        ("jetspec-kbest-16", "JetSpec head, marginal tree"), ("eagle3-16", "EAGLE-3 (200k head), depth 5, top_k 4"))
README = Path("README.md")
NOTES = Path("reports")  # the notes under reports/ that the README links to
SWEEPS = Path(__file__).parent


class Table(NamedTuple):
    """One claims table: its heads and the name of its README marker lines; its sweep file, result files,
    report, figure, command and markers follow from ``key`` (sweeps/block_{key}.toml, reports/block_{key}.md)."""

    key: str
    heads: str  # the report's "Heads:" sentence
    title: str
    marker: str  # the README's marker lines name the table so: "<!-- {marker}: written by ... -->"

    @property
    def sweep(self) -> Path:
        return SWEEPS / f"block_{self.key}.toml"

    @property
    def out(self) -> Path:
        return Path("reports") / f"block_{self.key}.md"

    @property
    def figure(self) -> Path:
        return Path("reports/figures") / f"block-{self.key}-budget.png"

    @property
    def command(self) -> str:
        return "python sweeps/block_r200k.py" + ("" if self.key == "r200k" else f" {self.key}")

    @property
    def begin(self) -> str:
        return f"<!-- {self.marker}: written by `{self.command}`; do not edit by hand -->"

    @property
    def end(self) -> str:
        return f"<!-- end of the {self.marker} -->"


TABLES = {t.key: t for t in (
    Table("r200k", "`drafters/checkpoints/{dflash,jetspec,treeflash}-smollm2-135m-r200k` (every anchor, 200k regenerated "
          "assistant tokens; their TRAINING.md cards)", "Block drafters retrained at 200k tokens", "claims table"),
    Table("g1", "`drafters/checkpoints/dflash-smollm2-135m-r200k-g1`, `jetspec-smollm2-135m-r200k-g1` and "
          "`treeflash-smollm2-135m-r200k-g1bb` (TreeFlash on the frozen DFlash gamma-1 head; every anchor, 200k "
          "regenerated assistant tokens, gamma 1; their TRAINING.md cards)", "Block drafters with gamma 1 at 200k tokens",
          "gamma-1 claims table"),
    Table("e7", "`drafters/checkpoints/dflash-smollm2-135m-r200k-g1-e7-v8k`, `jetspec-smollm2-135m-r200k-g1-e7-v8k` and "
          "`treeflash-smollm2-135m-r200k-g1bb-e7-v8k` (TreeFlash on the frozen DFlash e7 head; every anchor, 200k "
          "regenerated assistant tokens, gamma 1, 8,192 draft ids, 7 epochs for the two backbones and 3 for the "
          "TreeFlash stage; their TRAINING.md cards)", "Block drafters with gamma 1, 8k draft ids and 7 epochs at 200k tokens",
          "7-epoch claims table"),
)}


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def summaries(plan: sweep.Sweep) -> tuple[list[str], dict[tuple[str, str], dict]]:
    """Per (label, task): report.run_summary against the task's AR baseline, plus draft ms per step and the
    cell's rows (``rows``, for paired comparisons of two cells on the same prompts)."""
    baselines = {}
    for path in sorted(plan.results_dir.glob("*.ar-baseline.parquet")):
        df = results.read_results([path])
        df = df[df["drafter"] == report.BASELINE_DRAFTER]
        if len(df):
            baselines[str(df["task"].iloc[0])] = df
    tasks = list(dict.fromkeys(c.task_label for c in plan.cells))
    out = {}
    for cell in plan.cells:
        if not cell.out.exists():
            continue
        df = results.read_results([cell.out])
        s = report.run_summary(df, baselines.get(cell.task_label))
        s["draft_ms"] = 1000 * report.draft_s_per_step(df)
        s["rows"] = df
        out[(cell.label, cell.task_label)] = s
    return tasks, out


def rules(tasks: list[str], s: dict) -> dict:
    """Each claim's rule applied to the cells (None where a cell is missing), shared by the report's claim
    lines and the README's table: ``jetspec`` {task: (causal, marginal, chain, ok)}, ``treeflash``
    {(budget, task): (treeflash, marginal, ok)}, ``dflash`` (dflash, eagle3, ok, paired) and ``jetspec64`` (tau, ok);
    ``paired`` is the text of the DFlash / EAGLE-3 tau ratio with its paired bootstrap interval over the prompts
    (:func:`report.tau_ratio_interval`), or "" without both cells' rows."""
    tau = lambda label, task: (s.get((label, task)) or {}).get("tau_micro")  # noqa: E731
    jet = {}
    for t in tasks:
        c, k, ch = tau("jetspec-16", t), tau("jetspec-kbest-16", t), tau("jetspec-chain-16", t)
        jet[t] = (c, k, ch, None if None in (c, k, ch) else c > k > ch)
    tree = {}
    for b in BUDGETS:
        for t in tasks:
            x, y = tau(f"treeflash-{b}", t), tau(f"dflash-marginal-{b}", t)
            tree[(b, t)] = (x, y, None if x is None or y is None else x > y)
    a, e = tau("dflash-marginal-16", "humaneval"), tau("eagle3-16", "humaneval")
    paired = ""
    cells = [s.get((label, "humaneval")) or {} for label in ("eagle3-16", "dflash-marginal-16")]
    if all("rows" in c for c in cells):
        ratio, lo, hi = report.tau_ratio_interval([(cells[0]["rows"], cells[1]["rows"])])
        if lo == lo:
            paired = f" (ratio {ratio:.3f}, 95% paired interval over prompts {lo:.3f} to {hi:.3f})"
    j64 = tau("jetspec-64", "math500")
    return {"jetspec": jet, "treeflash": tree, "dflash": (a, e, None if a is None or e is None else a >= e, paired),
            "jetspec64": (j64, None if j64 is None else j64 >= 2.5)}


def _all(oks: list[bool | None]) -> bool | None:
    """False once any check fails (a claim over every cell cannot recover), None while one is missing."""
    return False if False in oks else None if None in oks else True


def claim_lines(tasks: list[str], s: dict) -> list[str]:
    """One line per claim of the issue: its rule, the numbers and the verdict (or what is missing)."""
    r = rules(tasks, s)
    lines = []

    def verdict(name: str, rule: str, checks: list[tuple[str, bool | None, str]]) -> None:
        missing = [t for t, ok, _ in checks if ok is None]
        held = [t for t, ok, _ in checks if ok]
        detail = "; ".join(f"{t}: {d}" for t, _, d in checks)
        failed = [t for t, ok, _ in checks if ok is False]
        if missing and failed:  # an every-cell claim is decided by its first failure
            word = f"**not reproduced** (fails on {', '.join(failed)}; {', '.join(missing)} not measured yet)"
        elif missing:
            word = f"not measured yet ({', '.join(missing)} missing)"
        else:
            word = "**reproduced**" if len(held) == len(checks) else f"**not reproduced** (holds on {len(held)} of {len(checks)})"
        lines.append(f"- {name} ({rule}): {word}. {detail}.")

    verdict("JetSpec's ordering", "tau of its causal tree > marginal tree > chain on the same head, 16 nodes, every task",
            [(t, ok, f"{_fmt(c)} > {_fmt(k)} > {_fmt(ch)}") for t, (c, k, ch, ok) in r["jetspec"].items()])
    verdict("TreeFlash over its own marginal tree", "tau with the correction > without, at every budget and task",
            [(t, _all([r["treeflash"][(b, t)][2] for b in BUDGETS]),
              ", ".join(f"{b}: {_fmt(r['treeflash'][(b, t)][0])} vs {_fmt(r['treeflash'][(b, t)][1])}" for b in BUDGETS))
             for t in tasks])
    a, e, ok, paired = r["dflash"]
    verdict("DFlash against EAGLE-3 (issue target)", "16-node marginal-tree tau on humaneval >= EAGLE-3's 16-node tau",
            [("humaneval", ok, f"{_fmt(a)} vs {_fmt(e)}{paired}")])
    a, ok = r["jetspec64"]
    verdict("JetSpec at budget 64 (issue target)", "tau on math500 >= 2.5", [("math500", ok, f"{_fmt(a)}")])
    return lines


def readme_table(tasks: list[str], s: dict) -> list[str]:
    """The README's claims table: one row per claim with its rule, verdict and numbers (the rules of
    :func:`rules`; the issue's two targets read "reached" or "not reached")."""
    r = rules(tasks, s)
    rows = ["| claim (rule) | verdict | numbers |", "|---|---|---|"]

    def word(oks: list[bool | None], unit: str, target: bool = False) -> str:
        n_missing = sum(ok is None for ok in oks)
        if n_missing and False in oks:  # an every-cell claim is decided by its first failure
            return f"**not reproduced** (fails on {sum(ok is False for ok in oks)} of {len(oks)} {unit}; {n_missing} not measured yet)"
        if n_missing:
            return f"not measured yet ({n_missing} of {len(oks)} {unit} missing)"
        if target:
            return "**reached**" if all(oks) else "**not reached**"
        held = sum(bool(ok) for ok in oks)
        return f"**{'reproduced' if held == len(oks) else 'not reproduced'}** ({held} of {len(oks)}{' ' + unit if held < len(oks) else ''})"

    jet = r["jetspec"]
    series = lambda i: " / ".join(_fmt(jet[t][i]) for t in tasks)  # noqa: E731
    rows.append("| JetSpec's ordering: its causal tree > the marginal tree > the chain, same head, 16 nodes, every task | "
                f"{word([jet[t][3] for t in tasks], 'tasks')} | causal {series(0)}, marginal {series(1)}, "
                f"chain {series(2)} ({' / '.join(tasks)}) |")
    tree = r["treeflash"]
    ends = "; ".join(f"{b} nodes: " + ", ".join(f"{_fmt(tree[(b, t)][0])} vs {_fmt(tree[(b, t)][1])}" for t in tasks)
                     for b in (BUDGETS[0], BUDGETS[-1]))
    rows.append(f"| TreeFlash over its own marginal tree, every budget and task | {word([v[2] for v in tree.values()], 'cells')} | {ends} |")
    a, e, ok, paired = r["dflash"]
    rows.append("| DFlash 16-node marginal tree >= EAGLE-3 16 nodes on humaneval (issue target) | "
                f"{word([ok], 'cells', target=True)} | {_fmt(a)} vs {_fmt(e)}{paired} |")
    a, ok = r["jetspec64"]
    rows.append(f"| JetSpec tau at budget 64 on math500 >= 2.5 (issue target) | {word([ok], 'cells', target=True)} | {_fmt(a)} |")
    return rows


def readme_with_table(text: str, table: list[str], begin: str = TABLES["r200k"].begin, end: str = TABLES["r200k"].end) -> str:
    """``text`` (a markdown file) with the lines between ``begin`` and ``end`` replaced by ``table``."""
    head, sep, rest = text.partition(begin + "\n")
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise SystemExit(f"no lines {begin!r} and {end!r} around a table")
    return head + sep + "\n".join(table) + "\n" + sep2 + tail


def doc_with(begin: str) -> Path | None:
    """The markdown file that holds the marker line ``begin``: the README or one of the notes under ``reports/``
    (paths from the repository root); None when none does (e.g. run from elsewhere). Two holding it is an error."""
    found = [p for p in (README, *sorted(NOTES.glob("*.md"))) if p.is_file() and begin + "\n" in p.read_text()]
    if len(found) > 1:
        raise SystemExit(f"the marker {begin!r} is in {len(found)} files ({', '.join(map(str, found))}); keep it in one")
    return found[0] if found else None


def write_table(table: list[str], begin: str, end: str) -> Path | None:
    """Replace the lines between ``begin`` and ``end`` in the file :func:`doc_with` finds; return that file."""
    doc = doc_with(begin)
    if doc is not None:
        write_atomic(doc, readme_with_table(doc.read_text(), table, begin, end))  # a README never half-written
    return doc


def main(table: Table) -> None:
    """Write ``table``'s report, figure and README claims table from the result files of its sweep."""
    sweep_file, out, figure, heads, title = table.sweep, table.out, table.figure, table.heads, table.title
    plan = sweep.load_sweep(sweep_file)
    tasks, s = summaries(plan)
    lines = [f"# {title} on smollm2-135m (CPU, greedy)", "",
             f"Written by `{table.command}` from `{plan.results_dir}/` "
             f"(`specbench sweep sweeps/{sweep_file.name}`). "
             f"Heads: {heads}, EAGLE-3's 200k head for reference. At most 128 new tokens; budgets count "
             "the root; each decode speedup is against its task's AR baseline from the same run.", "",
             "## Claims", ""]
    lines += claim_lines(tasks, s)
    files = sorted(plan.results_dir.glob("*.parquet"))
    if files and (note := report.shared_cpu_note(results.read_results(files))) is not None:
        lines += ["", f"**Warning:** {note}"]

    lines += ["", "## tau / decode speedup against the node budget", "",
              "| task | drafter | " + " | ".join(f"{b} nodes" for b in BUDGETS) + " |", "|---|---|" + "---:|" * len(BUDGETS)]
    for t in tasks:
        for prefix, name in CURVES:
            cells = [s.get((f"{prefix}-{b}", t)) for b in BUDGETS]
            lines.append(f"| {t} | {name} | " + " | ".join(
                "-" if c is None else f"{_fmt(c['tau_micro'])} / {_fmt(c['decode_speedup_sum'])}x" for c in cells) + " |")

    lines += ["", "## Every cell", "",
              "| task | setting | prompts | tau | draft ms / step | draft share | decode speedup (sum / mean) | lossless |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    names = dict(AT16) | {f"{p}-{b}": f"{n}, {b} nodes" for p, n in CURVES for b in BUDGETS}
    for t in tasks:
        for label, name in names.items():
            c = s.get((label, t))
            if c is None:
                continue
            lines.append(f"| {t} | {name} | {c['n_prompts']} | {_fmt(c['tau_micro'])} | {_fmt(c['draft_ms'], '.1f')} | "
                         f"{_fmt(100 * c['draft_share'], '.1f')}% | {_fmt(c['decode_speedup_sum'])}x / {_fmt(c['decode_speedup_mean'])}x | "
                         f"{ {True: 'yes', False: 'NO', None: '-'}[c['lossless']]} |")

    plotted = [t for t in tasks if any((f"{p}-{b}", t) in s for p, _ in CURVES for b in BUDGETS)]
    if plotted:
        fig, axes = plt.subplots(2, len(plotted), figsize=(max(6.4, 3.2 * len(plotted)), 5.6), squeeze=False, sharex=True)
        for j, t in enumerate(plotted):
            for prefix, name in CURVES:
                pts = [(b, s[(f"{prefix}-{b}", t)]) for b in BUDGETS if (f"{prefix}-{b}", t) in s]
                if pts:
                    axes[0][j].plot([b for b, _ in pts], [c["tau_micro"] for _, c in pts], marker="o", label=name)
                    axes[1][j].plot([b for b, _ in pts], [c["decode_speedup_sum"] for _, c in pts], marker="o", label=name)
            axes[0][j].set_title(t, fontsize=9)
            axes[1][j].axhline(1.0, color="grey", lw=0.8, ls="--")
            axes[1][j].set_xlabel("node budget (root included)")
            for ax in (axes[0][j], axes[1][j]):
                ax.set_xscale("log", base=2)
                ax.set_xticks(BUDGETS, [str(b) for b in BUDGETS])
                ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("tau")
        axes[1][0].set_ylabel("decode speedup over AR (this CPU)")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{title}, smollm2-135m, greedy", fontsize=9)
        fig.tight_layout()
        figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure, dpi=150)
        lines += ["", f"![tau and decode speedup against the node budget]({figure.relative_to('reports')})"]
        print(f"wrote {figure}")
    out.parent.mkdir(exist_ok=True)
    write_atomic(out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    if (doc := write_table(readme_table(tasks, s), table.begin, table.end)) is not None:
        print(f"wrote the claims table into {doc}")


def cli(argv: list[str]) -> int:
    """``[NAME]`` writes that table (r200k when none is named); ``--list`` prints the names; a wrong name is
    one line and exit status 2."""
    if argv in (["-h"], ["--help"]):
        print(f"usage: python sweeps/block_r200k.py [NAME] | --list\ntables: {', '.join(TABLES)} (default r200k)")
        return 0
    if argv == ["--list"]:
        print("\n".join(f"{t.key}: {t.title} ({t.sweep.name})" for t in TABLES.values()))
        return 0
    if len(argv) > 1 or (argv and argv[0] not in TABLES):
        print(f"error: no claims table named {' '.join(argv)!r}; name one of {', '.join(TABLES)} "
              "(python sweeps/block_r200k.py [NAME])", file=sys.stderr)
        return 2
    main(TABLES[argv[0] if argv else "r200k"])
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
