"""The training-free drafters' options (ngram match rules, draft-model schedule and confidence stop),
the replay that tunes them (specbench/replay.py) against real decoding, and `specbench bench` (no
timing assertions: the machine is shared)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from clirun import invoke, one_error_line
from specbench import bench, replay
from specbench.decode import generate
from specbench.drafter import DraftContext, Sampling, UserError, drafter_class, parse_config
from specbench.results import read_results
from specbench.targets import load_target
from specbench.tasks import load_task, render_chat


class _Target:  # the ngram drafter reads only the stop tokens
    stop_token_ids = (99,)


def ngram(*opts: str):
    cls = drafter_class("ngram")
    return cls(_Target(), parse_config(cls.Config, list(opts)))


def first_proposal(drafter, history: list[int]) -> list[list[int]]:
    drafter.reset(Sampling())
    tree = drafter.propose(DraftContext(tokens=torch.tensor(history), features=None, pos=len(history) - 1, accepted_nodes=None))
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    leaves = [i for i in range(len(tokens)) if i not in parents]
    paths = []
    for leaf in leaves:
        path, node = [], leaf
        while node > 0:
            path.append(tokens[node])
            node = parents[node]
        paths.append(path[::-1])
    return [p for p in paths if p]


# history: "5 1 2 | 3 4" early, "7 1 2 | 8 9" later, ends with "... 7 1 2": the bigram (1, 2) occurs twice
HISTORY = [5, 1, 2, 3, 4, 0, 7, 1, 2, 8, 9, 0, 6, 6, 7, 1, 2]


@pytest.mark.parametrize("rule, expected", [("first", [3, 4, 0]), ("recent", [8, 9, 0]), ("longest", [8, 9, 0])])
def test_ngram_match_rules(rule, expected):
    assert first_proposal(ngram(f"match={rule}", "max_n=2", "num_draft=3"), HISTORY) == [expected]


def test_ngram_longest_prefers_the_longer_context_over_recency():
    # (1, 2) occurs after "7" early and after "5" late; the suffix is "7 1 2": longest picks the early one
    history = [7, 1, 2, 3, 4, 0, 5, 1, 2, 8, 9, 0, 7, 1, 2]
    assert first_proposal(ngram("match=longest", "max_n=2", "num_draft=2"), history) == [[3, 4]]
    assert first_proposal(ngram("match=recent", "max_n=2", "num_draft=2"), history) == [[8, 9]]


def test_ngram_falls_back_to_shorter_ngrams_and_cuts_at_stop_tokens():
    # no earlier (3, 2, 1); 1 occurs before: continuation 1 -> 5 99 (cut after the stop token 99)
    history = [1, 5, 99, 4, 3, 2, 1]
    assert first_proposal(ngram("max_n=3", "min_n=1", "num_draft=5"), history) == [[5, 99]]
    assert first_proposal(ngram("max_n=3", "min_n=2", "num_draft=5"), history) == []


def test_ngram_branches_are_distinct_continuations():
    paths = first_proposal(ngram("match=recent", "max_n=2", "num_draft=2", "branches=2"), HISTORY)
    assert sorted(paths) == [[3, 4], [8, 9]]


def test_ngram_options_refused_in_one_line():
    cls = drafter_class("ngram")
    with pytest.raises(UserError, match="match must be one of"):
        parse_config(cls.Config, ["match=best"])
    cls = drafter_class("draft-model")
    for bad, msg in ((["schedule=fast"], "schedule must be"), (["threshold=1.5"], "threshold must lie")):
        with pytest.raises(UserError, match=msg):
            parse_config(cls.Config, ["model=tiny-llama", *bad])


# --------------------------------------------------------------------------- replay == real decoding


@pytest.fixture(scope="module")
def tiny():
    target = load_target("tiny-llama", device="cpu", dtype="float32")
    tok = target.tokenizer
    texts = [p.turns[0][-60:] for p in load_task("humaneval")[:3]] + ["abc abc abc abc abc", "the cat sat on the mat. the cat"]
    prompts = [render_chat(tok, [{"role": "user", "content": t}]) for t in texts]
    return target, prompts


@pytest.fixture(scope="module")
def loopy():
    """tiny-qwen3 on plain repetitive prompts repeats itself now and then within 150 tokens."""
    target = load_target("tiny-qwen3", device="cpu", dtype="float32")
    texts = ["abc abc abc abc abc", "1 2 3 1 2 3 1 2 3 1 2 3", "ab ab ab ab ab ab ab"]
    return target, [target.tokenizer.encode(t) for t in texts]


@pytest.mark.parametrize("opts", [(), ("match=first", "max_n=2", "num_draft=4"), ("match=recent", "branches=3")])
def test_ngram_replay_equals_decoding(loopy, opts):
    target, prompts = loopy
    cls = drafter_class("ngram")
    drafter = cls(target, parse_config(cls.Config, list(opts)))
    accepted_any = False
    for ids in prompts:
        g = generate(target, drafter, torch.tensor(ids), 150, Sampling())
        steps, sizes, _ = replay.replay_ngram(drafter, replay.Ref("t", "p", ids, g.output_ids))
        assert steps == len(g.steps)
        assert sizes == [s.tree_size for s in g.steps]
        accepted_any |= any(s.accepted for s in g.steps)
    assert accepted_any


@pytest.mark.parametrize("opts", [
    dict(schedule="constant", num_draft=3, threshold=0.0),
    dict(schedule="heuristic", num_draft=2, threshold=0.0),
    dict(schedule="constant", num_draft=6, threshold=0.5),
    dict(schedule="heuristic", num_draft=3, threshold=0.3),
])
def test_draft_model_replay_equals_decoding(tiny, opts):
    """The chain replayed from one teacher-forced trace (plus the off-path chains) takes the same
    steps as the real drafter: same drafted and accepted counts, the schedule and the stop included."""
    target, prompts = tiny
    cls = drafter_class("draft-model")
    drafter = cls(target, parse_config(cls.Config, ["model=tiny-llama3", *(f"{k}={v}" for k, v in opts.items())]))
    lengths = set()
    for ids in prompts:
        g = generate(target, drafter, torch.tensor(ids), 48, Sampling())
        trace = replay.trace_draft(drafter.draft, replay.Ref("t", "p", ids, g.output_ids), off_path=64, min_threshold=0.3)
        steps = replay.replay_chain(trace, g.output_ids, opts["num_draft"], opts["schedule"], opts["threshold"])
        real = [(s.tree_size - 1, s.accepted) for s in g.steps]
        # the last step may differ: the replay stops drafting where the reference ends
        assert [(d, a) for d, a, _ in steps][:-1] == real[:-1]
        assert len(steps) == len(real)
        lengths |= {d for d, _ in real}
    if opts["schedule"] == "heuristic" or opts["threshold"] > 0:
        assert len(lengths) > 1  # the chain length did change


def test_draft_model_heuristic_schedule_follows_upstream_rule(tiny):
    target, prompts = tiny
    cls = drafter_class("draft-model")
    drafter = cls(target, parse_config(cls.Config, ["model=tiny-llama3", "schedule=heuristic", "num_draft=2", "threshold=0"]))
    g = generate(target, drafter, torch.tensor(prompts[3]), 48, Sampling())
    length = 2
    for step in g.steps:
        assert step.tree_size - 1 == length
        length = length + 2 if step.accepted == length else max(1, length - 1)


def test_replay_cli_writes_reports(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "ng.md"
    replay.main(["ngram", "--target", "tiny-llama", "--tasks", "humaneval,mt-bench", "--limit", "1", "--max-new-tokens", "12",
                 "--quick", "--rounds", "1", "--out", str(out)])
    data = json.loads(out.with_suffix(".json").read_text())
    assert {r["match"] for r in data["rows"]} == {"first", "recent", "longest"}
    assert all(r["tau"] >= 1.0 for r in data["rows"])
    assert "Best by predicted decode speedup" in out.read_text()
    assert list((tmp_path / "cache" / "replay").glob("refs-*.json"))  # the references are cached


def test_bench_pairs_and_report(tmp_path, capsys):
    out = tmp_path / "bench.md"
    bench.main(["--target", "tiny-llama", "--limit", "2", "--max-new-tokens", "10", "--draft", "tiny-llama",
                "--ngram-set", "num_draft=3", "--draft-set", "num_draft=2", "--draft-set", "threshold=0", "--hf-assist", "num_assistant_tokens=2", "--out", str(out)])
    assert "specbench vs transformers" in capsys.readouterr().out  # the rich table
    report = json.loads(out.with_suffix(".json").read_text())
    summary = report["summary"]
    assert list(summary) == ["ar", "ngram", "draft-model"]
    for s in summary.values():
        assert s["prompts"] == 2 and s["same_as_ar"] == 2  # specbench is lossless
        assert s["hf_same_as_hf_greedy"] == 2  # and so is transformers on these
        assert s["tok_s"] > 0 and s["hf_tok_s"] > 0 and s["ratio"] > 0
    assert json.loads(summary["ngram"]["hf_settings"]) == {"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 3}
    assert json.loads(summary["draft-model"]["hf_settings"])["num_assistant_tokens"] == 2
    assert summary["draft-model"]["tau"] > 2.0  # a draft identical to the target is always accepted
    assert "| ngram | prompt lookup |" in out.read_text()
    assert len(report["per_prompt"]) == 2 and all("load_1min" in r for r in report["per_prompt"])
    assert "load average" in out.read_text()  # how busy the machine was is part of the report


def test_bench_load_note_says_whether_the_machine_was_shared():
    idle = bench.load_note(0.1, [2.1, 2.3], threads=2)
    busy = bench.load_note(0.2, [2.1, 4.4], threads=2)
    lagging = bench.load_note(1.8, [2.1], threads=2)  # a load that ended just before the run
    assert "otherwise idle" in idle and "0.10 before the run, at most 2.30" in idle
    assert "other processes shared the CPU" in busy and "at most 4.40" in busy
    assert "otherwise idle" in lagging and "1.80 before the run" in lagging
    assert "not available" in bench.load_note(None, [None], threads=1)


def test_bench_refuses_unknown_pair_in_one_line():
    result = subprocess.run([sys.executable, "-m", "specbench.bench", "--target", "tiny-llama", "--pairs", "ar,eagle"],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["error: unknown pair 'eagle' in --pairs; choose from ar, ngram, draft-model"]


def test_bench_cli_command_runs_the_same_bench(tmp_path):
    out = tmp_path / "cli-bench.md"
    result = invoke("bench", "--target", "tiny-llama", "--limit", "1", "--max-new-tokens", "6", "--pairs", "ar,ngram",
                    "--ngram-set", "num_draft=2", "--out", out)
    assert result.exit_code == 0, result.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert list(report["summary"]) == ["ar", "ngram"]
    assert report["summary"]["ngram"]["same_as_ar"] == 1
    assert report["command"].startswith("specbench bench --target tiny-llama")
    assert json.loads(report["summary"]["ngram"]["hf_settings"])["prompt_lookup_num_tokens"] == 2


@pytest.mark.parametrize("args, message", [
    (("--limit", "0"), "error: --limit must be at least 1, got 0"),
    (("--pairs", "ar,eagle"), "error: unknown pair 'eagle' in --pairs; choose from ar, ngram, draft-model"),
    (("--threads", "-1"), "error: --threads must be >= 0 (0 = torch's default), got -1"),
])
def test_bench_cli_refuses_bad_input_in_one_line(args, message):
    assert one_error_line(invoke("bench", "--target", "tiny-llama", *args)) == message


def test_cost_profile_is_made_monotone():
    assert replay.monotone({1: 2.0, 2: 5.0, 3: 3.0, 4: 6.0}) == {1: 2.0, 2: 4.0, 3: 4.0, 4: 6.0}
    assert replay.monotone({1: 1.0, 2: 2.0}) == {1: 1.0, 2: 2.0}


@pytest.mark.parametrize("argv", [
    ["replay", "ngram", "--target", "tiny-llama"],  # the tuning mode, whose --out has a default
    ["replay", "jetspec", "--target", "tiny-llama", "--set", "path=random"],
    ["bench", "--target", "tiny-llama"],
])
def test_an_out_that_cannot_be_written_is_one_line_before_any_model_loads(argv, tmp_path, monkeypatch):
    """A report's ``--out`` under a file, or naming a folder, is refused before the model loads (not after a
    replay of many minutes), in one line that names --out, and nothing is written."""
    def no_model(*args, **kwargs):
        raise AssertionError("a model loaded before --out was checked")

    monkeypatch.setattr(replay, "load_target", no_model)
    monkeypatch.setattr(bench, "load_target", no_model)
    plain = tmp_path / "plain.txt"
    plain.write_text("a file")
    line = one_error_line(invoke(*argv, "--out", plain / "x.md"))
    assert "cannot write a report to folder" in line and "plain.txt" in line and line.endswith("choose another --out")
    line = one_error_line(invoke(*argv, "--out", tmp_path))
    assert line == f"error: --out {tmp_path} is a folder; name a file, e.g. --out {tmp_path / 'report.md'}"
    line = one_error_line(invoke(*argv, "--out", tmp_path / "x.json"))  # the JSON would overwrite the markdown
    assert "cannot end in .json" in line and line.endswith(f"--out {tmp_path / 'x.md'}")
    assert list(tmp_path.iterdir()) == [plain] and plain.read_text() == "a file"


def test_replay_table_puts_the_best_setting_first_and_nan_last():
    """The settings table is ordered by the sort column, largest first; an unpriced (nan) setting goes last."""
    rows = [dict(budget=b, speedup=v) for b, v in ((16, 1.2), (32, float("nan")), (64, 1.5), (128, 0.9))]
    table = replay._markdown(rows, ["budget", "speedup"], "speedup")
    assert [ln.split(" | ")[0].strip("| ") for ln in table[2:]] == ["64", "16", "128", "32"]
    assert table[2:4] == ["| 64 | 1.500 |", "| 16 | 1.200 |"] and table[-1] == "| 32 | nan |"
    assert len(replay._markdown(rows, ["budget"], "speedup", top=2)) == 4  # header, rule, the best two


def test_replay_of_a_learned_drafter_retraces_its_run_and_varies_options(tmp_path, monkeypatch, capsys):
    """``python -m specbench.replay DRAFTER --refs FILE`` replays a run's outputs: at the run's own options
    it retraces every row step for step (and says so); each ``--vary`` value gets a row."""
    from typer.testing import CliRunner

    from specbench import cli

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    from drafters.block.checkpoint import save_block

    cls = drafter_class("jetspec")  # a checkpoint folder, so the hardware projection knows the head's shape
    head = cls(load_target("tiny-llama"), parse_config(cls.Config, ["path=random", "block_size=8"]))
    save_block(head.model, tmp_path / "head", "jetspec")
    opts = ["--set", f"path={tmp_path / 'head'}", "--set", "width=3"]
    run = CliRunner().invoke(cli.app, ["run", "--target", "tiny-llama", "--no-warmup", "--results-dir", str(tmp_path / "r"),
                                       "--drafter", "jetspec", *opts, "--set", "budget=6", "--task", "humaneval",
                                       "--limit", "2", "--max-new-tokens", "12"])
    assert run.exit_code == 0, run.output
    (parquet,) = [f for f in (tmp_path / "r").glob("*.parquet") if not f.name.endswith(".ar-baseline.parquet")]
    out = tmp_path / "replay.md"
    # no --target: the one the files name
    h100 = "h100-sxm:engine"
    replay.main(["jetspec", "--refs", str(parquet), *opts, "--vary", "budget=6,3", "--hardware", h100,
                 "--hardware", "a100:hf-eager", "--out", str(out)])
    rows = {r["budget"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    live = read_results([parquet])
    assert rows["6"]["live_rows_retraced"] == f"{len(live)}/{len(live)}"
    assert rows["6"]["tau"] == pytest.approx(live["n_new_tokens"].sum() / live["n_steps"].sum())
    # the replayed steps are priced as compare --hardware prices the run's own logged steps
    from specbench.hardware.project import project_rows

    table = [ln for ln in out.read_text().splitlines() if ln.startswith("| ") and not ln.startswith("| budget")]
    assert "Settings best first by speedup_h100-sxm:engine." in out.read_text()  # the first profile orders the rows
    assert [ln.split(" | ")[0].strip("| ") for ln in table] == sorted(rows, key=lambda b: -rows[b][f"speedup_{h100}"])
    for profile in (h100, "a100:hf-eager"):
        priced = project_rows(live, profile).speedup_sum
        assert math.isfinite(priced) and rows["6"][f"speedup_{profile}"] == pytest.approx(priced, rel=1e-9)
    what_if = tmp_path / "what-if.md"  # through `specbench replay`, the files as arguments (a glob, as compare takes)
    done = invoke("replay", "jetspec", str(parquet).removesuffix("uet") + "*", *opts, "--set", "budget=6", "--hardware", h100, "--as-target", "qwen3-8b",
                  "--out", what_if)
    assert done.exit_code == 0, done.output
    assert json.loads(what_if.with_suffix(".json").read_text())["command"].startswith("specbench replay jetspec --limit 10")
    (big,) = json.loads(what_if.with_suffix(".json").read_text())["rows"]
    assert big[f"speedup_{h100}"] == pytest.approx(project_rows(live, h100, "qwen3-8b").speedup_sum, rel=1e-9)
    assert "as if the target had qwen3-8b's shape" in what_if.read_text()
    assert not any(k.startswith(f"speedup_{h100}_") for k in big)  # one task: the pooled figure is the task's
    # random weights have no config.json to price the head's forwards by: nan, said so, never a free drafter
    replay.main(["jetspec", "--refs", str(parquet), "--set", "path=random", "--set", "block_size=8", "--hardware", h100,
                 "--out", str(what_if)])
    (unpriced,) = json.loads(what_if.with_suffix(".json").read_text())["rows"]
    assert math.isnan(unpriced[f"speedup_{h100}"]) and "its forwards cannot be priced" in what_if.read_text()
    more = CliRunner().invoke(cli.app, ["run", "--target", "tiny-llama", "--no-warmup", "--results-dir", str(tmp_path / "g"),
                                        "--drafter", "jetspec", *opts, "--set", "budget=6", "--task", "gsm8k",
                                        "--limit", "1", "--max-new-tokens", "12"])
    assert more.exit_code == 0, more.output
    (gsm8k,) = [f for f in (tmp_path / "g").glob("*.parquet") if not f.name.endswith(".ar-baseline.parquet")]
    replay.main(["jetspec", "--refs", str(parquet), str(gsm8k), *opts, "--set", "budget=6", "--hardware", h100,
                 "--out", str(what_if)])
    (both,) = json.loads(what_if.with_suffix(".json").read_text())["rows"]
    live = read_results([parquet, gsm8k])
    for task in ("humaneval", "gsm8k"):  # each task's steps priced on their own, as compare prices a task's rows
        assert both[f"speedup_{h100}_{task}"] == pytest.approx(project_rows(live[live["task"] == task], h100).speedup_sum, rel=1e-9)
    assert both[f"speedup_{h100}"] == pytest.approx(project_rows(live, h100).speedup_sum, rel=1e-9)
    from specbench.report import accept_at_least

    at_least = accept_at_least(live)  # the live steps' P(acc >= d): the replay took the same steps
    assert rows["6"]["p_acc_ge_d"] == "/".join(f"{100 * x:.0f}" for x in at_least[:8])
    assert "live_rows_retraced" not in rows["3"]  # another budget: nothing to retrace
    assert rows["3"]["tree_size"] <= 3 and rows["6"]["tree_size"] <= 6
    assert "The reference files' own decoding: jetspec on humaneval" in capsys.readouterr().out
    with pytest.raises(UserError, match="decoded by tiny-llama, not --target tiny-qwen3"):
        replay.main(["jetspec", "--target", "tiny-qwen3", "--refs", str(parquet), *opts])
    with pytest.raises(UserError, match="hold no row of --tasks mt-bench"):
        replay.main(["jetspec", "--target", "tiny-llama", "--refs", str(parquet), "--tasks", "mt-bench", *opts])
    sampled = CliRunner().invoke(cli.app, ["run", "--target", "tiny-llama", "--no-warmup", "--results-dir", str(tmp_path / "s"),
                                           "--drafter", "ar", "--temperature", "0.8", "--task", "humaneval", "--limit", "1",
                                           "--max-new-tokens", "4"])
    assert sampled.exit_code == 0, sampled.output
    with pytest.raises(UserError, match="sampled"):
        replay.main(["jetspec", "--target", "tiny-llama", "--refs", *map(str, (tmp_path / "s").glob("*.parquet")), *opts])


@pytest.mark.parametrize("argv,words", [
    (["jetspec", "--vary", "budget"], "--vary expects key=v1,v2"),
    (["nosuch", "--vary", "budget=4"], "unknown drafter 'nosuch'"),
    (["jetspec", "--vary", "bugdet=4"], "unknown --set key 'bugdet'"),
    (["jetspec", "--hardware", "h900"], "unknown hardware profile 'h900'"),
    (["jetspec", "--as-target", "qwen3-8b"], "--as-target needs --hardware"),
    (["jetspec", "--hardware", "h100-sxm:engine", "--as-target", "no-such-model"], "no-such-model"),
])
def test_replay_refuses_bad_input_before_loading_a_model(argv, words):
    with pytest.raises(UserError, match=words):
        replay.main(argv)
    assert words in one_error_line(invoke("replay", *argv))  # `specbench replay`: one line, exit 2
