"""`specbench report`: a self-contained HTML page whose every figure renders non-blank in headless
Chromium, and a markdown page whose every link resolves. Synthetic result rows, no model."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rowfactory import synthetic_row
from typer.testing import CliRunner

from specbench import cli, results
from specbench.reporting import figures as report_figures

TASKS = ("alpha", "beta")
# (drafter, config, accepted per step); the adaptive one accepts more as the run goes on
SETTINGS = [
    ("ar", "{}", lambda i: [0] * 12),
    ("ngram", '{"num_draft": 2}', lambda i: [1, 0, 2, 1, 0, 2]),
    ("ngram", '{"num_draft": 4}', lambda i: [3, 1, 0, 4, 2]),
    ("toy-adaptive", '{"adapt": "bandit", "budget": 8}', lambda i: [min(i, 4)] * 4),
    ("toy-adaptive", '{"adapt": "off", "budget": 8}', lambda i: [1] * 4),
]
N_PROMPTS = 6


@pytest.fixture(scope="module")
def result_files(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("results")
    paths = []
    for task in TASKS:
        for k, (drafter, config, accepted) in enumerate(SETTINGS):
            out = folder / f"{task}-{k}.parquet"
            writer = results.RunWriter(out, resume=False)
            for i in range(N_PROMPTS):
                acc = accepted(i)
                writer.add([synthetic_row(
                    f"p{i}", 0, acc, run_id=out.stem, drafter=drafter, drafter_config=config, task=task,
                    tree_size_per_step=[1 if drafter == "ar" else 6] * len(acc),
                    tree_depth_per_step=[0 if drafter == "ar" else 4] * len(acc),
                    output_ids=list(range(12)), n_new_tokens=sum(a + 1 for a in acc) if drafter != "ar" else 12,
                    decode_s=1.2 if drafter == "ar" else 0.8 + 0.05 * k, draft_s=0.0 if drafter == "ar" else 0.1,
                )])
            writer.finish()
            paths.append(out)
    return paths


@pytest.fixture(scope="module")
def report_dir(result_files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    result = CliRunner().invoke(cli.app, ["report", str(result_files[0].parent / "*.parquet"), "--out", str(out),
                                          "--title", "test report"])
    assert result.exit_code == 0, result.output
    return out


def expected_figures() -> set[str]:
    stems = {"tau_by_task_tiny-llama", "speedup_by_task_tiny-llama", "budget_tiny-llama"}
    stems |= {f"learning_tiny-llama_{t}" for t in TASKS}
    stems |= {f"{kind}_tiny-llama_{t}" for t in TASKS for kind in ("acceptance", "accepted_hist", "speedup", "time_breakdown")}
    return stems


def test_report_files_and_self_contained_html(report_dir):
    html = (report_dir / "report.html").read_text()
    ids = set(re.findall(r'<figure id="([^"]+)">', html))
    assert ids == expected_figures()
    for stem in ids:
        assert (report_dir / "figures" / f"{stem}.png").stat().st_size > 1000
        assert (report_dir / "figures" / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
    # self-contained: every image is inline, nothing is fetched
    srcs = re.findall(r'\b(?:src|href)="([^"]*)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs), [s[:40] for s in srcs if not s.startswith("data:")]
    assert "<table>" in html and "toy-adaptive" in html and "Environment of every run" in html
    assert html.count("<img ") == len(ids)


def test_markdown_links_resolve(report_dir):
    md = (report_dir / "report.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", md)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {Path(i).stem for i in images} == expected_figures()
    assert len(links) == 2 * len(images)  # each figure: the PNG shown and its PDF linked
    for link in links:
        assert not re.match(r"^[a-z]+://", link), link
        assert (report_dir / link).is_file(), f"broken link {link}"
    assert "| run_id |" in md and md.count("\n| alpha-") + md.count("\n| beta-") == len(TASKS) * len(SETTINGS)


def test_learning_curve_only_for_an_adaptive_drafter(result_files):
    df = results.read_results(result_files)
    from specbench import plots

    series = plots.series_of(df[df["task"] == "alpha"])
    adaptive = report_figures.adaptive_series(series)
    assert sorted(s.config for s in adaptive) == ['{"adapt": "bandit", "budget": 8}', '{"adapt": "off", "budget": 8}']
    rising = next(s for s in adaptive if "bandit" in s.config)
    assert list(report_figures.learning_curve(rising.rows)["tau"]) == [1.0, 2.0, 3.0, 4.0, 5.0, 5.0]
    families = report_figures.budget_families(series)
    assert [(d, o, [v for v, _ in pts]) for d, o, pts in families] == [("ngram", "num_draft", [2.0, 4.0])]
    assert report_figures.adaptive_series([s for s in series if s.drafter != "toy-adaptive"]) == []


_PROBE = """
<script>
window.addEventListener('load', () => {
  const out = [];
  for (const img of document.images) {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    let std = 0, ink = 0;
    if (img.naturalWidth > 0) {
      const ctx = c.getContext('2d');
      ctx.drawImage(img, 0, 0);
      const d = ctx.getImageData(0, 0, c.width, c.height).data;
      let s = 0, s2 = 0, n = d.length / 4;
      for (let i = 0; i < d.length; i += 4) {
        const g = (d[i] + d[i + 1] + d[i + 2]) / 3;
        s += g; s2 += g * g; if (g < 200) ink++;
      }
      std = Math.sqrt(Math.max(0, s2 / n - (s / n) * (s / n))); ink = ink / n;
    }
    out.push({id: img.parentElement.id, w: img.naturalWidth, h: img.naturalHeight, std: std, ink: ink});
  }
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_every_figure_renders_non_blank_in_headless_chromium(report_dir, tmp_path):
    browser = _chromium()
    if browser is None:
        reason = "no headless Chromium on this machine (apt-get install -y chromium)"
        print(f"skipping: {reason}")
        pytest.skip(reason)
    page = tmp_path / "probe.html"
    # a blank white figure as a control: the probe must tell it apart from the report's
    blank = io.BytesIO()
    fig = Figure(figsize=(4, 3), dpi=100)
    FigureCanvasAgg(fig)
    fig.savefig(blank, format="png", facecolor="white")
    control = f'<figure id="blank-control"><img src="data:image/png;base64,{base64.b64encode(blank.getvalue()).decode()}"></figure>'
    page.write_text((report_dir / "report.html").read_text().replace("</body>", control + _PROBE + "</body>"))
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--allow-file-access-from-files",
         "--virtual-time-budget=20000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    match = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert match, f"Chromium returned no probe (rc {proc.returncode}): {proc.stderr[-600:]}"
    probe = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    control = [p for p in probe if p["id"] == "blank-control"]
    assert len(control) == 1 and control[0]["w"] == 400 and control[0]["std"] < 1 and control[0]["ink"] == 0, control
    probe = [p for p in probe if p["id"] != "blank-control"]
    assert {p["id"] for p in probe} == expected_figures()
    for p in probe:
        assert p["w"] > 200 and p["h"] > 100, p  # decoded
        assert p["std"] > 10 and p["ink"] > 0.002, p  # not a blank canvas


def two_runs(folder: Path, ar: dict, ngram: dict) -> list[str]:
    """An AR run and an ngram run, three prompts each on task alpha, with the same outputs; ``ar`` and
    ``ngram`` override fields of their rows. Returns the two files."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for drafter, accepted, fields in (("ar", [0] * 12, ar), ("ngram", [1, 0, 2, 1, 0, 2], ngram)):
        out = folder / f"{drafter}.parquet"
        writer = results.RunWriter(out, resume=False)
        for i in range(3):
            writer.add([synthetic_row(f"p{i}", 0, accepted, run_id=out.stem, drafter=drafter, task="alpha",
                                      output_ids=list(range(12)), n_new_tokens=12, **fields)])
        writer.finish()
        paths.append(str(out))
    return paths


def test_report_checks_lossless_against_another_machine(tmp_path):
    """With the AR baseline from another machine the page leaves speedups out but still checks the outputs."""
    paths = two_runs(tmp_path / "in", ar={"device_name": "Other CPU"}, ngram={"device_name": "Test CPU"})
    refused = CliRunner().invoke(cli.app, ["report", *paths, "--out", str(tmp_path / "no")])
    assert refused.exit_code == 2 and "mix hardware" in refused.stderr
    result = CliRunner().invoke(cli.app, ["report", *paths, "--out", str(tmp_path / "page"), "--lossless-across-machines"])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "page" / "report.md").read_text()
    assert "Lossless checks 3 (prompt, turn) pairs against AR outputs from another machine" in page
    lines = page.splitlines()
    ngram = next(i for i, line in enumerate(lines) if line.startswith("| ") and " ngram " in line)
    header = next(lines[i].strip("| ").split(" | ") for i in range(ngram, -1, -1) if lines[i].startswith("| target"))
    row = dict(zip(header, lines[ngram].strip("| ").split(" | ")))
    shown = [row[c] for c in ("decode_speedup_sum", "decode_speedup_mean", "e2e_speedup_sum", "e2e_speedup_mean",
                              "lossless", "divergence")]
    assert shown == ["-", "-", "-", "-", "yes", "-"], row  # four speedups, lossless, divergence


def test_report_warns_when_a_run_shared_the_cpu(tmp_path, monkeypatch):
    """An AR baseline timed beside another process: the page says so under its title; the figures drawn from
    timings carry it (per-task subtitles, the per-target speedup title); the tau and acceptance ones do not."""
    from specbench import plots

    paths = two_runs(tmp_path / "in", ar={"load_1min": 9.0}, ngram={"load_1min": 0.5})
    titles: dict[str, str] = {}
    subtitles: dict[str, str] = {}
    finish = report_figures._finish

    def record_title(fig, title):
        titles[title.split(" — ")[0]] = title
        return finish(fig, title)

    def recorder(kind, draw):
        def recorded(series, subtitle, path):
            subtitles[kind] = subtitle
            return draw(series, subtitle, path)
        return recorded

    monkeypatch.setattr(report_figures, "_finish", record_title)
    monkeypatch.setattr(plots, "FIGURES", tuple((kind, recorder(kind, draw)) for kind, draw in plots.FIGURES))
    result = CliRunner().invoke(cli.app, ["report", *paths, "--out", str(tmp_path / "page")])
    assert result.exit_code == 0, result.output
    intro = (tmp_path / "page" / "report.md").read_text().splitlines()[2]
    assert "Warning: 1 of 2 runs were timed while other processes shared the CPU: ar on alpha (load 9.0, 4 threads)" in intro
    warning = plots.SHARED_CPU_SUBTITLE.removeprefix(" · ")
    assert {kind: warning in s for kind, s in subtitles.items()} == {
        "acceptance": False, "accepted_hist": False, "speedup": True, "time_breakdown": True}
    assert warning in titles["Decode speedup per task"] and warning not in titles["τ per task"]
