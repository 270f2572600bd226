"""The `specbench` command end to end, through typer's CliRunner, on the tiny random-init target.

Every run goes to tmp_path (``--results-dir`` and ``--out``) on ``--target tiny-llama`` (built in
code, never downloaded), with a couple of prompts, few new tokens and ``--no-warmup``.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from specbench import cli
from specbench.report import compare_columns
from specbench.targets import tiny_tokenizer

TARGET = "tiny-llama"
MAX_NEW = 16


def invoke(*args: str):
    return CliRunner().invoke(cli.app, [str(a) for a in args])


def run_args(results_dir: Path, *extra: str) -> list[str]:
    return ["run", "--target", TARGET, "--no-warmup", "--results-dir", str(results_dir), *extra]


def assert_user_error(result, *words: str) -> str:
    """Exit status 2, one `error:` line naming the problem, no traceback, nothing on stdout."""
    assert isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr
    line = errors[0]
    assert line.startswith("error: "), line
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    assert result.stdout == ""
    return line


def files_under(folder: Path) -> dict[str, bytes]:
    """Relative path -> content of every file below ``folder`` (empty when it does not exist)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True, scope="module")
def _wide_console(wide_console):
    yield


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory, _wide_console):
    """ngram on 2 two-turn MT-Bench prompts, with its AR baseline run alongside."""
    root = tmp_path_factory.mktemp("mt")
    res = root / "res"
    out = res / "first.parquet"
    result = invoke(*run_args(res, "--drafter", "ngram", "--task", "mt-bench", "--limit", "2",
                              "--max-new-tokens", str(MAX_NEW), "--out", str(out)))
    assert result.exit_code == 0, result.output
    return {"root": root, "res": res, "out": out, "base": res / "first.ar-baseline.parquet", "result": result}


def _lossless_cell(stdout: str) -> str:
    """The value cell of the summary table's "lossless" row."""
    rows = [line for line in stdout.splitlines() if line.startswith("│") and "lossless" in line.split("│")[1]]
    assert rows, stdout
    cells = [c.strip() for c in rows[-1].split("│") if c.strip()]
    return cells[1]


# ------------------------------------------------------------------------------------------ run


def test_run_writes_drafter_and_baseline_files(mt_run):
    out, base = mt_run["out"], mt_run["base"]
    assert out.is_file() and base.is_file()
    assert sorted(p.name for p in mt_run["res"].glob("first*")) == ["first.ar-baseline.parquet", "first.parquet"]
    assert not list(mt_run["res"].glob("*.partial.jsonl")) and not list(mt_run["res"].glob(".*"))
    for path, drafter in ((out, "ngram"), (base, "ar")):
        schema = pq.read_schema(path)
        for column in ("prompt_ids", "output_ids", "accepted_per_step"):
            assert schema.field(column).type == pa.list_(pa.int64())
        df = pd.read_parquet(path)
        assert len(df) == 4  # 2 prompts x 2 turns
        assert not df.duplicated(["prompt_id", "turn"]).any()
        assert sorted(df["turn"].unique().tolist()) == [0, 1]
        assert (df.groupby("prompt_id")["turn"].count() == 2).all()
        assert set(df["drafter"]) == {drafter}
        assert set(df["target"]) == {TARGET} and set(df["task"]) == {"mt-bench"}
        for row in df.itertuples():
            assert np.asarray(row.prompt_ids).dtype.kind == "i" and np.asarray(row.output_ids).dtype.kind == "i"
            prompt_ids, output_ids = [int(t) for t in row.prompt_ids], [int(t) for t in row.output_ids]
            assert prompt_ids and all(0 <= t < 384 for t in prompt_ids + output_ids)
            assert row.n_new_tokens == len(output_ids)
            assert 1 <= row.n_new_tokens <= MAX_NEW
            accepted = list(row.accepted_per_step)
            assert row.n_steps == len(accepted) >= 1
            assert sum(a + 1 for a in accepted) >= row.n_new_tokens
            if drafter == "ar":
                assert accepted == [0] * row.n_steps


def test_run_second_turn_sees_first_answer(mt_run):
    tok = tiny_tokenizer()
    df = pd.read_parquet(mt_run["out"])
    answers = []
    for _, rows in df.groupby("prompt_id"):
        first = rows[rows["turn"] == 0].iloc[0]
        second = rows[rows["turn"] == 1].iloc[0]
        ids0, ids1 = list(first["prompt_ids"]), list(second["prompt_ids"])
        # ChatML re-renders the whole history: turn 0's prompt is an exact prefix of turn 1's
        assert len(ids1) > len(ids0)
        assert ids1[: len(ids0)] == ids0
        answer = tok.decode(list(first["output_ids"]), skip_special_tokens=True)
        history = tok.decode(ids1[len(ids0):], skip_special_tokens=False)
        assert history.startswith(answer), (answer, history)
        assert "<|im_start|>user\n" in history
        answers.append(answer)
    assert any(answers)  # some decoded text really was carried into turn 2


def test_run_greedy_drafter_is_lossless(mt_run):
    df = pd.read_parquet(mt_run["out"])
    base = pd.read_parquet(mt_run["base"])
    merged = df.merge(base, on=["prompt_id", "turn"], suffixes=("", "_base"))
    assert len(merged) == len(df) == len(base)
    for row in merged.itertuples():
        assert list(row.prompt_ids) == list(row.prompt_ids_base)
        assert list(row.output_ids) == list(row.output_ids_base)
    stdout = mt_run["result"].stdout
    assert "lossless" in stdout
    assert _lossless_cell(stdout) == "yes"
    assert f"results: {mt_run['out']}" in stdout.replace("\n", "")
    assert "AR baseline:" in stdout and "first.ar-baseline.parquet" in stdout


def test_run_reuses_baseline_from_results_folder(mt_run):
    res = mt_run["res"]
    before = files_under(res)
    out = res / "second.parquet"
    result = invoke(*run_args(res, "--drafter", "ngram", "--task", "mt-bench", "--limit", "2",
                              "--max-new-tokens", str(MAX_NEW), "--out", str(out)))
    assert result.exit_code == 0, result.output
    assert "reused" in result.stdout
    assert "first.ar-baseline" in result.stdout
    assert _lossless_cell(result.stdout) == "yes"
    assert out.is_file()
    assert not (res / "second.ar-baseline.parquet").exists()
    after = files_under(res)
    assert set(after) == set(before) | {"second.parquet"}
    assert all(after[name] == data for name, data in before.items())  # nothing else touched
    first, second = pd.read_parquet(mt_run["out"]), pd.read_parquet(out)
    key = ["prompt_id", "turn"]
    first, second = first.sort_values(key).reset_index(drop=True), second.sort_values(key).reset_index(drop=True)
    assert [list(x) for x in first["output_ids"]] == [list(x) for x in second["output_ids"]]


def test_run_self_drafting_accepts_and_stays_lossless(mt_run, tmp_path):
    """draft-model drafting with the target itself: drafts get accepted, outputs still match AR."""
    res = tmp_path / "res"
    res.mkdir()
    shutil.copy(mt_run["base"], res / "first.ar-baseline.parquet")  # --limit 1 picks a subset of it
    out = res / "self.parquet"
    result = invoke(*run_args(res, "--drafter", "draft-model", "--set", f"model={TARGET}", "--set", "num_draft=3", "--set", "threshold=0",
                              "--task", "mt-bench", "--limit", "1", "--max-new-tokens", str(MAX_NEW),
                              "--out", str(out)))
    assert result.exit_code == 0, result.output
    assert "reused" in result.stdout
    assert _lossless_cell(result.stdout) == "yes"
    df = pd.read_parquet(out)
    base = pd.read_parquet(mt_run["base"]).merge(df[["prompt_id", "turn"]], on=["prompt_id", "turn"])
    assert len(df) == len(base) == 2
    df, base = df.sort_values("turn"), base.sort_values("turn")
    for row, brow in zip(df.itertuples(), base.itertuples()):
        assert list(row.output_ids) == list(brow.output_ids)
        accepted = [int(a) for a in row.accepted_per_step]
        assert row.n_steps == len(accepted) < row.n_new_tokens == len(row.output_ids)
        assert max(accepted) == 3 and all(0 <= a <= 3 for a in accepted)
        assert sum(a + 1 for a in accepted) >= row.n_new_tokens


def test_run_no_baseline(tmp_path):
    task = tmp_path / "one.jsonl"
    task.write_text('{"id": "q", "prompt": "Count: 1 2 3 4"}\n')
    res = tmp_path / "res"
    out = res / "solo.parquet"
    result = invoke(*run_args(res, "--task-file", str(task), "--max-new-tokens", "4", "--no-baseline",
                              "--out", str(out)))
    assert result.exit_code == 0, result.output
    assert "AR baseline" not in result.output
    assert sorted(files_under(res)) == ["solo.parquet"]
    df = pd.read_parquet(out)
    assert df["prompt_id"].tolist() == ["q"] and df["task"].tolist() == ["file:one"]
    assert _lossless_cell(result.stdout) == "-"  # nothing to compare against


def test_run_refuses_existing_out_and_leaves_it_alone(mt_run):
    out = mt_run["out"]
    before = files_under(mt_run["res"])
    result = invoke(*run_args(mt_run["res"], "--drafter", "ngram", "--task", "mt-bench", "--limit", "2",
                              "--max-new-tokens", str(MAX_NEW), "--out", str(out)))
    assert_user_error(result, str(out), "exists", "--resume")
    assert files_under(mt_run["res"]) == before


# -------------------------------------------------------------------------------------- compare


def test_compare_json(mt_run):
    result = invoke("compare", str(mt_run["out"]), str(mt_run["base"]), "--format", "json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert isinstance(records, list) and len(records) == 2
    depths = len([k for k in records[0] if k.startswith("accept_d")])
    assert depths >= 1
    for rec in records:
        assert isinstance(rec, dict)
        assert list(rec) == compare_columns(depths, load=True)
        assert set(rec) >= {
            "target", "task", "drafter", "setting", "config", "n_prompts", "tau", "accept_d1", "draft_share",
            "decode_speedup_sum", "decode_speedup_mean", "e2e_speedup_sum", "e2e_speedup_mean", "lossless",
        }
        assert rec["target"] == TARGET and rec["task"] == "mt-bench" and rec["n_prompts"] == 2
    by = {rec["drafter"]: rec for rec in records}
    assert list(by) == ["ar", "ngram"]  # the baseline first
    assert by["ar"]["tau"] == 1.0
    assert by["ar"]["accept_d1"] == 0.0
    assert by["ar"]["lossless"] is True  # the baseline pairs with itself
    assert by["ngram"]["tau"] >= 1.0
    assert by["ngram"]["lossless"] is True
    for key in ("decode_speedup_sum", "decode_speedup_mean", "e2e_speedup_sum", "e2e_speedup_mean"):
        assert by["ngram"][key] > 0
    assert json.loads(by["ngram"]["config"])["num_draft"] == 7
    assert by["ngram"]["setting"] == "default" and by["ar"]["setting"] == "default"


def test_compare_glob_csv_markdown_table(mt_run):
    pattern = str(mt_run["res"] / "first*.parquet")
    result = invoke("compare", pattern, "--format", "csv")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(io.StringIO(result.stdout))
    columns = compare_columns(len([c for c in df.columns if c.startswith("accept_d")]), load=True)
    assert list(df.columns) == columns
    assert list(df["drafter"]) == ["ar", "ngram"]
    assert df.loc[df["drafter"] == "ar", "tau"].item() == 1.0

    result = invoke("compare", pattern, "--format", "markdown")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 4  # header, rule, 2 rows
    assert all(line.startswith("|") and line.endswith("|") for line in lines)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == columns
    assert set(lines[1].strip("|").split("|")) <= {"---:", ":---"}
    assert len(lines[1].strip("|").split("|")) == len(columns)
    assert "ngram" in result.stdout and "yes" in result.stdout and '"num_draft": 7' in result.stdout

    result = invoke("compare", str(mt_run["res"]))  # a folder means its *.parquet; table format
    assert result.exit_code == 0, result.output
    assert "ngram" in result.stdout and "ar" in result.stdout


@pytest.mark.parametrize("width", [80, 100])
def test_compare_table_fits_the_terminal(mt_run, monkeypatch, width):
    monkeypatch.setattr(cli.out_console, "_width", width)
    result = invoke("compare", str(mt_run["res"]))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in result.stdout and "{" not in result.stdout  # no cut cell, no config JSON
    header = next(line for line in lines if line.startswith("task"))
    assert header.split()[:3] == ["task", "drafter", "setting"]
    rows = [line.split() for line in lines if line.startswith("mt-bench ")]
    assert [r[1:3] for r in rows] == [["ar", "default"], ["ngram", "default"]]
    assert "tiny-llama" in lines[0]  # one target: named in the title


def test_compare_wide_columns_sort_depths(mt_run, monkeypatch):
    monkeypatch.setattr(cli.out_console, "_width", 80)
    res = str(mt_run["res"])
    wide = invoke("compare", res, "--wide")
    assert wide.exit_code == 0, wide.output
    assert '"num_draft": 7' in wide.stdout and "e2e" in wide.stdout and "…" not in wide.stdout
    assert max(len(line) for line in wide.stdout.splitlines()) > 80  # its natural width

    result = invoke("compare", res, "--columns", "drafter,tau,speedup", "--format", "csv", "--sort", "tau")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(io.StringIO(result.stdout))
    assert list(df.columns) == ["drafter", "tau", "decode_speedup_sum"]
    assert list(df["tau"]) == sorted(df["tau"], reverse=True)

    result = invoke("compare", res, "--columns", "drafter,tau", "--sort", "drafter")
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()[-2:]] == ["ar", "ngram"]

    result = invoke("compare", res, "--depths", "1", "--format", "json")
    assert [k for k in json.loads(result.stdout)[0] if k.startswith("accept_d")] == ["accept_d1"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--sort", "speed"], ["unknown column 'speed' for --sort", "valid columns:", "tau", "decode_speedup_sum"]),
        (["--columns", "task,bogus"], ["unknown column 'bogus' for --columns", "valid columns:", "setting"]),
        (["--depths", "0"], ["--depths 0"]),
    ],
)
def test_compare_bad_options_are_one_line(mt_run, args, words):
    assert_user_error(invoke("compare", str(mt_run["res"]), *args), *words)


def test_compare_lossless_across_machines(mt_run, tmp_path):
    """The AR baseline moved to another machine: speedups no longer pair, the greedy output check still can."""
    table = pq.read_table(mt_run["base"])
    column = table.schema.get_field_index("device_name")
    moved = table.set_column(column, table.schema.field(column), pa.array(["Other CPU"] * table.num_rows, table.schema.field(column).type))
    base = tmp_path / "elsewhere.ar-baseline.parquet"
    pq.write_table(moved, base)
    assert_user_error(invoke("compare", str(mt_run["out"]), str(base)), "mix hardware", "--allow-mixed")

    result = invoke("compare", str(mt_run["out"]), str(base), "--lossless-across-machines", "--format", "json")
    assert result.exit_code == 0, result.output
    ngram = next(row for row in json.loads(result.stdout) if row["drafter"] == "ngram")
    assert ngram["lossless"] is True and ngram["decode_speedup_sum"] is None
    assert "against AR outputs from another machine" in " ".join(result.stderr.split())

    mixed = invoke("compare", str(mt_run["out"]), str(base), "--allow-mixed", "--format", "json")
    assert next(row for row in json.loads(mixed.stdout) if row["drafter"] == "ngram")["lossless"] is None


def test_compare_glob_matching_nothing(tmp_path):
    result = invoke("compare", str(tmp_path / "*.parquet"))
    assert_user_error(result, "no results file matches", "*.parquet")


def test_compare_unknown_format(mt_run):
    assert_user_error(invoke("compare", str(mt_run["out"]), "--format", "xml"), "xml", "json", "markdown")


def test_compare_corrupt_parquet(tmp_path):
    bad = tmp_path / "corrupt.parquet"
    bad.write_bytes(b"PAR1 this is not really parquet")
    assert_user_error(invoke("compare", str(bad)), "corrupt.parquet", "not a readable parquet")
    assert bad.read_bytes() == b"PAR1 this is not really parquet"


def test_compare_foreign_parquet(tmp_path):
    foreign = tmp_path / "foreign.parquet"
    pd.DataFrame({"x": [1, 2], "y": ["a", "b"]}).to_parquet(foreign)
    before = foreign.read_bytes()
    assert_user_error(invoke("compare", str(foreign)), "foreign.parquet", "not a specbench results file")
    assert foreign.read_bytes() == before


# ---------------------------------------------------------------------------------- bad input


def _bad_cases(tmp: Path) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    plain = tmp / "plain.txt"
    plain.write_text("a regular file, not a folder")
    bad_json = tmp / "bad.jsonl"
    bad_json.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": oops}\n')
    long = tmp / "long.jsonl"
    long.write_text(json.dumps({"id": "huge", "prompt": "a" * 5000}) + "\n")
    (tmp / "dir.parquet").mkdir()
    ok = ["--task", "mt-bench", "--limit", "2", "--max-new-tokens", "4"]
    return {
        "drafter": (["--drafter", "no-such-drafter", *ok], ("unknown drafter", "no-such-drafter", "ngram", "draft-model")),
        "task": (["--task", "no-such-task"], ("unknown task", "no-such-task", "mt-bench", "humaneval")),
        "category": (["--task", "mt-bench", "--category", "cooking"], ("unknown category", "cooking", "writing", "coding")),
        "target": (["--target", "no-such-model", *ok], ("unknown target", "no-such-model", "tiny-llama")),
        "set-key": (["--set", "bogus=1", *ok], ("bogus", "num_draft", "max_n")),
        "set-value": (["--set", "num_draft=abc", *ok], ("num_draft=abc", "integer")),
        "set-invalid": (["--set", "num_draft=0", *ok], ("num_draft",)),
        "max-new-tokens": ([*ok, "--max-new-tokens", "0"], ("--max-new-tokens", "0")),
        "temperature": (["--temperature", "-1", *ok], ("--temperature", "-1")),
        "top-p": (["--top-p", "1.5", *ok], ("--top-p", "1.5")),
        "limit": (["--task", "mt-bench", "--limit", "-3"], ("--limit", "-3")),
        "top-k": (["--top-k", "-1", *ok], ("--top-k", "-1")),
        "device": ([*ok, "--device", "abacus"], ("--device", "abacus", "cpu")),
        "dtype": ([*ok, "--dtype", "int3"], ("--dtype", "int3", "float32")),
        "task-file-missing": (["--task-file", str(tmp / "nope.jsonl")], ("task file not found", "nope.jsonl")),
        "task-file-json": (["--task-file", str(bad_json)], ("bad.jsonl", "line 2", "not valid JSON")),
        "too-long": (["--task-file", str(long), "--max-new-tokens", "4"], ("huge", "4096", "context")),
        "unwritable": ([*ok, "--out", str(plain / "run.parquet")], ("cannot write", "plain.txt", "another --out")),
        "unwritable-results-dir": ([*ok, "--results-dir", str(plain / "r")], ("cannot write", "plain.txt", "another --results-dir")),
        "out-folder": ([*ok, "--out", str(tmp / "dir.parquet")], ("dir.parquet", "is a folder")),
        "out-suffix": ([*ok, "--out", str(tmp / "res" / "run.csv")], (".parquet", "run.csv")),
        "drafter-path": ([*ok, "--drafter-path", str(tmp)], ("ngram", "loads no checkpoint", "--drafter-path")),
        "missing-checkpoint": (["--drafter", "eagle3", *ok, "--drafter-path", str(tmp / "no-head")],
                               ("eagle3", "no-head", "is not a directory", "config.json")),
        "resume-no-out": ([*ok, "--resume"], ("--resume", "--out")),
    }


BAD_IDS = [
    "drafter", "task", "category", "target", "set-key", "set-value", "set-invalid", "max-new-tokens",
    "temperature", "top-p", "limit", "top-k", "device", "dtype", "out-folder", "task-file-missing",
    "task-file-json", "too-long", "unwritable", "unwritable-results-dir", "out-suffix", "drafter-path", "missing-checkpoint", "resume-no-out",
]


@pytest.fixture(scope="module")
def sentinel(mt_run) -> bytes:
    """A real results file, copied into every bad-input results folder."""
    return mt_run["out"].read_bytes()


@pytest.mark.parametrize("case", BAD_IDS)
def test_run_bad_input(case, tmp_path, sentinel):
    cases = _bad_cases(tmp_path)
    assert set(cases) == set(BAD_IDS)
    args, words = cases[case]
    res = tmp_path / "res"
    res.mkdir()
    (res / "existing.parquet").write_bytes(sentinel)
    before = files_under(tmp_path)
    result = invoke(*run_args(res, *args))
    assert_user_error(result, *words)
    # no results file created, the existing one byte-identical (an empty folder may appear)
    assert files_under(tmp_path) == before


# ------------------------------------------------------------------------------------- listings


def test_list_drafters():
    result = invoke("drafters")
    assert result.exit_code == 0, result.output
    for name in ("ar", "ngram", "draft-model", "num_draft"):
        assert name in result.stdout
    assert "failed to load" not in result.stdout
    flat = " ".join(result.stdout.split())  # the table wraps at the terminal's width
    assert "smollm2-135m: drafters/checkpoints/dflash-smollm2-135m-r200k" in flat


def test_list_tasks():
    result = invoke("tasks")
    assert result.exit_code == 0, result.output
    for name in ("humaneval", "mbpp", "math500", "gsm8k", "mt-bench", "spec-bench", "alpaca", "1319", "writing"):
        assert name in result.stdout


def test_list_targets(monkeypatch):
    monkeypatch.setattr(cli.out_console, "_width", 80)
    result = invoke("targets")
    assert result.exit_code == 0, result.output
    for name in ("smollm2-135m", "tiny-llama", "tiny-qwen3", "(default)"):
        assert name in result.stdout
    assert "…" not in result.stdout  # a long model name or cache path folds in a narrow terminal, never cut


def test_run_help():
    result = invoke("run", "--help")
    assert result.exit_code == 0, result.output
    for name in ("--drafter", "--task-file", "--target", "--max-new-tokens", "--set", "--resume", "--out",
                 "--results-dir", "--no-baseline", "--no-warmup"):
        assert name in result.stdout, name


COMMANDS = ["run", "compare", "plot", "train", "train-sets", "targets", "tasks", "drafters", "sweep", "tune", "bench",
            "replay", "profile", "export", "report"]
HARDWARE = ["latency", "calibrate", "overhead"]  # `specbench hardware ...`


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS), ["hardware"], *(["hardware", c] for c in HARDWARE)])
def test_help_fits_80_columns_and_shows_no_bool_metavar(command):
    result = CliRunner().invoke(cli.app, [*command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "--help" in result.stdout and "<bool>" not in result.stdout
    assert "…" not in result.stdout and max(len(line) for line in result.stdout.splitlines()) <= 80


def test_every_command_is_in_the_help_test():
    def names(app) -> list[str]:
        return sorted(c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands)

    assert names(cli.app) == sorted(COMMANDS)
    assert [g.name for g in cli.app.registered_groups] == ["hardware"]
    assert names(cli.app.registered_groups[0].typer_instance) == sorted(HARDWARE)


def test_no_args_shows_commands():
    result = invoke()
    for name in ("run", "compare", "drafters", "tasks", "targets"):
        assert name in result.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["run", "--bogus"], ["--bogus", "run --help"]),
        (["run", "--max-new-tokens", "abc"], ["--max-new-tokens"]),
        (["nosuchcmd"], ["nosuchcmd"]),
        (["compare"], ["files"]),
    ],
)
def test_usage_errors_are_one_line(args, words):
    """A wrong flag, value or command: the same one-line error as every other user mistake."""
    result = invoke(*args)
    line = assert_user_error(result, *words)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert line.endswith("--help`)")


@pytest.mark.parametrize("command, args, module, attr, words", [
    ("train", ["--drafter", "eagle3", "--target", "tiny-llama"], "specbench.train.pipeline", "run_training",
     "training resumes from its last saved step — rerun the same command to continue"),
    ("replay", ["jetspec", "--target", "tiny-llama"], "specbench.replay", "replay_main", "no report was written"),
    ("bench", ["--target", "tiny-llama"], "specbench.bench", "load_target", "no report was written"),
])
def test_ctrl_c_says_what_each_command_leaves(command, args, module, attr, words, tmp_path, monkeypatch):
    """Ctrl-C: exit 130, no traceback, and the hint that fits the command (run's --resume fits only run)."""
    import importlib

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), attr, interrupt)
    extra = ["--out", str(tmp_path / ("head" if command == "train" else "r.md"))]
    result = invoke(command, *args, *extra)
    assert result.exit_code == 130 and "Traceback" not in result.output, result.output
    assert result.stderr.strip() == f"interrupted; {words}"
    assert "--resume" not in result.stderr
