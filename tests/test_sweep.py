"""`specbench sweep`: grid expansion, one-line errors for bad files, skip / resume / shared baselines
with the local executor, and the Ray executor giving the same tokens as the local one (tiny targets)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pandas as pd
import pytest
from rich.cells import cell_len
from rich.console import Console

from specbench import report, runner, sweep
from clirun import invoke, one_error_line
from rowfactory import synthetic_row

PROMPTS = [{"id": "p1", "prompt": "List three colours."}, {"id": "p2", "prompt": "1 2 3 4 5 6"}]


@pytest.fixture(autouse=True, scope="module")
def _setup(wide_console):
    yield


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def outputs(folder: Path) -> dict[str, dict]:
    """file name -> {(prompt, turn): output ids} for every parquet in ``folder``."""
    out = {}
    for path in sorted(folder.glob("*.parquet")):
        df = pd.read_parquet(path)
        out[path.name] = {(p, int(t)): [int(x) for x in ids] for p, t, ids in zip(df["prompt_id"], df["turn"], df["output_ids"])}
    return out


GRID = """
results_dir = "{res}"
targets = ["tiny-llama", "tiny-qwen3"]
tasks = [{{file = "{tasks}", label = "two"}}, {{name = "humaneval", limit = 2, max_new_tokens = 5}}]
temperatures = [0, 0.5]
max_new_tokens = 7
limit = 1

[[drafters]]
drafter = "ngram"
set = {{num_draft = [2, 3], min_n = 1}}
label = "ng{{num_draft}}"

[[drafters]]
drafter = "ar"
tasks = ["two"]
targets = ["tiny-qwen3"]
"""


def test_grid_expands_in_baseline_groups(tmp_path, prompts):
    plan = sweep.load_sweep(write(tmp_path, GRID.format(res=tmp_path / "res", tasks=prompts)))
    # 2 targets x 2 tasks x 2 temperatures x 2 ngram settings, plus ar on (tiny-qwen3, two) at 2 temperatures
    assert len(plan.cells) == 2 * 2 * 2 * 2 + 2
    names = [c.name for c in plan.cells]
    assert len(set(names)) == len(names)
    assert names[0] == "tiny-llama_two_ng2_T0_s0" and names[1] == "tiny-llama_two_ng3_T0_s0"
    # an explicit ar cell leads its group (the drafters then reuse its rows)
    qwen_two = [c for c in plan.cells if c.group == ("tiny-qwen3", "two", 0.0, 0)]
    assert [c.spec.drafter for c in qwen_two] == ["ar", "ngram", "ngram"]
    assert plan.leaders()[("tiny-qwen3", "two", 0.0, 0)] is qwen_two[0]
    cell = next(c for c in plan.cells if c.name == "tiny-qwen3_humaneval_ng3_T0.5_s0")
    assert cell.spec.options == ("num_draft=3", "min_n=1")
    assert (cell.spec.task, cell.spec.limit, cell.spec.max_new_tokens, cell.spec.temperature) == ("humaneval", 2, 5, 0.5)
    assert cell.spec.out == tmp_path / "res" / f"{cell.name}.parquet" and cell.spec.resume
    two = next(c for c in plan.cells if c.task_label == "two")
    assert (two.spec.task_file, two.spec.limit, two.spec.max_new_tokens) == (prompts, 1, 7)
    rows = sweep.describe(plan)
    assert [r["state"] for r in rows] == ["new"] * len(rows)
    assert rows[1]["baseline"] == "AR of #1" and rows[0]["baseline"] == "runs AR"
    # --only narrows the grid by cell name; a pattern that matches nothing is an error naming the fix
    only = sweep.select(plan, ["tiny-qwen3_two_*_T0_s0", "*_humaneval_ng3_T0.5_s0"])
    want = {c.name for c in qwen_two} | {"tiny-llama_humaneval_ng3_T0.5_s0", "tiny-qwen3_humaneval_ng3_T0.5_s0"}
    assert [c.name for c in only.cells] == [c.name for c in plan.cells if c.name in want] and len(want) == 5
    assert sweep.select(plan, []) is plan
    from specbench.errors import UserError

    with pytest.raises(UserError, match="--only 'ng9' matches no cell.*--dry-run"):
        sweep.select(plan, ["ng9"])


def test_dry_run_fits_the_terminal(tmp_path, prompts):
    """--dry-run names the settings every cell shares once, under the table; a terminal too narrow for
    the table gets one record per cell, every line within its width."""
    plan = sweep.load_sweep(write(tmp_path, f"""
results_dir = "{tmp_path / 'res'}"
targets = ["tiny-llama"]
tasks = [{{file = "{prompts}", label = "two", limit = 1}}, "humaneval"]
max_new_tokens = 5
[[drafters]]
drafter = "ngram"
set = {{num_draft = [2, 4]}}
"""))

    def printed(width: int) -> list[str]:
        console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
        for item in sweep.describe_view(plan, width):
            console.print(item, crop=False)
        return console.file.getvalue().splitlines()

    wide = printed(200)
    header = next(line for line in wide if "cell (file stem)" in line).split("┃")
    assert [h.strip() for h in header if h.strip()] == ["#", "cell (file stem)", "options", "limit", "state", "baseline"]
    assert wide[-1].rstrip() == "every cell: drafter ngram · T 0 · seed 0 · max new 5"
    narrow = printed(60)
    assert max(cell_len(line) for line in narrow) <= 60 and not any("┃" in line for line in narrow)
    heads = [line for line in narrow if line.startswith("#")]
    assert heads[0] == "#1 tiny-llama_two_ngram-num_draft=2_T0_s0 · new · baseline:" and len(heads) == 4
    assert narrow[narrow.index(heads[0]):narrow.index(heads[1])] == [heads[0], "    runs AR", "  options num_draft=2  limit 1"]
    assert narrow[-1] == "every cell: drafter ngram · T 0 · seed 0 · max new 5"


@pytest.mark.parametrize("body, words", [
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\ncolour = 1\n[[drafters]]\ndrafter = "ngram"\n', ["unknown key 'colour'", "top level"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\n[[drafters]]\ndrafter = "ngram"\nsett = {num_draft = 2}\n',
     ["unknown key 'sett'", "drafters entry 1 (ngram)"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\n[[drafters]]\ndrafter = "nogram"\n',
     ["cell tiny-llama_humaneval_nogram_T0_s0", "unknown drafter 'nogram'"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\n[[drafters]]\ndrafter = "ngram"\nset = {num_draft = [2, 3], bogus = 1}\n',
     ["cell tiny-llama_humaneval_ngram-num_draft=2-bogus=1_T0_s0", "unknown --set key 'bogus'"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval", "no-such-task"]\n[[drafters]]\ndrafter = "ngram"\n',
     ["cell tiny-llama_no-such-task_ngram_T0_s0", "no-such-task"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\n[[drafters]]\ndrafter = "ngram"\nset = {num_draft = [2, 3]}\nlabel = "same"\n',
     ["both write", "distinct labels"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\n[[drafters]]\ndrafter = "ngram"\ntasks = ["gsm8k"]\n',
     ["names task 'gsm8k'", "not in 'tasks'"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\n[[drafters]]\ndrafter = "ngram"\nlabel = "{depth}"\n', ["{depth}"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\nexecutor = "slurm"\n[[drafters]]\ndrafter = "ngram"\n', ["unknown executor 'slurm'"]),
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\ndevice = "gpu0"\n[[drafters]]\ndrafter = "ngram"\n',
     ["cell tiny-llama_humaneval_ngram_T0_s0", "invalid --device 'gpu0'"]),  # was: every cell run and failed
    ('targets = ["tiny-llama"]\ntasks = ["humaneval"]\ndtype = "half"\n[[drafters]]\ndrafter = "ngram"\n',
     ["invalid --dtype 'half'"]),
    ('targets = ["tiny-llama"\n', ["not valid TOML"]),
    ('tasks = ["humaneval"]\n[[drafters]]\ndrafter = "ngram"\n', ["missing 'targets'"]),
])
def test_bad_sweep_files_get_one_line(tmp_path, body, words):
    path = write(tmp_path, body)
    for args in (["--dry-run"], []):
        line = one_error_line(invoke("sweep", path, *args))
        for word in (str(path), *words):
            assert word in line, f"{word!r} not in {line!r}"
    assert not (tmp_path / "results").exists()


def test_local_sweep_shares_baseline_survives_a_failing_cell_resumes_and_skips(tmp_path, prompts, monkeypatch):
    res = tmp_path / "res"
    body = f"""
results_dir = "{res}"
targets = ["tiny-llama"]
tasks = [{{file = "{prompts}", label = "two"}}]
max_new_tokens = 6
warmup = false
file = "{{label}}"
[[drafters]]
drafter = "ngram"
set = {{num_draft = [2, 3]}}
label = "ng{{num_draft}}"
"""
    path = write(tmp_path, body)
    calls: list[tuple[str, str]] = []
    original = runner._Session.run_prompt

    def flaky(self, prompt):  # the first cell breaks on its second prompt, after the first is saved
        calls.append((self.meta["run_id"], prompt.id))
        if self.meta["run_id"] == "ng2" and prompt.id == "p2":
            raise RuntimeError("GPU on fire")
        return original(self, prompt)

    monkeypatch.setattr(runner._Session, "run_prompt", flaky)
    result = invoke("sweep", path)
    assert result.exit_code == 1, result.output
    failed = [ln for ln in result.stderr.splitlines() if ln.startswith("failed cell")]
    assert failed == ["failed cell ng2: RuntimeError: GPU on fire (at test_sweep.py:" + failed[0].split(":")[-1]]
    assert "1 cells run, 0 already finished, 1 failed, of 2" in result.stdout
    # the second cell ran anyway, with its own AR baseline (the first cell's never finished)
    assert (res / "ng3.parquet").exists() and not (res / "ng2.parquet").exists()
    assert (res / "ng2.parquet.partial.jsonl").exists()
    assert sweep.cell_state(sweep.load_sweep(path).cells[0]) == ("resume", "")

    calls.clear()
    monkeypatch.setattr(runner._Session, "run_prompt", original)
    monkeypatch.setattr(runner._Session, "run_prompt", lambda self, p: calls.append((self.meta["run_id"], p.id)) or original(self, p))
    stamp = (res / "ng3.parquet").stat().st_mtime_ns
    result = invoke("sweep", path)
    assert result.exit_code == 0, result.output
    assert "1 cells run, 1 already finished, 0 failed, of 2" in result.stdout
    # resumed: only ng2's second prompt ran again, paired with the baseline ng3 finished meanwhile;
    # ng3 was skipped untouched
    assert calls == [("ng2", "p2")]
    assert (res / "ng3.parquet").stat().st_mtime_ns == stamp
    got = outputs(res)
    assert set(got) == {"ng2.parquet", "ng3.parquet", "ng3.ar-baseline.parquet"}
    assert got["ng2.parquet"] == got["ng3.ar-baseline.parquet"] == got["ng3.parquet"]  # greedy: lossless
    assert set(got["ng2.parquet"]) == {("p1", 0), ("p2", 0)}

    # a third run does nothing; a changed setting makes the finished files stale, named per cell
    calls.clear()
    assert invoke("sweep", path).exit_code == 0 and calls == []
    path.write_text(body.replace("max_new_tokens = 6", "max_new_tokens = 9"))
    rows = sweep.describe(sweep.load_sweep(path))
    assert all("max_new_tokens=6, the sweep asks max_new_tokens=9" in r["state"] for r in rows), rows
    result = invoke("sweep", path)
    assert result.exit_code == 1 and calls == []
    assert "failed cell ng2: " in result.stderr and "delete the file" in result.stderr


def test_baseline_is_shared_within_a_group(tmp_path, prompts):
    res = tmp_path / "res"
    path = write(tmp_path, f"""
results_dir = "{res}"
targets = ["tiny-qwen3"]
tasks = [{{file = "{prompts}", label = "two", limit = 1}}]
max_new_tokens = 5
warmup = false
[[drafters]]
drafter = "ngram"
set = {{num_draft = [2, 4]}}
""")
    plan = sweep.load_sweep(path)
    results = sweep.run_local(plan)
    assert [r.status for r in results] == ["done", "done"], [r.error for r in results]
    assert results[0].baseline == "ran"
    assert results[1].baseline == f"reused {plan.cells[0].name}.ar-baseline"
    assert len(list(res.glob("*.ar-baseline.parquet"))) == 1


FOUR = """
results_dir = "{res}"
targets = ["tiny-llama", "tiny-qwen3"]
tasks = [{{file = "{tasks}", label = "two"}}]
max_new_tokens = 5
warmup = false
resources = {{cpus = 1}}
[[drafters]]
drafter = "ngram"
set = {{num_draft = [2, 3]}}
"""


def test_ray_executor_matches_local(tmp_path, prompts):
    pytest.importorskip("ray", reason="ray cannot be imported; pip install 'specbench[ray]'")
    local = sweep.load_sweep(write(tmp_path, FOUR.format(res=tmp_path / "local", tasks=prompts), "local.toml"))
    remote = sweep.load_sweep(write(tmp_path, FOUR.format(res=tmp_path / "ray", tasks=prompts), "ray.toml"), "ray")
    assert len(local.cells) == len(remote.cells) == 4
    assert [r.status for r in sweep.run_local(local)] == ["done"] * 4
    start = time.perf_counter()
    results = sweep.run_ray(remote, num_cpus=2)
    print(f"ray sweep of 4 cells: {time.perf_counter() - start:.1f} s")
    assert [r.status for r in results] == ["done"] * 4, [r.error for r in results]
    assert [r.cell for r in results] == list(remote.cells)
    # the second cell of each target waited for the first and reused its baseline
    assert [r.baseline.split(" ")[0] for r in results] == ["ran", "reused", "ran", "reused"]
    got_local, got_ray = outputs(tmp_path / "local"), outputs(tmp_path / "ray")
    assert len(got_local) == 6 and got_local == got_ray  # 4 cells + 2 baselines, token for token
    threads = pd.read_parquet(next((tmp_path / "ray").glob("*.parquet")))["threads"]
    assert set(threads) == {1}  # the worker used the CPUs the file asked for


@pytest.mark.parametrize("name, n_cells", [("block_bench", 50), ("eagle3", 12), ("eagle3_curve", 5), ("default_target", 5),
                                           ("projected", 7), ("specblock", 35), ("specblock_speed", 35),
                                           ("eagle3_answers", 5), ("block_r200k", 64), ("block_g1", 64), ("tau_curve", 23),
                                           ("eagle3_vocab", 6), ("eagle3_r400k", 5), ("eagle3_r800k", 5), ("eagle3_r1600k", 5),
                                           ("eagle3_r1600k_e3", 5), ("treeflash_stage2", 6), ("block_vocab", 24), ("treeflash_vocab", 8),
                                           ("jetspec_vocab", 24), ("dflash_epochs", 16), ("treeflash_epochs", 8),
                                           ("jetspec_epochs", 16), ("dflash_e7", 8), ("treeflash_e7", 8),
                                           ("jetspec_e7", 16), ("block_e7", 64), ("dflash_e10", 8),
                                           ("jetspec_r1600k", 16), ("speed_best", 12)])
def test_shipped_sweep_files_load(name, n_cells):
    """The sweep files behind the README's tables stay valid (drafters, options, tasks, file names)."""
    plan = sweep.load_sweep(Path(__file__).parent.parent / "sweeps" / f"{name}.toml")
    assert len(plan.cells) == n_cells
    if name == "block_bench":  # the file names reports/block_bench.md was made from
        assert {c.name for c in plan.cells} >= {"ngram-humaneval", "jetspec-kbest-16-mt-bench", "dflash-marginal-128-math500"}
        assert not any(c.name == "jetspec-32-gsm8k" for c in plan.cells)


@pytest.mark.parametrize("key", ["r200k", "g1", "e7"])
def test_claims_table_is_what_the_block_data_gives(monkeypatch, key):
    """The block claims tables (gamma-7 heads: r200k; gamma-1 heads: g1; 7-epoch 8k heads: e7) are written by
    `python sweeps/block_r200k.py KEY` from the committed result files, never by hand, into the file that holds their
    markers: rebuilt from the sweep's results each must equal that file's, and the writer replaces a stale one."""
    import importlib.util

    root = Path(__file__).parent.parent
    spec = importlib.util.spec_from_file_location("block_r200k_script", root / "sweeps" / "block_r200k.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    table_def = script.TABLES[key]
    assert table_def.sweep == root / "sweeps" / f"block_{key}.toml"
    monkeypatch.chdir(root)  # the sweep's results_dir is relative to the repository
    plan = sweep.load_sweep(table_def.sweep)
    tasks, cells = script.summaries(plan)
    committed = [f for f in plan.results_dir.glob("*.parquet") if not f.name.endswith(".ar-baseline.parquet")]
    assert committed and len(cells) == len(committed)  # every committed cell file is in the table
    assert tasks == ["humaneval", "math500", "gsm8k", "mt-bench"]
    if key == "r200k":
        assert len(cells) == 64
    table = script.readme_table(tasks, cells)
    begin, end = table_def.begin, table_def.end
    doc = script.doc_with(begin)  # issue 10 asks for the retrained heads' claims in the README; the gamma-1 ones are in the block notes
    assert doc == (Path("reports/block-drafters.md") if key == "g1" else Path("README.md"))
    readme = doc.read_text()
    assert f"`python sweeps/block_r200k.py{'' if key == 'r200k' else ' ' + key}`" in begin  # the marker names its command
    assert script.readme_with_table(readme, table, begin, end) == readme
    stale = script.readme_with_table(readme, ["| claim (rule) | verdict | numbers |", "|---|---|---|"], begin, end)
    assert stale != readme and script.readme_with_table(stale, table, begin, end) == readme


def test_table_writers_find_the_one_file_that_holds_the_markers(tmp_path, monkeypatch):
    """A generated table lives in the README or in one note under reports/: the writer replaces the lines between
    the markers wherever they are, leaves every other file alone, refuses a marker held by two files and writes
    nothing when no file holds it (run from outside the repository)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("block_r200k_docs", Path(__file__).parent.parent / "sweeps" / "block_r200k.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.chdir(tmp_path)
    begin, end = "<!-- t: written by x -->", "<!-- end of t -->"
    assert script.write_table(["| a |"], begin, end) is None  # no README, no notes
    (tmp_path / "reports").mkdir()
    (tmp_path / "README.md").write_text("intro\n")
    note = tmp_path / "reports" / "notes.md"
    note.write_text(f"# notes\n{begin}\n| old |\n{end}\nafter\n")
    assert script.write_table(["| new |", "|---|"], begin, end) == Path("reports/notes.md")
    assert note.read_text() == f"# notes\n{begin}\n| new |\n|---|\n{end}\nafter\n"
    assert (tmp_path / "README.md").read_text() == "intro\n"
    (tmp_path / "README.md").write_text(f"{begin}\n{end}\n")
    with pytest.raises(SystemExit, match="is in 2 files"):
        script.write_table(["| x |"], begin, end)


def test_block_claims_script_names_its_tables_and_refuses_an_unknown_one(capsys):
    """`python sweeps/block_r200k.py NAME`: --list names every table with its sweep file; a wrong name or two names
    is one line on stderr and exit status 2, and writes nothing."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("block_r200k_cli", Path(__file__).parent.parent / "sweeps" / "block_r200k.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.cli(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in listed] == ["r200k", "g1", "e7"]
    assert all(f"(block_{k}.toml)" in line for k, line in zip(script.TABLES, listed))
    for argv in (["e8"], ["g1", "e7"]):
        assert script.cli(argv) == 2
        out = capsys.readouterr()
        assert out.out == "" and len(out.err.strip().splitlines()) == 1 and "r200k, g1, e7" in out.err



def _pairs_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pairs_script", Path(__file__).parent.parent / "sweeps" / "pairs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


PAIRS = ["block_vocab", "treeflash_vocab", "jetspec_vocab", "dflash_epochs", "treeflash_epochs", "jetspec_epochs",
         "dflash_e7", "treeflash_e7", "jetspec_e7", "dflash_e10", "jetspec_r1600k"]


def test_every_pair_has_its_sweep_file_and_names_its_own_markers():
    """sweeps/pairs.py holds one Comparison per two-head sweep file; each pair's report, figure and README markers
    follow from its name, so no two pairs write the same table."""
    script = _pairs_script()
    assert list(script.COMPARISONS) == PAIRS
    for name, comp in script.COMPARISONS.items():
        assert comp.sweep.exists() and comp.sweep.stem == name
        assert comp.out == Path(f"reports/{name}.md") and comp.figure.name == name.replace("_", "-") + ".png"
        assert f"python sweeps/pairs.py {name}`" in comp.begin and comp.end.endswith(f"{name} table -->")
        labels = {c.label for c in sweep.load_sweep(comp.sweep).cells}
        assert labels == {f"{p}-{k}" for p, _, _ in comp.heads for k, _ in comp.settings}  # every cell is in a row


def test_pairs_script_names_a_wrong_pair_in_one_line(capsys):
    script = _pairs_script()
    assert script.cli(["dflash_e9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no pair named 'dflash_e9'" in err and "dflash_e7" in err
    assert script.cli([]) == 2 and "error: name a pair" in capsys.readouterr().err
    assert script.cli(["--list"]) == 0
    assert "treeflash_epochs: a better-trained backbone" in capsys.readouterr().out


@pytest.mark.parametrize("name", PAIRS)
def test_pair_table_is_what_the_sweep_data_gives(monkeypatch, name):
    """The block notes' two-head tables (full against 8k vocabulary, DFlash: block_vocab; TreeFlash:
    treeflash_vocab; JetSpec: jetspec_vocab; 3 against 5 epochs: dflash_epochs, jetspec_epochs, and
    treeflash_epochs on the backbone; 5 against 7: dflash_e7, treeflash_e7, jetspec_e7; 7 against 10: dflash_e10) are written by
    `python sweeps/pairs.py <name>` from the committed result files and the two heads' cards, never by hand,
    and every committed cell is in them."""
    root = Path(__file__).parent.parent
    lib = _pairs_script()
    comp = lib.COMPARISONS[name]
    monkeypatch.chdir(root)
    plan = sweep.load_sweep(comp.sweep)
    assert plan.results_dir.name == name.replace("_", "-")
    tasks, cells = lib.summaries(plan)
    committed = [f for f in plan.results_dir.glob("*.parquet") if not f.name.endswith(".ar-baseline.parquet")]
    assert len(cells) == len(committed)
    cards = {prefix: lib.card(folder) for prefix, _, folder in comp.heads}
    table = lib.readme_table(tasks, cells, cards, comp)
    names = tuple(f"| {n} |" for _, n in comp.settings)
    assert sum(line.startswith(names) for line in table) == len({(label.split("-", 1)[1], t) for label, t in cells})
    doc = lib.base.doc_with(comp.begin)
    assert doc == Path("reports/block-drafters.md")  # every two-head table is in the block notes
    readme = doc.read_text()
    assert lib.readme_with_table(readme, table, comp.begin, comp.end) == readme
    stale = lib.readme_with_table(readme, ["| head |", "|---|"], comp.begin, comp.end)
    assert stale != readme and lib.readme_with_table(stale, table, comp.begin, comp.end) == readme


def test_vocabulary_table_pairs_the_heads_cell_by_cell():
    """Each row holds both heads' numbers for one setting and task; a losing head is visible (NO), a
    missing one is "-", and the summary's ratios are 8k over full over the cells both heads ran."""
    script = _pairs_script()
    dflash = script.COMPARISONS["block_vocab"]
    cell = lambda tau, ms, ok=True: {"tau_micro": tau, "draft_ms": ms, "decode_speedup_sum": 0.5, "lossless": ok}  # noqa: E731
    s = {("full-marginal-16", "humaneval"): cell(1.8, 100.0), ("v8k-marginal-16", "humaneval"): cell(1.7, 60.0),
         ("full-chain-16", "humaneval"): cell(1.6, 90.0, ok=False)}
    rows = script.cells_table(["humaneval", "math500"], s, dflash)
    assert len(rows) == 4  # header, rule, two settings with a cell; math500 has none
    assert "| 1.80 / 1.70 | 100.0 / 60.0 |" in rows[2] and rows[2].endswith("| yes |")
    assert "| 1.60 / - |" in rows[3] and rows[3].endswith("| **NO** |")
    line = script.summary_line(["humaneval", "math500"], s, dflash)
    assert "the 1 cell both" in line and "0.944x" in line and "0.60x" in line
    assert "tau, full / 8k |" in rows[0] and "the 8k head's tau" in line
    # another pair names its heads in the header and the summary line (a Comparison's `short`)
    renamed = dflash._replace(short=("49k", "4k"))
    assert "tau, 49k / 4k |" in script.cells_table(["humaneval"], s, renamed)[0]
    assert "the 4k head's tau is 0.944x the 49k head's" in script.summary_line(["humaneval"], s, renamed)
    assert "paired bootstrap" not in line  # no result rows in these cells: no interval
    # with each cell's rows, the line adds the paired interval of the tau ratio over the prompts
    make = lambda acc: pd.DataFrame([synthetic_row(f"p{i}", 0, [acc + i % 2] * 4) for i in range(6)])  # noqa: E731
    s[("full-marginal-16", "humaneval")]["rows"] = make(1)
    s[("v8k-marginal-16", "humaneval")]["rows"] = make(2)
    _, lo, hi = report.tau_ratio_interval([(make(1), make(2))])
    assert f"95% paired bootstrap interval over prompts {lo:.3f} to {hi:.3f})" in script.summary_line(["humaneval"], s, dflash)


def test_block_claims_are_decided_by_a_failure_before_every_cell_is_in():
    """A claim over every task is not reproduced once one measured task fails it, missing cells or not;
    with nothing failed and a cell missing it is "not measured yet"; a target with its one cell reads
    reached / not reached."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("block_r200k_rules", Path(__file__).parent.parent / "sweeps" / "block_r200k.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tasks = ["humaneval", "math500"]
    cell = lambda tau: {"tau_micro": tau}  # noqa: E731
    s = {("jetspec-16", "humaneval"): cell(1.7), ("jetspec-kbest-16", "humaneval"): cell(1.8),
         ("jetspec-chain-16", "humaneval"): cell(1.4), ("treeflash-16", "humaneval"): cell(2.0),
         ("dflash-marginal-16", "humaneval"): cell(1.9), ("eagle3-16", "humaneval"): cell(1.8)}
    table = script.readme_table(tasks, s)
    jet, tree, dflash, j64 = table[2:]
    assert "**not reproduced** (fails on 1 of 2 tasks; 1 not measured yet)" in jet
    assert "not measured yet (7 of 8 cells missing)" in tree  # 2.0 > 1.9 holds; the rest is missing
    assert "**reached**" in dflash and "1.90 vs 1.80" in dflash
    assert "not measured yet" in j64
    lines = script.claim_lines(tasks, s)
    assert "**not reproduced** (fails on humaneval; math500 not measured yet)" in lines[0]
    assert "not measured yet (humaneval, math500 missing)" in lines[1]
    assert "paired interval" not in dflash  # no result rows in these cells
    # with the two cells' rows, the target's numbers carry the paired interval of DFlash's tau over EAGLE-3's
    make = lambda acc: pd.DataFrame([synthetic_row(f"p{i}", 0, [acc + i % 2] * 4) for i in range(6)])  # noqa: E731
    s[("eagle3-16", "humaneval")]["rows"], s[("dflash-marginal-16", "humaneval")]["rows"] = make(2), make(1)
    ratio, lo, hi = report.tau_ratio_interval([(make(2), make(1))])
    assert f"(ratio {ratio:.3f}, 95% paired interval over prompts {lo:.3f} to {hi:.3f})" in script.readme_table(tasks, s)[4]

def test_sweep_names_cells_timed_on_a_shared_cpu(tmp_path, prompts, monkeypatch):
    from specbench import results

    monkeypatch.setattr(results, "load_average", lambda: 9.0)  # as if a training run shared the cores
    res = tmp_path / "res"
    path = write(tmp_path, f"""
results_dir = "{res}"
targets = ["tiny-llama"]
tasks = [{{file = "{prompts}", label = "two", limit = 1}}]
max_new_tokens = 4
warmup = false
[[drafters]]
drafter = "ngram"
""")
    result = invoke("sweep", path)
    assert result.exit_code == 0, result.output
    assert "2 of 2 runs were timed while other processes shared the CPU" in result.stderr, result.stderr
    monkeypatch.setattr(results, "load_average", lambda: 0.2)
    for f in res.glob("*.parquet"):  # run again on an idle machine
        f.unlink()
    result = invoke("sweep", path)
    assert result.exit_code == 0 and "shared the CPU" not in result.stderr, result.stderr


def test_speed_best_table_is_what_its_sweep_data_gives(monkeypatch):
    """The EAGLE-3 notes' table of the three target-meeting heads timed in one run (sweeps/speed_best.toml) holds, for each
    head, the decode speedup per task and their mean, the draft share and the projected mean that `specbench compare`
    gives from the committed files; every one of its cells is lossless."""
    from specbench import results
    from specbench.hardware.project import add_projections

    root = Path(__file__).parent.parent
    monkeypatch.chdir(root)
    plan = sweep.load_sweep(root / "sweeps" / "speed_best.toml")
    df = results.read_results(sorted(plan.results_dir.glob("*.parquet")))
    frame = add_projections(df, report.compare(df), ["h100-sxm:engine"], "qwen3-8b")
    frame = frame[frame["drafter"] != report.BASELINE_DRAFTER]
    assert len(frame) == len(plan.cells) == 12 and frame["lossless"].all()
    readme = (root / "reports" / "eagle3.md").read_text()  # the EAGLE-3 notes
    start = readme.index("| head | humaneval | math500 | gsm8k | mt-bench | mean | draft share of decode |")
    rows = readme[start:].split("\n\n", 1)[0].splitlines()[2:]
    heads = {"EAGLE-3, 200k tokens": "eagle3-smollm2-135m-r200k", "EAGLE-3, 1.6M tokens, 3 epochs":
             "eagle3-smollm2-135m-r1600k-bf16", "DFlash gamma 1, 8k ids, 10 epochs": "dflash-smollm2-135m-r200k-g1-e10-v8k"}
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == list(heads)
    for row in rows:
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        got = frame[frame["setting"].str.contains(f"path={heads[cells[0]]},")].set_index("task")
        speedups = [got.loc[t, "decode_speedup_sum"] for t in ("humaneval", "math500", "gsm8k", "mt-bench")]
        assert cells[1:6] == [f"{x:.2f}x" for x in speedups + [sum(speedups) / 4]]
        assert cells[6] == f"{100 * got['draft_share'].mean():.0f}%"
        assert cells[7] == f"{got['projected_decode_speedup_sum'].mean():.2f}x"


def _glance_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("glance_script", Path(__file__).parent.parent / "sweeps" / "glance.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_readme_at_a_glance_table_is_what_the_sweep_data_gives(monkeypatch):
    """The README's at-a-glance table is written by `python sweeps/glance.py` from the committed result files of the
    sweep each row names, never by hand: rebuilt from the data it must equal the README's; every row with an AR
    baseline is lossless; the writer replaces a stale table; and a row whose files are missing is a one-line error."""
    root = Path(__file__).parent.parent
    script = _glance_script()
    monkeypatch.chdir(root)
    measured = [(row, script.measure(row)) for row in script.ROWS]
    # every row's outputs equal AR's: its own sweep's baselines, or (the two tau-only EAGLE-3 sweeps) the block sweep's
    assert [row.name for row, m in measured if m["lossless"] is not True] == []
    table = script.table(measured)
    assert len(table) == 2 + len(script.ROWS)
    assert script.base.doc_with(script.BEGIN) == script.base.doc_with(script.TARGETS_BEGIN) == Path("README.md")
    readme = (root / "README.md").read_text()
    assert script.readme_with_table(readme, table) == readme
    stale = script.readme_with_table(readme, ["| drafter (head) |", "|---|"])
    assert stale != readme and script.readme_with_table(stale, table) == readme
    goals = script.targets_table()  # issue 10's five targets, each with its verdict
    assert len(goals) == 2 + len(script.TARGETS) and all(row.endswith(("reached** |", "(at equality) |")) for row in goals[2:])
    assert script.readme_with_table(readme, goals, script.TARGETS_BEGIN, script.TARGETS_END) == readme
    with pytest.raises(SystemExit, match="has no cell 'nope-16'"):
        script.measure(script.Row("x", "dflash", "dflash_e10", "nope-16"))


def test_at_a_glance_bolds_each_columns_best():
    """Bold marks the highest tau of each task, the highest CPU mean and gsm8k speedup and the highest projection;
    a row without a baseline shows "-" for the CPU column."""
    script = _glance_script()
    tasks = script.TASKS

    def m(tau, cpu, proj):
        return {"tau": dict.fromkeys(tasks, tau), "cpu": dict.fromkeys(tasks, cpu), "projected": dict.fromkeys(tasks, proj)}

    a, b = script.Row("A", "eagle3", "s", "a"), script.Row("B", "dflash", "s", "b")
    rows = script.table([(a, m(2.0, 0.9, 1.5)), (b, m(1.5, None, 1.6))])
    assert rows[2] == "| A | **2.00** / **2.00** / **2.00** / **2.00** | **0.90x** (**0.90x**) | 1.50x | `s` |"
    assert rows[3] == "| B | 1.50 / 1.50 / 1.50 / 1.50 | - | **1.60x** | `s` |"


def test_issue_targets_are_decided_by_their_rule(monkeypatch):
    """A target is reached when its best head is at or over the bar (a threshold, or the reference head less the
    margin), "at equality" when exactly on it; a head whose file is not there yet does not count, nor does a replayed
    snapshot shown beside them (even one over the bar)."""
    script = _glance_script()
    a, b, ref, pending = (("s", name, "humaneval") for name in ("a", "b", "ref", "pending"))  # taus: (sweep, label, task)
    snap = ("replay", "x.json", "humaneval", "64")
    values = {a: 2.4, b: 2.6, ref: 2.6, pending: None, snap: 2.7}
    monkeypatch.setattr(script, "target_value", lambda source: values[source])
    cases = [(script.Target("t", ">= 2.5", (("A", a), ("B", b)), threshold=2.5), "| 2.60 (B) | **reached** |"),
             (script.Target("t", ">= 2.5", (("A", a), ("P", pending)), threshold=2.5), "**not reached** |"),
             (script.Target("t", "= ref", (("B", b),), reference=("R", ref)), "**reached** (at equality) |"),
             (script.Target("t", "ref - 0.3", (("A", a),), reference=("R", ref), margin=0.3), "**reached** |"),
             (script.Target("t", "ref - 0.1", (("A", a),), reference=("R", ref), margin=0.1), "**not reached** |"),
             (script.Target("t", ">= 2.5", (("A", a),), threshold=2.5, uncounted=(("S", snap, "lost"),)),
              "| 2.40 (A) | **not reached** |")]
    for target, ending in cases:
        monkeypatch.setattr(script, "TARGETS", (target,))
        row = script.targets_table()[2]
        assert row.endswith(ending), (row, ending)
        assert ("P: not measured yet" in row) == (target.heads[-1][0] == "P")
        assert ("S: 2.70 (lost; not counted)" in row) == bool(target.uncounted)


def test_a_target_reads_a_replayed_snapshot_from_its_committed_table(tmp_path):
    """A replay source is the tau of one task in the row of one budget of a replay .json; no such row is an error."""
    script = _glance_script()
    table = tmp_path / "replay.json"
    table.write_text(json.dumps({"rows": [{"budget": "16", "tau_math500": 1.9}, {"budget": "64", "tau_math500": 2.125}]}))
    assert script.target_value(("replay", str(table), "math500", "64")) == 2.125
    with pytest.raises(SystemExit, match="no single row at budget 32"):
        script.target_value(("replay", str(table), "math500", "32"))


def test_glance_script_takes_no_arguments(capsys):
    script = _glance_script()
    assert script.main(["--help"]) == 0 and "usage: python sweeps/glance.py" in capsys.readouterr().out
    assert script.main(["--rows", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes no arguments" in err
