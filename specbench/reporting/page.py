"""`specbench report FILES --out DIR`: one page a person opens.

Writes ``DIR/report.html`` (self-contained: CSS inline, every figure a base64 PNG), ``DIR/report.md``
and ``DIR/figures/*.png`` + ``*.pdf`` that the markdown links to. Sections: the compare table
(``report.compare`` / ``report.format_compare``), per target the figures of
:mod:`specbench.reporting.figures`, per (target, task) the figures of :mod:`specbench.plots`, and
the environment fingerprint of every run.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench import plots, report, results
from specbench.errors import UserError
from specbench.outputs import check_folder, write_atomic
from specbench.reporting import figures

# (kind, draw, title, caption) of the per-(target, task) figures drawn by specbench.plots
_TASK_FIGURES = {
    "acceptance": ("Per-depth acceptance", "P(accepted ≥ d) at every depth any drafter reached: the share of steps whose "
                   "accepted draft reaches depth d."),
    "accepted_hist": ("Accepted length per step", "The share of steps per number of accepted draft tokens (the bonus "
                      "token excluded)."),
    "speedup": ("Speedup and τ", "Decode speedup over the paired AR baseline (ratio of sums) beside τ."),
    "time_breakdown": ("Time per decode step", "Mean seconds per step spent drafting, verifying (the target forward) and "
                       "in the rest of the loop, AR included."),
}

# the environment fingerprint of a run, as stored in its rows (extra columns shown when present)
ENV_COLUMNS = ["run_id", "target", "task", "drafter", "device", "device_name", "cpu_model", "threads", "dtype",
               "torch_version", "transformers_version", "python_version", "specbench_sha", "checkpoint_hash"]
ENV_EXTRA = ["device_map", "world_size", "checkpoint_sha256", "checkpoint_path"]


@dataclass
class Section:
    title: str
    level: int = 2
    text: str = ""
    figures: list[tuple[figures.Figure | None, str, str, str]] = field(default_factory=list)  # (_, stem, title, caption)


@dataclass
class Written:
    html: Path
    markdown: Path
    figures: list[Path]


def environment(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run (run_id) with its fingerprint columns and its number of rows."""
    columns = [c for c in ENV_COLUMNS + ENV_EXTRA if c in df.columns]
    first = df.drop_duplicates("run_id", keep="first")[columns].copy()
    counts = df.groupby("run_id").size()
    first.insert(4, "rows", first["run_id"].map(counts).astype(int))
    return first.sort_values(["target", "task", "drafter", "run_id"]).reset_index(drop=True)


def _markdown_table(frame: pd.DataFrame) -> str:
    def cell(value) -> str:
        text = "-" if value is None or (isinstance(value, float) and value != value) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


_PIPE = re.compile(r"(?<!\\)\|")


def markdown_table_to_html(text: str) -> str:
    """A GitHub-style pipe table (as report.format_compare writes it) as an HTML table."""
    rows = [line.strip() for line in text.strip().splitlines() if line.strip().startswith("|")]
    if len(rows) < 2:
        return f"<pre>{html.escape(text)}</pre>"

    def cells(line: str) -> list[str]:
        parts = _PIPE.split(line.strip().strip("|"))
        return [p.strip().replace("\\|", "|") for p in parts]

    aligns = ["right" if c.endswith(":") else "left" for c in cells(rows[1])]
    out = ["<table>", "<thead><tr>"]
    out += [f"<th style=\"text-align:{a}\">{html.escape(c)}</th>" for c, a in zip(cells(rows[0]), aligns)]
    out.append("</tr></thead><tbody>")
    for line in rows[2:]:
        out.append("<tr>" + "".join(f"<td style=\"text-align:{a}\">{html.escape(c)}</td>"
                                    for c, a in zip(cells(line), aligns)) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _save(fig_dir: Path, stem: str, figure) -> list[Path]:
    paths = []
    for suffix in ("png", "pdf"):
        path = fig_dir / f"{stem}.{suffix}"
        try:
            figure.savefig(path, dpi=figures.DPI, format=suffix, facecolor="white", bbox_inches="tight")
        except OSError as e:
            raise UserError(f"cannot write {path} ({e.strerror or e}); choose another --out") from None
        paths.append(path)
    return paths


def write_report(files: list[Path], out_dir: Path | str, allow_mixed: bool = False, title: str | None = None,
                 lossless_across_machines: bool = False) -> Written:
    """Read ``files`` and write the report into ``out_dir`` (created); returns what was written.
    ``lossless_across_machines`` is compare's ``outputs_across_machines`` (the page says when it was used)."""
    df = results.read_results(files)
    if df.empty:
        raise UserError("the results files hold no rows; nothing to report")
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    check_folder(fig_dir, "--out", "the report")
    # refuses mixed devices unless allow_mixed (or lossless_across_machines)
    compare = report.compare(df, allow_mixed=allow_mixed, outputs_across_machines=lossless_across_machines)
    compare_md = report.format_compare(compare, "markdown")

    written: list[Path] = []
    sections: list[Section] = []
    for target, stem, group in figures.per_target(df):
        section = Section(f"Target {target}")
        for fig in (figures.tau_and_speedup_by_task(target, group, stem) + figures.budget_curves(target, group, stem)
                    + figures.learning_curves(target, group, stem)):
            written += _save(fig_dir, fig.key, fig.figure)
            section.figures.append((fig, fig.key, fig.title, fig.caption))
        if not any(f[1].startswith("learning_") for f in section.figures):
            section.text = (f"No adaptive drafter (a drafter setting `{figures.ADAPT_OPTION}` that is on) ran on {target}, "
                            "so there is no learning curve.")
        sections.append(section)
        for task, rows in group.groupby("task", sort=True):
            task_stem = f"{stem}_{plots.sanitize(task)}"
            sub = Section(f"{target} · {task}", level=3, text=plots.caption(rows))
            series = plots.series_of(rows)
            for kind, draw in plots.FIGURES:
                name = f"{kind}_{task_stem}"
                for suffix in ("png", "pdf"):
                    written.append(draw(series, plots.subtitle(rows, kind), fig_dir / f"{name}.{suffix}"))
                title_text, caption_text = _TASK_FIGURES.get(kind, (kind, ""))
                sub.figures.append((None, name, f"{title_text} — {target} · {task}", caption_text))
            sections.append(sub)

    env = environment(df)
    title = title or "specbench report"
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    intro = (f"{len(files)} result file{'s' if len(files) != 1 else ''}, {len(df)} rows, {env.shape[0]} runs; "
             f"written {stamp} by `specbench report`. Metrics are defined in specbench/report.py (README: Metrics).")
    note = report.cross_machine_note(compare)
    if note:
        intro += f" Note: {note[0].upper()}{note[1:]}."
    if (shared := report.shared_cpu_note(df)) is not None:
        intro += f" Warning: {shared}"

    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    write_atomic(md_path, _markdown(title, intro, files, compare_md, sections, env))
    write_atomic(html_path, _html(title, intro, files, compare_md, sections, env, fig_dir))
    return Written(html_path, md_path, written)


def _markdown(title, intro, files, compare_md, sections, env) -> str:
    parts = [f"# {title}", "", intro, "", "Sources: " + ", ".join(f"`{f}`" for f in files), "",
             "## Compare", "", compare_md.rstrip(), ""]
    for s in sections:
        parts += ["#" * s.level + " " + s.title, ""]
        if s.text:
            parts += [s.text, ""]
        for _, stem, fig_title, caption in s.figures:
            parts += [f"![{fig_title}](figures/{stem}.png)", "", f"{caption} (PDF: [figures/{stem}.pdf](figures/{stem}.pdf))", ""]
    parts += ["## Environment of every run", "", _markdown_table(env)]
    return "\n".join(parts)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; } h3 { margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 12px; margin: 1em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #ddd; padding: 3px 6px; white-space: nowrap; } th { background: #f4f4f4; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 13px; color: #555; margin-top: .3em; } .muted { color: #666; font-size: 13px; }
code { background: #f4f4f4; padding: 0 3px; }
"""


def _html(title, intro, files, compare_md, sections, env, fig_dir: Path) -> str:
    esc = html.escape
    body = [f"<h1>{esc(title)}</h1>", f"<p class=\"muted\">{esc(intro)}</p>",
            "<p class=\"muted\">Sources: " + ", ".join(f"<code>{esc(str(f))}</code>" for f in files) + "</p>",
            "<h2 id=\"compare\">Compare</h2>", markdown_table_to_html(compare_md)]
    for s in sections:
        body.append(f"<h{s.level}>{esc(s.title)}</h{s.level}>")
        if s.text:
            body.append(f"<p class=\"muted\">{esc(s.text)}</p>")
        for _, stem, fig_title, caption in s.figures:
            data = base64.b64encode((fig_dir / f"{stem}.png").read_bytes()).decode("ascii")
            body.append(f"<figure id=\"{esc(stem)}\"><img alt=\"{esc(fig_title)}\" src=\"data:image/png;base64,{data}\">"
                        f"<figcaption><b>{esc(fig_title)}.</b> {esc(caption)}</figcaption></figure>")
    body += ["<h2 id=\"environment\">Environment of every run</h2>", markdown_table_to_html(_markdown_table(env))]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{esc(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


__all__ = ["ENV_COLUMNS", "Written", "environment", "markdown_table_to_html", "write_report"]
