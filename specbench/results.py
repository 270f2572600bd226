"""Result rows -> parquet: one row per (prompt, turn), written as each prompt finishes.

A run keeps its rows in a sidecar ``<out>.partial.jsonl`` (appended and fsynced after every
prompt), so a crash loses at most the prompt in flight and ``--resume`` picks up where it stopped.
:meth:`RunWriter.finish` writes the final ``<out>`` parquet atomically (temp file + ``os.replace``)
and only then deletes the sidecar, so a ``.parquet`` on disk is always complete.

Rows store raw counts and times only; every ratio (tau, acceptance, speedup) is derived in
:mod:`specbench.report`.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specbench.errors import UserError
from specbench.outputs import check_folder, file_mode

SCHEMA_VERSION = 1

# The columns of a result row, in order, with their arrow types. Times are seconds
# (time.perf_counter); *_per_step lists have one entry per verify step (n_steps entries).
_ROW_SCHEMA: list[tuple[str, pa.DataType]] = [
    ("run_id", pa.string()),
    ("target", pa.string()),
    ("drafter", pa.string()),
    ("drafter_config", pa.string()),  # canonical JSON of the drafter's Config
    ("checkpoint_hash", pa.string()),  # sha256 of the drafter's weights (CheckpointId); None without weights
    ("checkpoint_path", pa.string()),  # where those weights came from (a directory, "random:seed=S", a model name)
    ("task", pa.string()),
    ("category", pa.string()),
    ("prompt_id", pa.string()),
    ("turn", pa.int64()),
    ("temperature", pa.float64()),
    ("top_p", pa.float64()),
    ("top_k", pa.int64()),
    ("seed", pa.int64()),
    ("max_new_tokens", pa.int64()),
    ("device", pa.string()),  # "cpu", "cuda", ...
    ("dtype", pa.string()),
    ("prompt_ids", pa.list_(pa.int64())),
    ("output_ids", pa.list_(pa.int64())),
    ("n_new_tokens", pa.int64()),
    ("n_steps", pa.int64()),  # verify forwards of the target
    ("accepted_per_step", pa.list_(pa.int64())),  # accepted drafts per step, bonus excluded
    ("tree_size_per_step", pa.list_(pa.int64())),  # nodes incl. root
    ("tree_depth_per_step", pa.list_(pa.int64())),
    ("drafter_forwards_per_step", pa.list_(pa.int64())),
    ("prefill_s", pa.float64()),
    ("decode_s", pa.float64()),
    ("draft_s", pa.float64()),
    ("verify_s", pa.float64()),
    ("other_s", pa.float64()),
    # environment fingerprint (see env_fingerprint)
    ("device_name", pa.string()),
    ("cpu_model", pa.string()),
    ("threads", pa.int64()),
    ("torch_version", pa.string()),
    ("transformers_version", pa.string()),
    ("python_version", pa.string()),
    ("specbench_sha", pa.string()),
    ("schema_version", pa.int64()),
    # the 1-minute load average just after the row's decode (None where the platform has none): a
    # load above this process's threads means other processes shared the CPU while it was timed
    ("load_1min", pa.float64()),
    # greedy on a bf16/fp16 target (None otherwise): per output token, the gap between the target's two
    # best logits at the decision that produced it, in ulps of the target's dtype, and the runner-up
    # token there. They tell a rounding near-tie from a real divergence (report.divergence).
    ("margin_ulps_per_token", pa.list_(pa.float32())),
    ("runner_up_per_token", pa.list_(pa.int64())),
]

ROW_COLUMNS: list[str] = [name for name, _ in _ROW_SCHEMA]
ROW_SCHEMA = pa.schema(_ROW_SCHEMA)

# The run settings a resumed run must share with the rows already on disk.
RESUME_KEYS = (
    "target", "drafter", "drafter_config", "checkpoint_hash", "task", "temperature", "top_p", "top_k", "seed",
    "max_new_tokens", "device", "dtype",
)


# --------------------------------------------------------------------------------------------
# environment fingerprint


BASELINE_SUFFIX = ".ar-baseline"  # a run <out>.parquet has its AR baseline in <out stem>.ar-baseline.parquet


def baseline_path(out: Path) -> Path:
    """Where the AR baseline of the run written to ``out`` goes (its run_id is the stem: ``<run_id>.ar-baseline``)."""
    return out.with_name(out.stem + BASELINE_SUFFIX + ".parquet")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        try:
            import torch

            return torch.cuda.get_device_name(torch.device(device))
        except Exception:  # no driver, bad index: the fingerprint must never crash a run
            return "cuda (unknown)"
    return _cpu_model()


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def specbench_sha() -> str:
    """Short git sha of the specbench checkout, ``+dirty`` when it has changes; else "unknown".

    "unknown" also when the package is installed somewhere that merely sits inside some other git
    repository (the checkout's top level must hold this very package). A copy without git (a lent
    GPU machine gets the working tree, not the repository) may declare the commit it was copied from
    in ``SPECBENCH_SHA``; it is then recorded as ``<sha> (declared)``, since nothing here can check it.
    """
    pkg_dir = Path(__file__).resolve().parent
    top = _git(["rev-parse", "--show-toplevel"], pkg_dir)
    sha = None
    if top is not None and Path(top.strip()).resolve() / pkg_dir.name == pkg_dir:
        sha = _git(["rev-parse", "--short", "HEAD"], pkg_dir)
    if not sha or not sha.strip():
        declared = os.environ.get("SPECBENCH_SHA", "").strip()
        return f"{declared} (declared)" if declared else "unknown"
    status = _git(["status", "--porcelain", "--untracked-files=no"], pkg_dir)
    dirty = "+dirty" if status is None or status.strip() else ""
    return sha.strip() + dirty


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def env_fingerprint(device: str, dtype: str) -> dict[str, Any]:
    """The environment fields of a result row (device and dtype included, as given)."""
    import torch
    import transformers

    return {
        "device": device,
        "dtype": dtype,
        "device_name": _device_name(device),
        "cpu_model": _cpu_model(),
        "threads": int(torch.get_num_threads()),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python_version": platform.python_version(),
        "specbench_sha": specbench_sha(),
    }


# --------------------------------------------------------------------------------------------
# writing


def _json_default(obj: Any) -> Any:
    """numpy scalars / arrays and tensors -> plain Python for json.dumps."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _canonical(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return value


def _rows_to_table(rows: list[dict]) -> pa.Table:
    extra = [k for k in (rows[0] if rows else {}) if k not in ROW_SCHEMA.names]
    columns = {name: [r.get(name) for r in rows] for name in ROW_COLUMNS}
    arrays = [pa.array(columns[f.name], type=f.type) for f in ROW_SCHEMA]
    fields = list(ROW_SCHEMA)
    for name in extra:  # keep any extra field the run loop adds, with an inferred type
        arrays.append(pa.array([r.get(name) for r in rows]))
        fields.append(pa.field(name, arrays[-1].type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


# columns added after schema version 1 was first written: older files lack them (read as null)
# what a row given to the writer may leave out
_WRITER_DEFAULTS = {"schema_version": SCHEMA_VERSION, "load_1min": None, "margin_ulps_per_token": None,
                    "runner_up_per_token": None}
# columns that older files lack (read as None)
OPTIONAL_COLUMNS = ("checkpoint_path", "load_1min", "margin_ulps_per_token", "runner_up_per_token")


def _check_columns(table: pa.Table, path: Path, fix: str) -> None:
    missing = [c for c in ROW_COLUMNS if c not in table.column_names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise UserError(
            f"{path} is not a specbench results file (missing columns {', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}); {fix}"
        )


def _read_parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"{path} is not a readable parquet file ({reason}); it is corrupt or truncated: "
            "delete it or rerun that benchmark"
        ) from None


class RunWriter:
    """Persists the rows of one run as each prompt finishes; resumable; atomic final file.

    ``done`` holds the (prompt_id, turn) keys already persisted, ``rows`` the rows themselves (in
    the order they were written). ``add`` takes all turns of one prompt; they are written as one
    batch, and a batch cut short by a crash is dropped as a whole on resume, so a prompt is either
    fully done or not done at all.
    """

    def __init__(self, out_path: Path, resume: bool, flag: str = "--out") -> None:
        self.out_path = Path(out_path)
        self.sidecar = self.out_path.with_name(self.out_path.name + ".partial.jsonl")
        self.rows: list[dict] = []
        self.done: set[tuple[str, int]] = set()
        self._batches = 0

        if self.out_path.suffix != ".parquet":
            raise UserError(
                f"--out {self.out_path} must end in .parquet; e.g. --out {self.out_path}.parquet"
            )
        if self.out_path.is_dir():
            raise UserError(f"--out {self.out_path} is a folder; name a file ending in .parquet")
        check_folder(self.out_path.parent, flag, "results")  # ``flag``: the option that chose the folder

        if not resume:
            if self.out_path.exists():
                raise UserError(
                    f"{self.out_path} exists; pass --resume to continue it or choose another --out"
                )
            if self.sidecar.exists():
                raise UserError(
                    f"{self.sidecar} holds an unfinished run; pass --resume to continue it, "
                    "or delete it / choose another --out"
                )
            return

        if self.out_path.exists():
            table = _read_parquet(self.out_path)
            _check_columns(table, self.out_path, "choose another --out")
            for row in table.to_pylist():
                self._keep(row)
        if self.sidecar.exists():
            for row in self._load_sidecar():
                self._keep(row)

    # -- resume -------------------------------------------------------------------------------

    def _keep(self, row: dict) -> None:
        key = (str(row["prompt_id"]), int(row["turn"]))
        if key in self.done:  # a crash between os.replace and deleting the sidecar
            return
        self.done.add(key)
        self.rows.append(row)

    def _load_sidecar(self) -> list[dict]:
        """Rows of every complete batch; a torn trailing batch (crash) is cut off the file."""
        data = self.sidecar.read_bytes()
        lines = data.split(b"\n")
        # (batch index, batch size, row, byte offset just past the line)
        entries: list[tuple[int, int, dict, int]] = []
        offset = 0
        last_line = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        for i, line in enumerate(lines):
            offset += len(line) + (1 if i < len(lines) - 1 else 0)
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                batch, size, row = int(entry["b"]), int(entry["k"]), entry["row"]
                if size < 1 or not isinstance(row, dict) or not {"prompt_id", "turn"} <= row.keys():
                    raise ValueError("not a result row")
            except (ValueError, KeyError, TypeError):
                if i == last_line:  # truncated by a crash mid-write: drop silently
                    break
                raise UserError(
                    f"{self.sidecar} is corrupt at line {i + 1}; delete it to start the run over"
                ) from None
            entries.append((batch, size, row, offset))

        rows: list[dict] = []
        good_end = 0
        i = 0
        while i < len(entries):
            batch, size, _, _ = entries[i]
            group = entries[i : i + size]
            complete = len(group) == size and all(e[0] == batch and e[1] == size for e in group)
            if not complete:
                if i + len(group) == len(entries) and all(e[0] == batch for e in group):
                    break  # the last batch was cut short by a crash
                raise UserError(
                    f"{self.sidecar} is corrupt (batch {batch} is incomplete); "
                    "delete it to start the run over"
                )
            rows.extend(e[2] for e in group)
            good_end = group[-1][3]
            self._batches = batch + 1
            i += size

        if good_end < len(data):  # cut the torn tail so later appends start on a clean line
            with open(self.sidecar, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())
        return rows

    def check_compatible(self, meta: Mapping[str, Any]) -> None:
        """UserError unless ``meta`` has the same run settings as the rows already persisted."""
        for key in RESUME_KEYS:
            if key not in meta:
                continue
            want = _canonical(meta[key])
            for row in self.rows:
                have = _canonical(row.get(key))
                same = (
                    float(have) == float(want)
                    if key in ("temperature", "top_p") and have is not None and want is not None
                    else have == want
                )
                if not same:
                    raise UserError(
                        f"cannot resume {self.out_path}: it was run with {key}={have!r} but this "
                        f"run has {key}={want!r}; rerun with the same settings or choose another "
                        "--out"
                    )

    # -- writing ------------------------------------------------------------------------------

    def add(self, rows: list[dict]) -> None:
        """Persist all turns of one prompt (flushed and fsynced before returning)."""
        if not rows:
            return
        prepared = []
        for row in rows:
            missing = [c for c in ROW_COLUMNS if c not in row and c not in _WRITER_DEFAULTS]
            if missing:
                raise ValueError(f"result row lacks {', '.join(missing)}")
            row = dict(row)
            for key, value in _WRITER_DEFAULTS.items():  # load_1min: a platform without a load average
                row.setdefault(key, value)
            prepared.append(row)
        batch, size = self._batches, len(prepared)
        payload = b"".join(
            json.dumps({"b": batch, "k": size, "row": row}, default=_json_default).encode() + b"\n"
            for row in prepared
        )
        # round-trip so self.rows holds exactly what a resume would read back
        prepared = [json.loads(line)["row"] for line in payload.splitlines()]
        try:
            with open(self.sidecar, "ab") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            reason = e.strerror or e
            raise UserError(f"cannot write {self.sidecar} ({reason}); check the disk") from None
        self._batches += 1
        for row in prepared:
            self._keep(row)

    def finish(self) -> Path:
        """Write every row to ``out_path`` atomically, then delete the sidecar; returns out_path."""
        table = _rows_to_table(self.rows)
        folder = self.out_path.parent
        fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{self.out_path.name}.", suffix=".tmp")
        tmp = Path(tmp_name)
        try:
            os.chmod(tmp, file_mode(self.out_path))  # mkstemp makes 0600; a result file is as readable as any other
            with os.fdopen(fd, "wb") as f:
                pq.write_table(table, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.out_path)
        except OSError as e:
            reason = e.strerror or e
            raise UserError(f"cannot write {self.out_path} ({reason}); check the disk") from None
        finally:
            tmp.unlink(missing_ok=True)
        try:  # make the rename durable before the sidecar goes away
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass
        self.sidecar.unlink(missing_ok=True)
        return self.out_path


# --------------------------------------------------------------------------------------------
# reading


_NOT_OURS = "pass only files written by specbench run"


def read_results(paths: Iterable[Path]) -> pd.DataFrame:
    """Read result parquet files into one DataFrame (list columns as numpy arrays)."""
    frames = []
    for path in map(Path, paths):
        if not path.is_file():
            raise UserError(f"results file {path} does not exist; check the path or glob")
        table = _read_parquet(path)
        if "schema_version" not in table.column_names:
            _check_columns(table, path, _NOT_OURS)  # raises: a foreign parquet
        versions = set(table.column("schema_version").to_pylist())
        bad = sorted(v for v in versions if v != SCHEMA_VERSION)
        if bad:
            raise UserError(
                f"{path} has results schema_version {bad[0]}; this specbench reads version "
                f"{SCHEMA_VERSION}: use the specbench that wrote it or rerun the benchmark"
            )
        _check_columns(table, path, _NOT_OURS)
        frame = table.to_pandas()
        for col in OPTIONAL_COLUMNS:
            if col not in frame.columns:
                frame[col] = None
        frames.append(frame)
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in ROW_COLUMNS})
    return pd.concat(frames, ignore_index=True)


def expand_globs(patterns: Iterable[str]) -> list[Path]:
    """Paths matching each pattern (a folder means its ``*.parquet``), in order, no duplicates."""
    out: list[Path] = []
    for pattern in patterns:
        if Path(pattern).is_dir():
            matches = sorted(glob.glob(os.path.join(glob.escape(pattern), "*.parquet")))
        elif any(ch in pattern for ch in "*?["):
            matches = sorted(glob.glob(pattern, recursive=True))
        else:
            matches = [pattern] if Path(pattern).exists() else []
        if not matches:
            raise UserError(f"no results file matches {pattern!r}; check the path or glob")
        for m in matches:
            p = Path(m)
            if p not in out:
                out.append(p)
    return out


__all__ = [
    "ROW_COLUMNS",
    "ROW_SCHEMA",
    "SCHEMA_VERSION",
    "RunWriter",
    "env_fingerprint",
    "expand_globs",
    "read_results",
    "specbench_sha",
]
