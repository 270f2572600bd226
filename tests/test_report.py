"""Derived metrics (tau, acceptance, speedups, lossless), compare and its formats, baselines."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from specbench import report
from specbench.drafter import available_drafters, config_json
from specbench.errors import UserError
from rowfactory import synthetic_row
from specbench.report import (
    accept_at_least,
    accepted_histogram,
    acceptance_rate,
    compare,
    compare_columns,
    compare_view,
    draft_share,
    drafter_forwards_per_step,
    find_baseline,
    format_compare,
    lossless,
    pair_with_baseline,
    parse_columns,
    run_summary,
    setting_labels,
    sort_compare,
    speedups,
    tau_interval,
    tau_macro,
    tau_ratio_interval,
    tau_micro,
    tokens_per_s,
)
from specbench.results import RunWriter


def make_row(prompt_id: str = "p0", turn: int = 1, **overrides) -> dict:
    """A realistic result row; ``accepted`` sets the steps, n_new_tokens = sum(accepted + 1)."""
    accepted = overrides.pop("accepted", [2, 1, 0])
    return synthetic_row(prompt_id, turn, accepted, **overrides)


def ar_row(prompt_id: str = "p0", turn: int = 1, n_new: int = 6, **overrides) -> dict:
    """The AR baseline: one token per step, no drafts."""
    defaults = dict(
        drafter="ar",
        drafter_config="{}",
        accepted=[0] * n_new,
        tree_size_per_step=[1] * n_new,
        tree_depth_per_step=[0] * n_new,
        drafter_forwards_per_step=[0] * n_new,
        draft_s=0.0,
    )
    defaults.update(overrides)
    return make_row(prompt_id, turn, **defaults)


def frame(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


# --------------------------------------------------------------------------------------------
# per-row-set metrics, hand-computed


@pytest.fixture
def two_rows() -> pd.DataFrame:
    return frame(
        make_row("p0", accepted=[3, 3, 1, 0], decode_s=2.0, draft_s=0.5),  # 11 tokens, 4 steps
        make_row("p1", accepted=[0, 0], decode_s=1.0, draft_s=0.25, drafter_forwards_per_step=[1, 3]),
    )


def test_tau(two_rows):
    assert tau_micro(two_rows) == pytest.approx(13 / 6)
    assert tau_macro(two_rows) == pytest.approx((11 / 4 + 2 / 2) / 2)


def test_acceptance_and_costs(two_rows):
    assert acceptance_rate(two_rows) == pytest.approx(7 / 24)  # 6 steps x 4 drafted nodes
    assert accept_at_least(two_rows, 4) == pytest.approx([3 / 6, 2 / 6, 2 / 6, 0.0])
    assert accept_at_least(two_rows) == pytest.approx([3 / 6, 2 / 6, 2 / 6])  # to the deepest accepted
    hist = accepted_histogram(two_rows)
    assert list(hist.index) == [0, 1, 2, 3] and list(hist) == [3, 1, 0, 2]
    assert draft_share(two_rows) == pytest.approx(0.75 / 3.0)
    assert tokens_per_s(two_rows) == pytest.approx(13 / 3.0)
    assert drafter_forwards_per_step(two_rows) == pytest.approx((4 * 4 + 1 + 3) / 6)


def test_ar_baseline_metrics():
    df = frame(ar_row("p0", n_new=5))
    assert tau_micro(df) == 1.0
    assert math.isnan(acceptance_rate(df))  # nothing drafted
    assert accept_at_least(df) == [0.0]
    assert accept_at_least(df, 4) == [0.0, 0.0, 0.0, 0.0]


def test_empty_metrics_are_nan():
    df = frame(make_row()).iloc[:0]
    assert math.isnan(tau_micro(df)) and math.isnan(tau_macro(df))
    assert all(math.isnan(x) for x in accept_at_least(df))
    assert len(accepted_histogram(df)) == 0


# --------------------------------------------------------------------------------------------
# speedups and lossless


def speed_data() -> pd.DataFrame:
    """Greedy, identical outputs. Baseline decode 2.0 / 4.0 s, drafter 0.5 / 2.0 s; prefill 0.5 s.

    decode: sum = (2 + 4) / (0.5 + 2) = 2.4, mean = (4 + 2) / 2 = 3
    e2e:    sum = (2.5 + 4.5) / (1.0 + 2.5) = 2.0, mean = (2.5 + 1.8) / 2 = 2.15
    p2 has no baseline partner and does not count.
    """
    return frame(
        ar_row("p0", n_new=6, decode_s=2.0, prefill_s=0.5),
        ar_row("p1", n_new=6, decode_s=4.0, prefill_s=0.5),
        make_row("p0", accepted=[2, 2], decode_s=0.5, prefill_s=0.5),
        make_row("p1", accepted=[2, 2], decode_s=2.0, prefill_s=0.5),
        make_row("p2", accepted=[2, 2], decode_s=9.0, prefill_s=0.5),
    )


def test_speedups_hand_computed():
    df = speed_data()
    drafter = df[df["drafter"] == "eagle3"]
    pairs = pair_with_baseline(drafter, df[df["drafter"] == "ar"])
    assert len(pairs) == 2
    sp = speedups(pairs)
    assert sp["decode_speedup_sum"] == pytest.approx(2.4)
    assert sp["decode_speedup_mean"] == pytest.approx(3.0)
    assert sp["e2e_speedup_sum"] == pytest.approx(2.0)
    assert sp["e2e_speedup_mean"] == pytest.approx(2.15)
    assert lossless(pairs) is True


def test_speedup_uses_throughput_when_lengths_differ():
    # sampling: the drafter wrote 12 tokens in 2 s, the baseline 6 tokens in 3 s -> 6/2 = 3x
    df = frame(
        ar_row("p0", n_new=6, decode_s=3.0, temperature=0.7),
        make_row("p0", accepted=[3, 3, 2], n_new_tokens=12, decode_s=2.0, temperature=0.7),
    )
    pairs = pair_with_baseline(df[df["drafter"] != "ar"], df[df["drafter"] == "ar"])
    assert speedups(pairs)["decode_speedup_sum"] == pytest.approx(3.0)
    assert lossless(pairs) is None  # not greedy


def test_lossless_false_and_none():
    base = ar_row("p0", n_new=6)
    wrong = make_row("p0", accepted=[2, 2], output_ids=[100, 101, 102, 103, 104, 999])
    pairs = pair_with_baseline(frame(wrong), frame(base))
    assert lossless(pairs) is False
    assert lossless(pair_with_baseline(frame(wrong), None)) is None
    other_seed = pair_with_baseline(frame(wrong), frame(ar_row("p0", n_new=6, seed=1)))
    assert len(other_seed) == 0 and lossless(other_seed) is None


def _bf16_pair(ar_out, dr_out, ar_margins, dr_margins, ar_runners, dr_runners):
    base = ar_row("p0", n_new=len(ar_out), output_ids=ar_out, dtype="bfloat16",
                  margin_ulps_per_token=ar_margins, runner_up_per_token=ar_runners)
    mine = make_row("p0", accepted=[len(dr_out) - 1], output_ids=dr_out, dtype="bfloat16",
                    margin_ulps_per_token=dr_margins, runner_up_per_token=dr_runners)
    return pair_with_baseline(frame(mine), frame(base))


def test_divergence_tells_a_rounding_near_tie_from_a_real_one():
    # token 2 differs: ar took 7 with runner-up 8, the drafter run took 8 with runner-up 7, both 1.5 ulps apart
    tie = _bf16_pair([1, 2, 7, 9], [1, 2, 8, 3], [40.0, 30.0, 1.5, 9.0], [40.0, 30.0, 1.5, 2.0],
                     [5, 6, 8, 4], [5, 6, 7, 4])
    assert lossless(tie) is False and report.divergence(tie) == "near-tie"
    # the same swap with a wide margin on one side is a real divergence
    wide = _bf16_pair([1, 2, 7, 9], [1, 2, 8, 3], [40.0, 30.0, 12.0, 9.0], [40.0, 30.0, 1.5, 2.0],
                      [5, 6, 8, 4], [5, 6, 7, 4])
    assert report.divergence(wide) == "real"
    assert report.divergence(wide, max_ulps=16.0) == "near-tie"
    # a small margin, but the drafter run's token is not ar's runner-up
    other = _bf16_pair([1, 2, 7, 9], [1, 2, 8, 3], [40.0, 30.0, 1.0, 9.0], [40.0, 30.0, 1.0, 2.0],
                       [5, 6, 11, 4], [5, 6, 7, 4])
    assert report.divergence(other) == "real"
    # one output a prefix of the other (a stop token taken or not) is never a tie
    prefix = _bf16_pair([1, 2, 7], [1, 2, 7, 4], [1.0] * 3, [1.0] * 4, [5] * 3, [5] * 4)
    assert lossless(prefix) is False and report.divergence(prefix) == "real"
    # float32 rows record no margins: any difference is real
    f32 = pair_with_baseline(frame(make_row("p0", accepted=[2, 2], output_ids=[100, 101, 102, 103, 104, 999])),
                             frame(ar_row("p0", n_new=6)))
    assert lossless(f32) is False and report.divergence(f32) == "real"
    # equal outputs: nothing to classify
    same = _bf16_pair([1, 2, 7], [1, 2, 7], [1.0] * 3, [1.0] * 3, [5] * 3, [5] * 3)
    assert lossless(same) is True and report.divergence(same) is None


def test_compare_shows_a_near_tie_as_tie_and_a_real_divergence_as_no(tmp_path):
    rows = [
        ar_row("p0", n_new=4, output_ids=[1, 2, 7, 9], dtype="bfloat16", margin_ulps_per_token=[9.0, 9.0, 1.0, 9.0],
               runner_up_per_token=[5, 6, 8, 4]),
        make_row("p0", accepted=[3], output_ids=[1, 2, 8, 3], dtype="bfloat16", margin_ulps_per_token=[9.0, 9.0, 1.0, 9.0],
                 runner_up_per_token=[5, 6, 7, 4]),
        make_row("p0", accepted=[3], output_ids=[1, 2, 5, 3], dtype="bfloat16", drafter="dflash", drafter_config="{}",
                 margin_ulps_per_token=[9.0, 9.0, 1.0, 9.0], runner_up_per_token=[5, 6, 7, 4]),
    ]
    out = compare(frame(*rows))
    by = out.set_index("drafter")
    assert by.loc["eagle3", "lossless"] is False and by.loc["eagle3", "divergence"] == "near-tie"
    assert by.loc["dflash", "lossless"] is False and by.loc["dflash", "divergence"] == "real"
    assert by.loc["ar", "divergence"] is None
    md = report.format_compare(out, "markdown", columns=["drafter", "lossless"])
    lines = {line.split("|")[1].strip(): line for line in md.splitlines()[2:]}
    assert "| tie | near-tie |" in lines["eagle3"] and "| NO | real |" in lines["dflash"]
    table = report.format_compare(out, "table", width=200, columns=["drafter", "lossless"])
    assert any("eagle3" in line and "tie" in line for line in table.splitlines())
    assert any("dflash" in line and "NO" in line for line in table.splitlines())
    # results files round-trip the two columns; a file without them reads as None
    write(tmp_path / "r.parquet", [rows[1]])
    write(tmp_path / "old.parquet", [make_row("p1")])
    import pyarrow.parquet as pq  # a file from before the two columns existed

    old = pq.read_table(tmp_path / "old.parquet")
    pq.write_table(old.drop_columns(["margin_ulps_per_token", "runner_up_per_token"]), tmp_path / "old.parquet")
    back = report.read_results([tmp_path / "r.parquet", tmp_path / "old.parquet"])
    assert list(back["margin_ulps_per_token"][0]) == [9.0, 9.0, 1.0, 9.0]
    assert list(back["runner_up_per_token"][0]) == [5, 6, 7, 4]
    assert back["margin_ulps_per_token"][1] is None and back["runner_up_per_token"][1] is None


def test_pairs_never_cross_devices():
    df = frame(ar_row("p0", n_new=6), make_row("p0", accepted=[2, 2], device="cuda", device_name="GPU"))
    pairs = pair_with_baseline(df[df["drafter"] != "ar"], df[df["drafter"] == "ar"])
    assert len(pairs) == 0
    assert all(math.isnan(v) for v in speedups(pairs).values())


# --------------------------------------------------------------------------------------------
# compare


def drafter_default(name: str, option: str):
    """The default of one option of an installed drafter (read from its Config, as compare does)."""
    config = available_drafters()[name].load().Config
    return {f.name: f.default for f in dataclasses.fields(config)}[option]


def test_compare_columns_and_values():
    out = compare(speed_data())
    assert list(out.columns) == compare_columns(2, load=True)  # the deepest accepted length in the data is 2
    ar = out[out["drafter"] == "ar"].iloc[0]
    eagle = out[out["drafter"] == "eagle3"].iloc[0]
    assert ar["decode_speedup_sum"] == pytest.approx(1.0) and ar["lossless"] is True
    assert ar["tau"] == 1.0 and ar["config"] == "{}" and ar["setting"] == "default"
    assert eagle["n_prompts"] == 3
    assert eagle["tau"] == pytest.approx(3.0)
    assert eagle["accept_d1"] == 1.0 and eagle["accept_d2"] == 1.0
    assert eagle["decode_speedup_sum"] == pytest.approx(2.4)
    assert eagle["e2e_speedup_mean"] == pytest.approx(2.15)
    assert eagle["lossless"] is True
    assert eagle["config"] == '{"depth":4}'
    assert drafter_default("eagle3", "depth") != 4
    assert eagle["setting"] == "depth=4"


def test_compare_depths_run_to_the_deepest_accepted():
    # steps accept 9, 0, 3, 1, 1 drafts
    df = frame(make_row("p0", accepted=[9, 0, 3]), make_row("p1", accepted=[1, 1]))
    out = compare(df)
    assert [c for c in out.columns if c.startswith("accept_d")] == [f"accept_d{d}" for d in range(1, 10)]
    row = out.iloc[0]
    assert [row[f"accept_d{d}"] for d in range(1, 10)] == pytest.approx([4 / 5, 2 / 5, 2 / 5] + [1 / 5] * 6)
    capped = compare(df, depths=3)
    assert list(capped.columns) == compare_columns(3, load=True)
    assert list(compare(df, depths=50).columns) == compare_columns(9, load=True)  # a cap, not a floor
    with pytest.raises(UserError, match="--depths 0"):
        compare(df, depths=0)
    only_ar = compare(frame(ar_row("p0")))
    assert list(only_ar.columns) == compare_columns(1, load=True) and only_ar.iloc[0]["accept_d1"] == 0.0


def test_compare_without_baseline_has_nan_speedups_and_no_lossless():
    out = compare(frame(make_row("p0")))
    row = out.iloc[0]
    assert math.isnan(row["decode_speedup_sum"]) and row["lossless"] is None


def test_compare_refuses_mixed_devices():
    df = pd.concat([speed_data(), speed_data().assign(device="cuda", device_name="GPU")])
    with pytest.raises(UserError, match="mix devices cpu, cuda; .*--allow-mixed"):
        compare(df)
    out = compare(df, allow_mixed=True)
    assert list(out.columns) == compare_columns(2, varying=["device", "device_name"], load=True)
    assert len(out) == 4
    cuda = out[(out["drafter"] == "eagle3") & (out["device"] == "cuda")].iloc[0]
    assert cuda["decode_speedup_sum"] == pytest.approx(2.4)  # paired with the cuda baseline only


def test_lossless_across_machines_checks_outputs_but_never_pairs_timings():
    other = dict(device_name="Other CPU")
    df = frame(
        ar_row("p0", n_new=6, **other),
        ar_row("p1", n_new=6, **other),
        ar_row("p1", n_new=6, output_ids=[7] * 6),  # this machine's own baseline covers p1 only
        make_row("p0", accepted=[2, 2]),  # same tokens as the other machine's p0 (100..105)
        make_row("p1", accepted=[2, 2]),  # differs from its own machine's p1 baseline
        make_row("p0", accepted=[2, 2], drafter="dflash", output_ids=[100, 101, 102, 9, 9, 9]),
        make_row("p0", accepted=[2, 2], drafter="jetspec", dtype="bfloat16"),  # no baseline of its dtype anywhere
    )
    with pytest.raises(UserError, match="mix hardware"):
        compare(df)
    plain = compare(df, allow_mixed=True).set_index("drafter")
    assert plain.loc["dflash", "lossless"] is None  # no AR on its machine for p0

    out = compare(df, outputs_across_machines=True)  # implies allow_mixed
    by = out.set_index("drafter")
    assert out.attrs["cross_machine_pairs"] == 2  # eagle3's p0 and dflash's p0
    # eagle3: p0 agrees with the other machine, p1 disagrees with its own machine's baseline, which wins
    assert by.loc["eagle3", "lossless"] is False and by.loc["eagle3", "divergence"] == "real"
    assert by.loc["dflash", "lossless"] is False
    assert by.loc["jetspec", "lossless"] is None  # dtype still has to match
    # timings pair on one machine only: eagle3's speedup is its p1 against this machine's p1
    assert by.loc["eagle3", "decode_speedup_sum"] == pytest.approx(plain.loc["eagle3", "decode_speedup_sum"])
    assert math.isnan(by.loc["dflash", "decode_speedup_sum"])
    assert "2 (prompt, turn) pairs" in report.cross_machine_note(out)
    assert report.cross_machine_note(compare(speed_data())) is None

    agree = df[(df["drafter"] == "eagle3") & (df["prompt_id"] == "p0") | (df["device_name"] == "Other CPU")]
    assert compare(agree, outputs_across_machines=True).set_index("drafter").loc["eagle3", "lossless"] is True


def test_lossless_across_machines_leaves_out_prompts_where_other_machines_disagree():
    """Two other machines whose AR outputs differ give no reference: the row is left out of lossless (and
    counted in the note) whatever the order of the files, instead of meeting whichever AR row came first."""
    a, b = dict(device_name="CPU A"), dict(device_name="CPU B")
    rows = [
        ar_row("p0", n_new=6, **a),
        ar_row("p0", n_new=6, output_ids=[100, 101, 102, 103, 104, 7], **b),  # arithmetic moved its last token
        ar_row("p1", n_new=6, **a),
        ar_row("p1", n_new=6, **b),  # the two machines agree on p1
        make_row("p0", accepted=[2, 2]),
        make_row("p1", accepted=[2, 2]),
    ]
    for order in (rows, rows[::-1]):
        out = compare(frame(*order), outputs_across_machines=True)
        row = out.set_index("drafter").loc["eagle3"]
        assert row["lossless"] is True  # p1 only: p0 has two references
        assert out.attrs["cross_machine_pairs"] == 1 and out.attrs["cross_machine_split"] == 1
        note = report.cross_machine_note(out)
        assert "1 (prompt, turn) pair against" in note and "1 (prompt, turn) left out of lossless" in note
    only_p0 = frame(rows[0], rows[1], rows[4])
    out = compare(only_p0, outputs_across_machines=True)
    assert out.set_index("drafter").loc["eagle3", "lossless"] is None  # nothing left to check: unknown, not yes
    assert out.attrs["cross_machine_pairs"] == 0 and out.attrs["cross_machine_split"] == 1


def test_compare_refuses_mixed_machines_on_one_device():
    df = pd.concat([speed_data(), speed_data().assign(device_name="Other CPU")])
    with pytest.raises(UserError, match="mix hardware"):
        compare(df)


def test_compare_adds_varying_setting_columns():
    df = pd.concat([speed_data(), speed_data().assign(temperature=0.7)])
    out = compare(df)
    assert list(out.columns) == compare_columns(2, varying=["temperature"], load=True)
    hot = out[(out["drafter"] == "eagle3") & (out["temperature"] == 0.7)].iloc[0]
    assert hot["lossless"] is None and hot["decode_speedup_sum"] == pytest.approx(2.4)
    # each temperature is one comparable set with its baseline on top
    assert list(zip(out["temperature"], out["drafter"])) == [(0.0, "ar"), (0.0, "eagle3"), (0.7, "ar"), (0.7, "eagle3")]


def test_compare_counts_a_rerun_prompt_once():
    df = pd.concat([speed_data(), speed_data().assign(run_id="run-2", decode_s=100.0)])
    eagle = compare(df).set_index("drafter").loc["eagle3"]
    assert eagle["n_prompts"] == 3 and eagle["decode_speedup_sum"] == pytest.approx(2.4)


def test_compare_empty():
    assert list(compare(frame(make_row()).iloc[:0]).columns) == compare_columns(1)


def test_compare_orders_by_target_task_drafter_with_the_baseline_first():
    rows = []
    for target in ("tiny-qwen3", "tiny-llama"):
        for task in ("mt-bench", "gsm8k"):
            for drafter, config in (("ngram", '{"num_draft": 12}'), ("eagle3", "{}"), ("ngram", '{"num_draft": 4}'),
                                    ("ar", "{}"), ("draft-model", "{}")):
                kwargs = {"drafter": drafter, "drafter_config": config, "target": target, "task": task}
                rows.append(ar_row("p0", **kwargs) if drafter == "ar" else make_row("p0", **kwargs))
    out = compare(frame(*rows))
    group = ["ar", "draft-model", "eagle3", "ngram", "ngram"]
    assert list(out["drafter"]) == group * 4
    assert list(out["target"]) == ["tiny-llama"] * 10 + ["tiny-qwen3"] * 10
    assert list(out["task"]) == (["gsm8k"] * 5 + ["mt-bench"] * 5) * 2
    assert list(out["setting"][3:5]) == ["num_draft=4", "num_draft=12"]  # numbers in natural order


# --------------------------------------------------------------------------------------------
# checkpoints


def test_compare_never_merges_two_checkpoints():
    head_a = [make_row(p, checkpoint_sha256="a1" * 32, checkpoint_path="/heads/a", decode_s=1.0) for p in ("p0", "p1")]
    head_b = [make_row(p, checkpoint_sha256="b2" * 32, checkpoint_path="/heads/b", decode_s=2.0,
                       accepted=[0, 0]) for p in ("p0", "p1")]
    out = compare(frame(*head_a, *head_b))
    assert len(out) == 2
    assert list(out.columns) == compare_columns(2, checkpoint=True, load=True)
    by_hash = out.set_index("checkpoint")
    assert by_hash.loc["a1" * 32, "checkpoint_path"] == "/heads/a"
    assert by_hash.loc["a1" * 32, "tau"] == pytest.approx(2.0)
    assert by_hash.loc["b2" * 32, "tau"] == pytest.approx(1.0)
    assert sorted(out["setting"]) == ["depth=4 @a1a1a1a", "depth=4 @b2b2b2b"]


def test_compare_reads_files_without_checkpoint_columns():
    old = frame(make_row("p0")).drop(columns=["checkpoint_hash"])
    out = compare(old)
    assert list(out.columns) == compare_columns(2, load=True) and out.iloc[0]["setting"] == "depth=4"
    # the legacy column was always empty: no checkpoint columns, one row
    assert list(compare(frame(make_row("p0"), make_row("p1"))).columns) == compare_columns(2, load=True)
    # an old file (no column) read with a new one (sha256 set): two rows, the new one tagged
    mixed = pd.concat([old, frame(make_row("p0", run_id="run-2", checkpoint_sha256="c3" * 32))], ignore_index=True)
    out = compare(mixed)
    assert sorted(out["setting"]) == ["depth=4", "depth=4 @c3c3c3c"]
    assert sorted(out["checkpoint"].map(lambda v: v or "")) == ["", "c3" * 32]
    # a path alone identifies the head when no hash is recorded; checkpoint_hash counts as a hash
    paths = frame(make_row("p0", checkpoint_path="/x/head-1"), make_row("p0", run_id="b", checkpoint_path="/x/head-2"),
                  make_row("p0", run_id="c", checkpoint_hash="d4" * 32))
    assert sorted(compare(paths)["setting"]) == ["depth=4 @d4d4d4d", "depth=4 @head-1", "depth=4 @head-2"]


# --------------------------------------------------------------------------------------------
# setting labels


def ngram_config(**changes) -> str:
    config = available_drafters()["ngram"].load().Config()
    return config_json(dataclasses.replace(config, **changes))


def test_setting_labels_list_what_differs_from_the_defaults():
    num_draft = drafter_default("ngram", "num_draft")
    items = [
        ("ngram", ngram_config(), ""),
        ("ngram", ngram_config(num_draft=num_draft + 1), ""),
        ("ngram", ngram_config(branches=3, num_draft=num_draft + 1), ""),
        ("ar", "{}", ""),
    ]
    labels = setting_labels(items)
    assert [labels[i] for i in items] == [
        "default", f"num_draft={num_draft + 1}", f"num_draft={num_draft + 1}, branches=3", "default",
    ]


def test_setting_labels_fall_back_to_the_config_json():
    items = [("not-installed", '{"a": 1, "b": 2}', ""), ("not-installed", '{"a": 1, "b": 3.5}', ""),
             ("lonely", '{"x": true, "y": "/models/head"}', "")]
    labels = setting_labels(items)
    assert [labels[i] for i in items] == ["b=2", "b=3.5", "x=true, y=head"]


def test_setting_labels_are_distinct_for_distinct_configs():
    items = [("eagle3", json.dumps({"path": f"/runs/{run}/head"}), "") for run in ("a", "b")]
    labels = setting_labels(items)
    assert len(set(labels.values())) == 2
    assert all(label.startswith("path=head #") for label in labels.values())


# --------------------------------------------------------------------------------------------
# the table in a terminal


def readme_like() -> pd.DataFrame:
    """Three tasks x (ar, ngram, three eagle3 trees, a jetspec tree), accepted lengths up to 7."""
    settings = [
        ("ngram", ngram_config(), [3, 0, 1, 0, 5]),
        ("eagle3", json.dumps({"depth": 4, "top_k": 1, "total_tokens": 5}), [1, 0, 2, 0]),
        ("eagle3", json.dumps({"depth": 5, "top_k": 4, "total_tokens": 16}), [2, 1, 0, 3]),
        ("eagle3", "{}", [3, 1, 7, 2]),
        ("jetspec", json.dumps({"budget": 32, "tree": "kbest"}), [1, 2, 0, 4]),
    ]
    rows = []
    for task in ("humaneval", "gsm8k", "mt-bench"):
        for p in range(10):
            rows.append(ar_row(f"p{p}", n_new=12, task=task, decode_s=1.2))
            for k, (drafter, config, accepted) in enumerate(settings):
                acc = accepted * 2
                rows.append(make_row(f"p{p}", task=task, drafter=drafter, drafter_config=config, accepted=acc,
                                     output_ids=list(range(100, 112)), n_new_tokens=12,
                                     decode_s=0.3 + 0.17 * k + 0.01 * p, draft_s=0.01 * k))
    return frame(*rows)


def rendered(view: report.CompareView, width: int) -> str:
    """The view printed on a rich console ``width`` columns wide, as a terminal shows it."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    for item in view.renderables:
        console.print(item)
    return console.file.getvalue()


def expected_cells(row: pd.Series, columns: list[str]) -> list[str]:
    accept = "/".join(str(int(100 * row[f"accept_d{d}"] + 0.5)) for d in range(1, 8))
    while accept.endswith("/0"):
        accept = accept[:-2]
    cells = {
        "n_prompts": str(row["n_prompts"]),
        "tau": f"{row['tau']:.2f}",
        report.ACCEPT: accept,
        "draft_share": f"{100 * row['draft_share']:.1f}%",
        "decode_speedup_sum": f"{row['decode_speedup_sum']:.2f}x",
        "lossless": "yes" if row["lossless"] else "NO",
    }
    return [cells[c] for c in columns]


@pytest.mark.parametrize("width", [80, 100, 160])
def test_table_fits_the_terminal_and_never_cuts_a_number(width):
    out = compare(readme_like())
    assert len(out) == 18 and out["lossless"].all()
    view = compare_view(out, width)
    text = rendered(view, width)
    lines = text.splitlines()
    assert "…" not in text
    assert max(cell_len(line) for line in lines) <= width
    shown = [c for c in report.TABLE_VALUES if c not in view.hidden]
    if width >= 100:
        assert view.hidden == []  # the README's comparisons fit 100 columns whole
    else:
        assert view.hidden and lines[-1].startswith("hidden to fit 80 columns: ")
        assert "draft share" in lines[-1]
    row_lines = [line for line in lines if line.split(" ")[0] in ("humaneval", "gsm8k", "mt-bench")]
    assert len(row_lines) == len(out)
    for (_, row), line in zip(out.iterrows(), row_lines):
        assert line.startswith(f"{row['task']} ")
        cells = line.split()
        for cell in expected_cells(row, shown):
            assert cell in cells, (cell, line)


def test_setting_labels_in_the_table_are_short_and_distinct():
    out = compare(readme_like())
    labels = {(d, s) for d, s in zip(out["drafter"], out["setting"])}
    configs = {(d, c) for d, c in zip(out["drafter"], out["config"])}
    assert len(labels) == len(configs) == 6
    assert max(len(s) for _, s in labels) <= 40  # the longest: "depth=5, top_k=4, total_tokens=16"
    assert ("eagle3", "default") in labels and ("jetspec", "budget=32, tree=kbest") in labels
    text = rendered(compare_view(out, 160), 160)
    assert "{" not in text  # no JSON in the default table


def test_a_very_narrow_terminal_gets_one_record_per_row():
    out = compare(readme_like())
    view = compare_view(out, 48)
    text = rendered(view, 48)
    assert "…" not in text and max(cell_len(line) for line in text.splitlines()) <= 48
    assert not any(isinstance(r, Table) for r in view.renderables)
    heads = [line for line in text.splitlines() if line.startswith(("humaneval ·", "gsm8k ·", "mt-bench ·"))]
    assert len(heads) == len(out)
    assert heads[0] == "gsm8k · ar · default"
    first = text.split(heads[1])[0].split(heads[0])[1]  # the values of the first record
    assert "tau 1.00" in first and "decode speedup 1.00x" in first and "lossless yes" in first
    # a head too long for the width goes on four spaces in, so it never reads as a record of its own
    assert "gsm8k · eagle3 · depth=5, top_k=4,\n    total_tokens=16\n  prompts 10" in text
    flush_left = [line for line in text.splitlines() if not line.startswith(" ")]
    assert flush_left[:len(heads)] == heads and all(line.startswith(("P(acc>=d)", "d=1..")) for line in flush_left[len(heads):])


def test_a_record_field_longer_than_the_line_wraps_between_words():
    lines = [line.plain for line in report.record_lines(
        ["head"], [["tau 1.50", "options budget=16 path=drafters/checkpoints/some-long-head-name", "limit 10"]], 40)]
    assert lines == ["head", "  tau 1.50", "  options budget=16", "    path=drafters/checkpoints/some-long-head-name",
                     "  limit 10"]


def test_wide_and_chosen_columns():
    out = compare(readme_like())
    wide = compare_view(out, 80, wide=True)
    text = rendered(wide, wide.width)
    assert wide.width > 160 and "…" not in text
    assert '{"depth": 5, "top_k": 4, "total_tokens": 16}' in text and "acc>=7" in text and "e2e" in text
    chosen = compare_view(out, 80, columns=parse_columns(out, "drafter,setting,tau,accept"))
    text = rendered(chosen, chosen.width)
    assert text.splitlines()[2].split() == ["drafter", "setting", "tau", "d=1..7"]
    assert chosen.hidden == []


def test_sort_and_columns_by_name():
    out = compare(readme_like())
    by_tau = sort_compare(out, "tau")
    assert list(by_tau["tau"]) == sorted(out["tau"], reverse=True)
    assert list(sort_compare(out, "drafter")["drafter"]) == sorted(out["drafter"])
    assert list(sort_compare(out, "speedup")["decode_speedup_sum"]) == sorted(out["decode_speedup_sum"], reverse=True)
    assert parse_columns(out, "task, prompts,accept,draft") == ["task", "n_prompts", report.ACCEPT, "draft_share"]
    with pytest.raises(UserError, match=r"unknown column 'speed' for --sort; valid columns: target, task, .*tau"):
        sort_compare(out, "speed")
    with pytest.raises(UserError, match=r"unknown column 'nope' for --columns; valid columns: .*lossless, divergence, cpu_shared, accept"):
        parse_columns(out, "task,nope")


# --------------------------------------------------------------------------------------------
# formats


def test_format_json_has_exactly_the_fields():
    records = json.loads(format_compare(compare(speed_data()), "json"))
    assert len(records) == 2
    for rec in records:
        assert list(rec) == compare_columns(2, load=True)
    no_base = json.loads(format_compare(compare(frame(make_row())), "json"))[0]
    assert no_base["decode_speedup_sum"] is None and no_base["lossless"] is None


def test_format_csv_markdown_table():
    out = compare(speed_data())
    back = pd.read_csv(io.StringIO(format_compare(out, "csv")))
    assert list(back.columns) == compare_columns(2, load=True) and len(back) == 2

    md = format_compare(out, "markdown").splitlines()
    assert len(md) == 4
    assert md[0] == "| " + " | ".join(compare_columns(2, load=True)) + " |"
    assert md[1].count("|") == len(compare_columns(2, load=True)) + 1
    assert "2.40x" in md[3] and '{"depth":4}' in md[3] and "| depth=4 |" in md[3] and "yes" in md[3]

    table = format_compare(out, "table")
    assert "tiny-llama" in table and "eagle3" in table and "2.40x" in table and "100/100" in table

    picked = format_compare(out, "csv", columns=["drafter", report.ACCEPT, "tau"])
    assert picked.splitlines()[0] == "drafter,accept_d1,accept_d2,tau"

    with pytest.raises(UserError, match="unknown format 'xml'"):
        format_compare(out, "xml")


def test_markdown_escapes_pipes():
    out = compare(frame(make_row(drafter_config='{"a":"x|y"}')))
    assert '{"a":"x\\|y"}' in format_compare(out, "markdown")


# --------------------------------------------------------------------------------------------
# end of a run


def test_run_summary():
    df = speed_data()
    rows = df[df["drafter"] == "eagle3"]
    summary = run_summary(rows, df[df["drafter"] == "ar"])
    assert summary["n_prompts"] == 3 and summary["n_paired"] == 2
    assert summary["tau_micro"] == pytest.approx(3.0) and summary["tau_macro"] == pytest.approx(3.0)
    assert (summary["tau_lo"], summary["tau_hi"]) == pytest.approx(tau_interval(rows))
    assert summary["acceptance_rate"] == pytest.approx(0.5)
    assert summary["draft_share"] == pytest.approx(0.75 / 11.5)
    assert summary["tokens_per_s"] == pytest.approx(18 / 11.5)
    assert summary["decode_speedup_sum"] == pytest.approx(2.4)
    assert summary["lossless"] is True

    alone = run_summary(rows.to_dict("records"), None)
    assert alone["decode_speedup_sum"] is None and alone["lossless"] is None
    assert alone["n_paired"] == 0 and alone["tau_micro"] == pytest.approx(3.0)
    assert run_summary([], None)["n_prompts"] == 0 and run_summary([], None)["tau_lo"] is None


def write(path, rows):
    writer = RunWriter(path, resume=False)
    for row in rows:
        writer.add([row])
    writer.finish()


def test_find_baseline(tmp_path):
    write(tmp_path / "ar.parquet", [ar_row("p0"), ar_row("p1"), ar_row("p1", 2)])
    write(tmp_path / "eagle.parquet", [make_row("p0"), make_row("p1")])
    (tmp_path / "broken.parquet").write_bytes(b"junk")
    row = make_row()
    meta = {k: row[k] for k in ("target", "task", "temperature", "seed", "device", "dtype", "max_new_tokens")}

    found = find_baseline(tmp_path, {**meta, "keys": {("p0", 1), ("p1", 2)}})
    assert found is not None
    assert sorted(zip(found["prompt_id"], found["turn"])) == [("p0", 1), ("p1", 2)]
    assert set(found["drafter"]) == {"ar"}

    assert find_baseline(tmp_path, {**meta, "keys": {("p0", 1), ("p9", 1)}}) is None  # not covered
    assert find_baseline(tmp_path, {**meta, "seed": 1, "keys": {("p0", 1)}}) is None
    assert find_baseline(tmp_path, {**meta, "device": "cuda", "keys": {("p0", 1)}}) is None
    same_ids = {("p0", 1): [1, 2, 3, 1]}
    assert find_baseline(tmp_path, {**meta, "keys": same_ids}) is not None
    assert find_baseline(tmp_path, {**meta, "keys": {("p0", 1): [7, 7]}}) is None
    assert find_baseline(tmp_path / "nowhere", {**meta, "keys": {("p0", 1)}}) is None


def test_from_files_to_compare_and_summary(tmp_path):
    """Frames read back from parquet (arrow string / list dtypes) behave like in-memory rows."""
    df = speed_data()
    write(tmp_path / "ar.parquet", df[df["drafter"] == "ar"].to_dict("records"))
    write(tmp_path / "eagle.parquet", df[df["drafter"] != "ar"].to_dict("records"))
    from specbench.results import expand_globs, read_results

    back = read_results(expand_globs([str(tmp_path)]))
    pd.testing.assert_frame_equal(compare(back), compare(df), check_dtype=False)

    run_rows = [dict(r, temperature=0) for r in df[df["drafter"] != "ar"].to_dict("records")]
    row = run_rows[0]
    meta = {k: row[k] for k in ("target", "task", "temperature", "seed", "device", "dtype", "max_new_tokens")}
    baseline = find_baseline(tmp_path, {**meta, "keys": {("p0", 1), ("p1", 1)}})
    summary = run_summary(run_rows, baseline)
    assert summary["n_paired"] == 2 and summary["decode_speedup_sum"] == pytest.approx(2.4)
    assert summary["lossless"] is True


# --------------------------------------------------------------------------------------------
# properties

steps_strategy = st.lists(st.integers(0, 6), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(steps_strategy, min_size=1, max_size=6))
def test_tau_micro_between_row_extremes(step_lists):
    df = frame(*(make_row(f"p{i}", accepted=acc) for i, acc in enumerate(step_lists)))
    per_row = df["n_new_tokens"] / df["n_steps"]
    assert per_row.min() - 1e-12 <= tau_micro(df) <= per_row.max() + 1e-12
    assert per_row.min() - 1e-12 <= tau_macro(df) <= per_row.max() + 1e-12
    # with n_new = sum(accepted + 1), tau micro is exactly 1 + mean accepted length
    assert tau_micro(df) == pytest.approx(1 + np.mean(np.concatenate(step_lists)))


@settings(max_examples=60, deadline=None)
@given(st.lists(steps_strategy, min_size=2, max_size=8))
def test_tau_interval_lies_within_the_prompts_taus(step_lists):
    """Each bootstrap resample pools whole prompts, so its tau is a step-weighted mean of per-prompt taus:
    the interval can never leave their range, and it is the same on every call."""
    df = frame(*(make_row(f"p{i}", accepted=acc) for i, acc in enumerate(step_lists)))
    per_prompt = df["n_new_tokens"] / df["n_steps"]
    lo, hi = tau_interval(df)
    assert per_prompt.min() - 1e-12 <= lo <= hi <= per_prompt.max() + 1e-12
    assert tau_interval(df) == (lo, hi)


def test_tau_interval_resamples_prompts_not_turns():
    steady = frame(*(make_row(f"p{i}", accepted=[1, 1]) for i in range(6)))  # every prompt at tau 2
    assert tau_interval(steady) == pytest.approx((2.0, 2.0))
    # two turns of one prompt are one conversation: one prompt gives no interval
    one = frame(make_row("p0", 1, accepted=[0, 0]), make_row("p0", 2, accepted=[3, 3]))
    assert all(math.isnan(v) for v in tau_interval(one))
    # prompts that disagree give a real interval around tau, and more of them a narrower one
    few = frame(*(make_row(f"p{i}", accepted=[0, 0] if i % 2 else [2, 2]) for i in range(4)))
    many = frame(*(make_row(f"p{i}", accepted=[0, 0] if i % 2 else [2, 2]) for i in range(40)))
    (lo_few, hi_few), (lo_many, hi_many) = tau_interval(few), tau_interval(many)
    assert lo_few < tau_micro(few) == 2.0 < hi_few and lo_many < 2.0 < hi_many
    assert hi_many - lo_many < 0.6 * (hi_few - lo_few)
    # per conversation: turns pooled before resampling (p0's two turns move together)
    paired = frame(*(r for i in range(4) for r in (make_row(f"p{i}", 1, accepted=[0, 0]),
                                                       make_row(f"p{i}", 2, accepted=[2, 2]))))
    assert tau_interval(paired) == pytest.approx((2.0, 2.0))  # every conversation pools to tau 2


def test_tau_ratio_interval_is_paired_by_prompt():
    """Two heads on the same prompts: prompt difficulty is shared, so a head that is uniformly 10% better
    gets a tight interval around 1.1 even when the prompts' own taus spread widely."""
    def run(scale: float) -> pd.DataFrame:
        # prompt i: 10 steps, 10 + i*k tokens accepted -> tau spreads over prompts; scale multiplies accepts
        return frame(*(make_row(f"p{i}", accepted=[round(i * scale)] * 10) for i in range(1, 9)))

    first, second = run(1.0), run(1.5)
    mean, lo, hi = tau_ratio_interval([(first, second)])
    assert mean == pytest.approx(tau_micro(second) / tau_micro(first))
    assert lo <= mean <= hi and hi - lo < 0.5 * (mean - 1.0)  # the prompts' spread does not widen it much
    unpaired_lo, unpaired_hi = tau_interval(second)
    assert unpaired_hi - unpaired_lo > 2 * (hi - lo) * tau_micro(first)  # an unpaired view is far wider
    # identical heads: ratio exactly 1 in every resample
    assert tau_ratio_interval([(first, first)]) == pytest.approx((1.0, 1.0, 1.0))
    # a prompt only one head ran is left out; a cell with one shared prompt counts at its ratio, unresampled
    extra = pd.concat([second, frame(make_row("p99", accepted=[9] * 10))], ignore_index=True)
    assert tau_ratio_interval([(first, extra)]) == pytest.approx(tau_ratio_interval([(first, second)]))
    single = tau_ratio_interval([(first.iloc[:1], second.iloc[:1])])
    assert single[0] == pytest.approx((1 + 2) / (1 + 1)) and math.isnan(single[1]) and math.isnan(single[2])  # p1: 2 and 1 accepted
    # several cells: the mean of the per-cell ratios, each cell resampled on its own prompts
    both = tau_ratio_interval([(first, second), (first, first)])
    assert both[0] == pytest.approx((mean + 1.0) / 2) and both[1] <= both[0] <= both[2]
    assert all(math.isnan(v) for v in tau_ratio_interval([]))


def test_compare_reports_the_tau_interval():
    out = compare(speed_data())
    eagle = out[out["drafter"] == "eagle3"].iloc[0]
    assert eagle["tau_lo"] <= eagle["tau"] <= eagle["tau_hi"]
    assert "tau_lo" in format_compare(out, "csv") and "tau\n95% lo" not in format_compare(out, "csv")
    single = compare(frame(make_row("p0", accepted=[1, 2])))
    record = json.loads(format_compare(single, "json"))[0]
    assert math.isnan(single.iloc[0]["tau_lo"]) and record["tau_lo"] is None and record["tau_hi"] is None


@settings(max_examples=60, deadline=None)
@given(st.lists(steps_strategy, min_size=1, max_size=6))
def test_per_depth_acceptance_non_increasing(step_lists):
    df = frame(*(make_row(f"p{i}", accepted=acc) for i, acc in enumerate(step_lists)))
    probs = accept_at_least(df, max_depth=7)
    assert all(0.0 <= p <= 1.0 for p in probs)
    assert all(a >= b for a, b in zip(probs, probs[1:]))
    hist = accepted_histogram(df)
    assert hist.sum() == sum(len(s) for s in step_lists)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 10.0), st.floats(0.01, 10.0)), min_size=1, max_size=5))
def test_speedup_sum_is_time_ratio_for_identical_outputs(times):
    rows = []
    for i, (t_base, t_draft) in enumerate(times):
        rows.append(ar_row(f"p{i}", n_new=6, decode_s=t_base))
        rows.append(make_row(f"p{i}", accepted=[2, 2], decode_s=t_draft))
    df = frame(*rows)
    pairs = pair_with_baseline(df[df["drafter"] != "ar"], df[df["drafter"] == "ar"])
    want = sum(t for t, _ in times) / sum(t for _, t in times)
    assert speedups(pairs)["decode_speedup_sum"] == pytest.approx(want)
    assert lossless(pairs) is True


def test_module_documents_drafted_for_trees():
    assert "tree drafter" in report.acceptance_rate.__doc__


def test_cpu_shared_reads_the_peak_load_against_the_runs_threads():
    from specbench.report import cpu_shared

    assert cpu_shared(2.3, 2) is False and cpu_shared(4.4, 2) is True
    assert cpu_shared(None, 2) is None and cpu_shared(3.0, None) is None
    rows = pd.DataFrame({"prompt_id": ["a", "b"], "turn": [0, 0], "n_new_tokens": [4, 4], "n_steps": [2, 2],
                         "threads": [2, 2], "load_1min": [2.1, 2.2]})
    base = rows.assign(load_1min=[2.0, 4.6])  # the baseline's prompts ran while something else did
    from specbench.report import _load_peak

    assert _load_peak(rows, None) == (2.2, 2) and _load_peak(rows, base) == (4.6, 2)
    assert _load_peak(rows.drop(columns="load_1min"), None) == (None, 2)  # files written before the column


def test_shared_cpu_note_names_the_busy_runs():
    from specbench.report import shared_cpu_note

    idle = [synthetic_row("p", 1, [1, 2], run_id="r1", drafter="ngram", load_1min=2.1, threads=2)]
    busy = [synthetic_row("p", 1, [0, 0], run_id="r2", drafter="ar", load_1min=4.4, threads=2)]
    assert shared_cpu_note(pd.DataFrame(idle)) is None
    note = shared_cpu_note(pd.DataFrame(idle + busy))
    assert note.startswith("1 of 2 runs") and "ar on " in note and "load 4.4, 2 threads" in note and "ngram" not in note
    assert shared_cpu_note(pd.DataFrame(idle + busy).drop(columns="load_1min")) is None  # older files


def test_compare_marks_rows_timed_on_a_shared_cpu():
    """A compare row is cpu_shared when its runs or the AR rows its speedups divide by were timed on a busy
    CPU; the table shows the column only then; files without load samples get no column."""
    from specbench.report import compare, compare_view

    def rows(drafter, load, run_id):
        return [synthetic_row(p, 0, [0, 0] if drafter == "ar" else [1, 2], run_id=run_id, drafter=drafter,
                              drafter_config="{}", load_1min=load, threads=2) for p in ("a", "b")]

    idle = pd.DataFrame(rows("ar", 1.9, "base") + rows("ngram", 2.2, "ng"))
    frame = compare(idle)
    assert list(frame["cpu_shared"]) == [False, False]
    assert "CPU" not in compare_view(frame, 200).text()

    busy_base = pd.DataFrame(rows("ar", 4.4, "base") + rows("ngram", 2.2, "ng"))  # only the baseline was disturbed
    frame = compare(busy_base)
    assert list(frame["drafter"]) == ["ar", "ngram"] and list(frame["cpu_shared"]) == [True, True]
    text = compare_view(frame, 200).text()
    assert "CPU" in text and text.count("SHARED") == 2

    unpaired = pd.DataFrame(rows("ngram", 3.1, "ng"))  # no baseline: its own rows decide
    assert list(compare(unpaired)["cpu_shared"]) == [True]
    assert "cpu_shared" not in compare(idle.drop(columns="load_1min")).columns  # files written before the column


def test_compare_pairs_a_run_with_its_own_baseline_whatever_the_file_order():
    """Two runs of the same prompts, each with its own baseline from its own session (one machine twice as
    fast that day): each run's speedup divides by its own baseline, in either order of the inputs. A run
    without its own baseline, among several that cover its prompts, is named in a warning."""
    from specbench.report import baseline_note

    fast_day = [ar_row("p0", decode_s=1.0, run_id="a.ar-baseline"),
                make_row("p0", accepted=[2, 2], decode_s=0.5, run_id="a", drafter_config='{"depth":4}')]
    slow_day = [ar_row("p0", decode_s=2.0, run_id="b.ar-baseline"),
                make_row("p0", accepted=[2, 2], decode_s=0.8, run_id="b", drafter_config='{"depth":5}')]
    for rows in (fast_day + slow_day, slow_day + fast_day, slow_day[::-1] + fast_day[::-1]):
        out = compare(frame(*rows)).set_index("config")
        assert out.loc['{"depth":4}', "decode_speedup_sum"] == pytest.approx(1.0 / 0.5)
        assert out.loc['{"depth":5}', "decode_speedup_sum"] == pytest.approx(2.0 / 0.8)
        assert baseline_note(frame(*rows)) is None
    # a cell with no baseline of its own: paired with the first baseline that covers it, and named
    orphan = make_row("p0", accepted=[2, 2], decode_s=0.4, run_id="c", drafter_config='{"depth":6}')
    df = frame(*slow_day, *fast_day, orphan)
    assert compare(df).set_index("config").loc['{"depth":6}', "decode_speedup_sum"] == pytest.approx(2.0 / 0.4)
    note = baseline_note(df)
    assert note is not None and "c divides by b.ar-baseline (of b.ar-baseline, a.ar-baseline)" in note
    assert baseline_note(frame(*fast_day, orphan)) is None  # one baseline only: nothing to choose between


def test_a_run_divided_by_a_baseline_timed_in_another_set_up_is_named():
    """One baseline only, but measured by other code (another session) or on another CPU: the speedup still
    divides by it, and the note says which run, by which baseline, and what differs."""
    from specbench.report import baseline_note

    base = [ar_row(p, decode_s=1.0, run_id="sweep.ar-baseline", specbench_sha="8c6d8c7", cpu_model="AMD EPYC")
            for p in ("p0", "p1")]
    later = [make_row(p, decode_s=0.5, run_id="later", specbench_sha="cd4898c", cpu_model="AMD EPYC") for p in ("p0", "p1")]
    same = [make_row(p, decode_s=0.5, run_id="cell", specbench_sha="8c6d8c7", cpu_model="AMD EPYC") for p in ("p0", "p1")]
    assert baseline_note(frame(*base, *same)) is None  # a sweep's cell on its sweep's baseline
    note = baseline_note(frame(*base, *same, *later))
    assert note is not None and note.count("divides by") == 1
    assert "later divides by sweep.ar-baseline (timed with specbench_sha cd4898c, its baseline's 8c6d8c7)" in note
    assert compare(frame(*base, *later)).set_index("drafter").loc["eagle3", "decode_speedup_sum"] == pytest.approx(2.0)
    other_cpu = [{**r, "cpu_model": "Intel Xeon", "specbench_sha": "8c6d8c7"} for r in later]
    assert "cpu_model Intel Xeon, its baseline's AMD EPYC" in baseline_note(frame(*base, *other_cpu))


def test_pairing_prefers_the_runs_own_baseline_and_names_the_one_it_chose():
    """pair_with_baseline is the one place that picks a baseline: a run's own (`<run_id>.ar-baseline`) when
    present, whichever file came first; the first covering one otherwise; `run_id_base` says which."""
    own = [ar_row("p0", decode_s=1.0, run_id="a.ar-baseline"), ar_row("p1", decode_s=1.0, run_id="a.ar-baseline")]
    other = [ar_row("p0", decode_s=3.0, run_id="z.ar-baseline"), ar_row("p1", decode_s=3.0, run_id="z.ar-baseline")]
    run = frame(make_row("p1", run_id="a", decode_s=0.5), make_row("p0", run_id="a", decode_s=0.5))
    for base in (frame(*other, *own), frame(*own, *other)):
        pairs = pair_with_baseline(run, base)
        assert pairs["prompt_id"].tolist() == ["p1", "p0"]  # the run's own row order
        assert pairs["run_id_base"].tolist() == ["a.ar-baseline"] * 2
        assert pairs["decode_s_base"].tolist() == [1.0, 1.0]
    orphan = frame(make_row("p0", run_id="c", decode_s=0.5))
    assert pair_with_baseline(orphan, frame(*other, *own))["run_id_base"].tolist() == ["z.ar-baseline"]
    assert pair_with_baseline(orphan, frame(*own, *other))["run_id_base"].tolist() == ["a.ar-baseline"]
    # its own baseline without a prompt: that prompt stays unpaired rather than borrowing another session's
    short = frame(*other, own[0])
    assert pair_with_baseline(run, short)["prompt_id"].tolist() == ["p0"]
    # files written before run_id existed: the first baseline row of the keys
    old = pair_with_baseline(run.drop(columns="run_id"), frame(*other, *own).drop(columns="run_id"))
    assert old["decode_s_base"].tolist() == [3.0, 3.0] and old["run_id_base"].isna().all()
