"""RunWriter (persist, resume, atomic finish), read_results, expand_globs, env_fingerprint."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specbench import results
from specbench.errors import UserError
from rowfactory import synthetic_row
from specbench.results import (
    ROW_COLUMNS,
    SCHEMA_VERSION,
    RunWriter,
    env_fingerprint,
    expand_globs,
    read_results,
)


def make_row(prompt_id: str = "p0", turn: int = 1, **overrides) -> dict:
    """A realistic result row: 3 steps accepting 2, 1, 0 drafts from 5-node chains."""
    accepted = overrides.pop("accepted", [2, 1, 0])
    return synthetic_row(prompt_id, turn, accepted, **{"prefill_s": 0.01, "decode_s": 0.5, "draft_s": 0.1,
                                                        "verify_s": 0.3, "other_s": 0.1, **overrides})


def prompt_rows(prompt_id: str, turns: int = 2) -> list[dict]:
    return [make_row(prompt_id, t) for t in range(1, turns + 1)]


def keys_of(df: pd.DataFrame) -> list[tuple[str, int]]:
    return sorted(zip(df["prompt_id"], df["turn"]))


def test_row_columns_match_helper():
    assert list(make_row()) == ROW_COLUMNS


def test_add_finish_round_trip(tmp_path):
    out = tmp_path / "sub" / "run.parquet"
    writer = RunWriter(out, resume=False)
    writer.add(prompt_rows("p0"))
    writer.add(prompt_rows("p1", turns=1))
    assert writer.sidecar.exists()
    assert writer.done == {("p0", 1), ("p0", 2), ("p1", 1)}
    assert writer.finish() == out
    assert not writer.sidecar.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.parquet"]  # no temp file left

    df = read_results([out])
    assert list(df.columns) == ROW_COLUMNS
    assert keys_of(df) == [("p0", 1), ("p0", 2), ("p1", 1)]
    back = df.iloc[0]
    want = make_row("p0", 1)
    assert list(back["accepted_per_step"]) == want["accepted_per_step"]
    assert list(back["output_ids"]) == want["output_ids"]
    assert back["decode_s"] == want["decode_s"] and pd.isna(back["checkpoint_hash"])


def test_finished_file_has_the_umask_mode_not_mkstemps_0600(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        out = tmp_path / "run.parquet"
        writer = RunWriter(out, resume=False)
        writer.add(prompt_rows("p0"))
        writer.finish()
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_finish_with_no_rows_writes_empty_file(tmp_path):
    out = tmp_path / "empty.parquet"
    RunWriter(out, resume=False).finish()
    assert len(read_results([out])) == 0


def test_resume_after_crash_with_truncated_last_line(tmp_path):
    out = tmp_path / "run.parquet"
    writer = RunWriter(out, resume=False)
    writer.add(prompt_rows("p0"))
    writer.add(prompt_rows("p1"))
    # crash mid-write of p2: one full line of its batch and half of the next
    line = json.dumps({"b": 2, "k": 2, "row": make_row("p2", 1)}).encode()
    with open(writer.sidecar, "ab") as f:
        f.write(line + b"\n" + line[: len(line) // 2])

    resumed = RunWriter(out, resume=True)
    assert resumed.done == {("p0", 1), ("p0", 2), ("p1", 1), ("p1", 2)}  # p2 dropped whole
    for pid in ("p2", "p3"):
        resumed.add(prompt_rows(pid))
    resumed.finish()
    df = read_results([out])
    assert keys_of(df) == [(p, t) for p in ("p0", "p1", "p2", "p3") for t in (1, 2)]


def test_resume_twice_after_truncation_keeps_file_clean(tmp_path):
    out = tmp_path / "run.parquet"
    writer = RunWriter(out, resume=False)
    writer.add(prompt_rows("p0", 1))
    with open(writer.sidecar, "ab") as f:
        f.write(b'{"b": 1, "k": 1, "row": {"prompt')
    RunWriter(out, resume=True).add(prompt_rows("p1", 1))
    again = RunWriter(out, resume=True)  # the torn tail was cut, so no corrupt middle line
    assert again.done == {("p0", 1), ("p1", 1)}


def test_corrupt_line_in_the_middle_is_an_error(tmp_path):
    out = tmp_path / "run.parquet"
    writer = RunWriter(out, resume=False)
    writer.add(prompt_rows("p0", 1))
    with open(writer.sidecar, "ab") as f:
        f.write(b"garbage\n")
    writer.add(prompt_rows("p1", 1))
    with pytest.raises(UserError, match="corrupt at line 2"):
        RunWriter(out, resume=True)


def test_bad_batch_header_is_an_error(tmp_path):
    out = tmp_path / "run.parquet"
    writer = RunWriter(out, resume=False)
    with open(writer.sidecar, "ab") as f:
        f.write(json.dumps({"b": 0, "k": 0, "row": make_row()}).encode() + b"\n")
    writer.add(prompt_rows("p1", 1))
    with pytest.raises(UserError, match="corrupt at line 1"):
        RunWriter(out, resume=True)


def test_incomplete_batch_in_the_middle_is_an_error(tmp_path):
    out = tmp_path / "run.parquet"
    writer = RunWriter(out, resume=False)
    with open(writer.sidecar, "ab") as f:
        f.write(json.dumps({"b": 0, "k": 2, "row": make_row("p0", 1)}).encode() + b"\n")
    writer._batches = 1
    writer.add(prompt_rows("p1", 1))
    with pytest.raises(UserError, match="batch 0 is incomplete"):
        RunWriter(out, resume=True)


def test_resume_from_finished_file_adds_rows(tmp_path):
    out = tmp_path / "run.parquet"
    writer = RunWriter(out, resume=False)
    writer.add(prompt_rows("p0"))
    writer.finish()
    resumed = RunWriter(out, resume=True)
    assert resumed.done == {("p0", 1), ("p0", 2)}
    resumed.add(prompt_rows("p1"))
    resumed.finish()
    assert keys_of(read_results([out])) == [("p0", 1), ("p0", 2), ("p1", 1), ("p1", 2)]


def test_resume_with_both_final_and_sidecar_has_no_duplicates(tmp_path):
    out = tmp_path / "run.parquet"
    writer = RunWriter(out, resume=False)
    writer.add(prompt_rows("p0"))
    kept = writer.sidecar.read_bytes()
    writer.finish()
    writer.sidecar.write_bytes(kept)  # a crash between os.replace and deleting the sidecar
    resumed = RunWriter(out, resume=True)
    assert len(resumed.rows) == 2
    resumed.finish()
    assert len(read_results([out])) == 2


def test_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run.parquet"
    writer = RunWriter(out, resume=False)
    writer.add(prompt_rows("p0"))
    with pytest.raises(UserError, match="unfinished run.*--resume"):
        RunWriter(out, resume=False)
    writer.finish()
    with pytest.raises(UserError, match="exists; pass --resume to continue it or choose another --out"):
        RunWriter(out, resume=False)


def test_unwritable_folder(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="cannot write results to folder"):
        RunWriter(blocker / "sub" / "run.parquet", resume=False)


def test_a_report_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """write_atomic: the new text replaces the old in one step; a failure leaves the old file and no stray file."""
    import os

    from specbench import outputs

    report = tmp_path / "report.md"
    outputs.write_atomic(report, "old table\n")
    umask = os.umask(0)
    os.umask(umask)
    assert report.stat().st_mode & 0o777 == 0o666 & ~umask  # a new file: the usual permissions, not mkstemp's 0600
    report.chmod(0o640)
    outputs.write_atomic(report, "new table\n")
    assert report.read_text() == "new table\n" and list(tmp_path.iterdir()) == [report]
    assert report.stat().st_mode & 0o777 == 0o640  # a replaced file keeps its own

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        outputs.write_atomic(report, "half of a newer table")
    assert report.read_text() == "new table\n" and list(tmp_path.iterdir()) == [report]


def test_out_must_be_parquet(tmp_path):
    with pytest.raises(UserError, match=r"\.parquet"):
        RunWriter(tmp_path / "run.csv", resume=False)


def test_resume_of_corrupt_final_file(tmp_path):
    out = tmp_path / "run.parquet"
    out.write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match="not a readable parquet"):
        RunWriter(out, resume=True)


def test_check_compatible(tmp_path):
    out = tmp_path / "run.parquet"
    RunWriter(out, resume=False).add(prompt_rows("p0"))
    resumed = RunWriter(out, resume=True)
    row = make_row()
    meta = {k: row[k] for k in results.RESUME_KEYS}
    resumed.check_compatible(meta)
    resumed.check_compatible({**meta, "temperature": 0})  # int vs float is the same setting
    with pytest.raises(UserError, match="seed=0 but this run has seed=1"):
        resumed.check_compatible({**meta, "seed": 1})
    with pytest.raises(UserError, match="drafter_config"):
        resumed.check_compatible({**meta, "drafter_config": '{"depth":5}'})


def test_read_results_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_results([tmp_path / "missing.parquet"])

    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"this is not parquet at all")
    with pytest.raises(UserError, match="not a readable parquet"):
        read_results([junk])

    good = tmp_path / "good.parquet"
    writer = RunWriter(good, resume=False)
    writer.add(prompt_rows("p0"))
    writer.finish()
    truncated = tmp_path / "truncated.parquet"
    data = good.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="corrupt or truncated"):
        read_results([truncated])

    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), foreign)
    with pytest.raises(UserError, match="not a specbench results file.*missing columns run_id"):
        read_results([foreign])

    future = tmp_path / "future.parquet"
    table = pq.read_table(good)
    idx = table.column_names.index("schema_version")
    table = table.set_column(idx, "schema_version", pa.array([SCHEMA_VERSION + 1] * len(table)))
    pq.write_table(table, future)
    with pytest.raises(UserError, match="schema_version 2"):
        read_results([future])


def test_read_results_concatenates(tmp_path):
    for name, pid in (("a", "p0"), ("b", "p1")):
        writer = RunWriter(tmp_path / f"{name}.parquet", resume=False)
        writer.add(prompt_rows(pid))
        writer.finish()
    df = read_results(expand_globs([str(tmp_path / "*.parquet")]))
    assert keys_of(df) == [("p0", 1), ("p0", 2), ("p1", 1), ("p1", 2)]
    assert len(read_results([])) == 0


def test_expand_globs(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"")
    (tmp_path / "b.parquet").write_bytes(b"")
    assert expand_globs([str(tmp_path / "*.parquet")]) == [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    assert expand_globs([str(tmp_path)]) == [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    assert expand_globs([str(tmp_path / "a.parquet"), str(tmp_path / "*.parquet")]) == [
        tmp_path / "a.parquet",
        tmp_path / "b.parquet",
    ]
    with pytest.raises(UserError, match="no results file matches"):
        expand_globs([str(tmp_path / "*.nothing")])
    with pytest.raises(UserError, match="no results file matches"):
        expand_globs([str(tmp_path / "missing.parquet")])


def test_env_fingerprint():
    env = env_fingerprint("cpu", "float32")
    for key in ("device_name", "cpu_model", "threads", "torch_version", "transformers_version",
                "python_version", "specbench_sha"):
        assert key in env and env[key] not in (None, "")
    assert env["device"] == "cpu" and env["dtype"] == "float32"
    assert env["device_name"] == env["cpu_model"]
    assert isinstance(env["threads"], int) and env["threads"] >= 1


def test_specbench_sha_unknown_outside_git(monkeypatch):
    monkeypatch.setattr(results, "_git", lambda args, cwd: None)
    monkeypatch.delenv("SPECBENCH_SHA", raising=False)
    results.specbench_sha.cache_clear()
    try:
        assert results.specbench_sha() == "unknown"
        # a copy without git (the GPU machine's) may declare its commit, and is marked as declaring it
        results.specbench_sha.cache_clear()
        monkeypatch.setenv("SPECBENCH_SHA", "abc1234+dirty")
        assert results.specbench_sha() == "abc1234+dirty (declared)"
    finally:
        results.specbench_sha.cache_clear()


def test_a_declared_sha_never_overrides_git(monkeypatch):
    results.specbench_sha.cache_clear()
    if results.specbench_sha() == "unknown":
        pytest.skip("not run from a git checkout of specbench")
    monkeypatch.setenv("SPECBENCH_SHA", "not-this")
    results.specbench_sha.cache_clear()
    try:
        assert "not-this" not in results.specbench_sha()
    finally:
        results.specbench_sha.cache_clear()


def test_cuda_device_name_never_crashes():
    # on a machine without CUDA this must fall back rather than raise
    assert isinstance(results._device_name("cuda:7"), str)
