"""Every derived metric, defined once. Result rows store raw counts and times; ratios live here.

Glossary (one row = one (prompt, turn); one step = one verify forward of the target):

* ``accepted`` (``accepted_per_step``): draft tokens the target accepted in a step, bonus excluded.
* bonus token: the one token the target adds at the end of the accepted path (the recovered token
  when the walk stopped on a rejection). A step commits ``accepted + 1`` tokens.
* ``drafted``: ``tree_size - 1`` per step, the nodes below the root. For a chain drafter this is the
  number of proposed draft tokens; for a tree drafter it counts every node of the tree, so a bushy
  tree has a low acceptance rate even when it is accepted to full depth.
* tau (acceptance length, block efficiency): committed tokens per target forward.
  ``tau_micro = sum(n_new_tokens) / sum(n_steps)`` pools all steps;
  ``tau_macro = mean over rows of n_new_tokens / n_steps``. ``compare`` reports tau micro.
* acceptance rate: ``sum(accepted) / sum(drafted)``.
* per-depth acceptance ``P(accepted >= d)``: the share of steps (pooled over rows) whose accepted
  length reaches d.
* draft share: ``sum(draft_s) / sum(decode_s)``; drafter forwards per step: mean over steps;
  tokens/s: ``sum(n_new_tokens) / sum(decode_s)``.
* seconds per step of a phase (``draft_s``, ``verify_s``, ``other_s``): ``sum(phase) / sum(n_steps)``,
  the mean over all steps pooled.
* speedup: each row is paired with the AR baseline row (drafter ``"ar"``) that has the same
  :data:`PAIR_KEYS` (target, task, prompt, turn, sampling settings, seed, max_new_tokens, device,
  device name, dtype); rows without a partner are left out and ``n_paired`` says how many pairs
  count. Decode speedup uses ``decode_s`` (prefill excluded), end-to-end ``prefill_s + decode_s``.

  - ``*_speedup_sum``: ratio of summed throughput, ``(sum n_new / sum time)`` of the drafter over
    the same for the baseline. With identical outputs (greedy) this equals
    ``sum(baseline time) / sum(drafter time)``.
  - ``*_speedup_mean``: mean over pairs of the per-(prompt, turn) throughput ratio.
* lossless: for greedy (temperature 0) rows with a paired baseline, True iff every paired row's
  ``output_ids`` equal the baseline's; None when there is no greedy pair.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from specbench.errors import UserError
from specbench.results import read_results

BASELINE_DRAFTER = "ar"
MAX_DEPTH = 4

COMPARE_COLUMNS = [
    "target",
    "task",
    "drafter",
    "config",
    "n_prompts",
    "tau",
    "accept_d1",
    "accept_d2",
    "accept_d3",
    "accept_d4",
    "draft_share",
    "decode_speedup_sum",
    "decode_speedup_mean",
    "e2e_speedup_sum",
    "e2e_speedup_mean",
    "lossless",
]

# Run settings beyond (target, task, drafter, config) that make two rows incomparable. compare()
# always groups by them; a setting that takes more than one value in the data becomes an extra
# column right after `config`, so every output row stays distinguishable.
SETTING_COLUMNS = [
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_new_tokens",
    "device",
    "device_name",
    "dtype",
]

# A row and its baseline partner agree on all of these.
PAIR_KEYS = ["target", "task", "prompt_id", "turn", *SETTING_COLUMNS]

FORMATS = ("table", "json", "csv", "markdown")

_SPEEDUP_KEYS = ("decode_speedup_sum", "decode_speedup_mean", "e2e_speedup_sum", "e2e_speedup_mean")
NAN = float("nan")


# --------------------------------------------------------------------------------------------
# per-row-set metrics


def _per_step(df: pd.DataFrame, column: str) -> np.ndarray:
    """All per-step values of ``column`` over the rows, concatenated (int64)."""
    arrays = [np.asarray(v, dtype=np.int64).ravel() for v in df[column]]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den > 0 else NAN


def tau_micro(df: pd.DataFrame) -> float:
    """sum(n_new_tokens) / sum(n_steps): committed tokens per target forward, steps pooled."""
    return _ratio(df["n_new_tokens"].sum(), df["n_steps"].sum())


def tau_macro(df: pd.DataFrame) -> float:
    """Mean over rows of n_new_tokens / n_steps (rows with no step are skipped)."""
    steps = df["n_steps"].to_numpy(dtype=float)
    new = df["n_new_tokens"].to_numpy(dtype=float)
    ok = steps > 0
    return float(np.mean(new[ok] / steps[ok])) if ok.any() else NAN


def acceptance_rate(df: pd.DataFrame) -> float:
    """sum(accepted) / sum(drafted), drafted = tree_size - 1 per step.

    For a chain drafter "drafted" is the number of proposed draft tokens; for a tree drafter it is
    the number of non-root nodes, of which at most one path can be accepted.
    """
    accepted = _per_step(df, "accepted_per_step").sum()
    drafted = (_per_step(df, "tree_size_per_step") - 1).sum()
    return _ratio(accepted, drafted)


def accept_at_least(df: pd.DataFrame, max_depth: int = MAX_DEPTH) -> list[float]:
    """[P(accepted >= d) for d in 1..max_depth] over all steps of all rows (NaN when no step)."""
    accepted = _per_step(df, "accepted_per_step")
    if accepted.size == 0:
        return [NAN] * max_depth
    return [float(np.mean(accepted >= d)) for d in range(1, max_depth + 1)]


def accepted_histogram(df: pd.DataFrame) -> pd.Series:
    """Number of steps per accepted length 0..max (index = accepted drafts, name = "steps")."""
    accepted = _per_step(df, "accepted_per_step")
    counts = np.bincount(accepted) if accepted.size else np.zeros(0, dtype=np.int64)
    return pd.Series(counts, index=pd.RangeIndex(len(counts), name="accepted"), name="steps")


def draft_share(df: pd.DataFrame) -> float:
    """sum(draft_s) / sum(decode_s): the share of decode time spent drafting."""
    return _ratio(df["draft_s"].sum(), df["decode_s"].sum())


def seconds_per_step(df: pd.DataFrame, column: str) -> float:
    """sum(column) / sum(n_steps): seconds per step of one timed phase (draft_s, verify_s, other_s)."""
    return _ratio(df[column].sum(), df["n_steps"].sum())


def draft_s_per_step(df: pd.DataFrame) -> float:
    """sum(draft_s) / sum(n_steps): drafting seconds per step."""
    return seconds_per_step(df, "draft_s")


def drafter_forwards_per_step(df: pd.DataFrame) -> float:
    """Mean over steps of the drafter's forward passes."""
    forwards = _per_step(df, "drafter_forwards_per_step")
    return float(forwards.mean()) if forwards.size else NAN


def tokens_per_s(df: pd.DataFrame) -> float:
    """sum(n_new_tokens) / sum(decode_s): decode throughput (prefill excluded)."""
    return _ratio(df["n_new_tokens"].sum(), df["decode_s"].sum())


# --------------------------------------------------------------------------------------------
# pairing with the AR baseline


def pair_with_baseline(df: pd.DataFrame, baseline: pd.DataFrame | None) -> pd.DataFrame:
    """Rows of ``df`` joined to their baseline partner on :data:`PAIR_KEYS`.

    Baseline columns carry the suffix ``_base``. Duplicate keys (a benchmark run twice) keep their
    first row on both sides, so each (prompt, turn) counts once.
    """
    cols = ["n_new_tokens", "prefill_s", "decode_s", "output_ids"]
    if baseline is None or df.empty or baseline.empty:
        return pd.DataFrame(columns=PAIR_KEYS + cols + [c + "_base" for c in cols])
    left = df.drop_duplicates(PAIR_KEYS, keep="first")[PAIR_KEYS + cols]
    right = baseline.drop_duplicates(PAIR_KEYS, keep="first")[PAIR_KEYS + cols]
    return left.merge(right, on=PAIR_KEYS, how="inner", suffixes=("", "_base"))


def _speedup(pairs: pd.DataFrame, time_cols: list[str]) -> tuple[float, float]:
    n_new = pairs["n_new_tokens"].to_numpy(dtype=float)
    n_base = pairs["n_new_tokens_base"].to_numpy(dtype=float)
    t_new = sum(pairs[c].to_numpy(dtype=float) for c in time_cols)
    t_base = sum(pairs[c + "_base"].to_numpy(dtype=float) for c in time_cols)
    throughput_base = _ratio(n_base.sum(), t_base.sum())
    ratio_sum = _ratio(_ratio(n_new.sum(), t_new.sum()), throughput_base)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_pair = (n_new / t_new) / (n_base / t_base)
    per_pair = per_pair[np.isfinite(per_pair)]
    ratio_mean = float(per_pair.mean()) if per_pair.size else NAN
    return ratio_sum, ratio_mean


def speedups(pairs: pd.DataFrame) -> dict[str, float]:
    """Decode and end-to-end speedups of paired rows (see the module docstring); NaN if no pair."""
    if pairs.empty:
        return {k: NAN for k in _SPEEDUP_KEYS}
    decode_sum, decode_mean = _speedup(pairs, ["decode_s"])
    e2e_sum, e2e_mean = _speedup(pairs, ["prefill_s", "decode_s"])
    return {
        "decode_speedup_sum": decode_sum,
        "decode_speedup_mean": decode_mean,
        "e2e_speedup_sum": e2e_sum,
        "e2e_speedup_mean": e2e_mean,
    }


def lossless(pairs: pd.DataFrame) -> bool | None:
    """True iff every greedy pair has identical output_ids; None when there is no greedy pair."""
    greedy = pairs[pairs["temperature"].astype(float) == 0.0] if not pairs.empty else pairs
    if greedy.empty:
        return None
    return all(
        np.array_equal(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        for a, b in zip(greedy["output_ids"], greedy["output_ids_base"])
    )


# --------------------------------------------------------------------------------------------
# compare


def _check_devices(df: pd.DataFrame, allow_mixed: bool) -> None:
    if allow_mixed or df.empty:
        return
    devices = sorted(df["device"].astype(str).unique())
    if len(devices) > 1:
        raise UserError(
            f"the results mix devices {', '.join(devices)}; speedups are only computed within one "
            "device: pass --allow-mixed to list them together"
        )
    names = sorted(df["device_name"].astype(str).unique())
    if len(names) > 1:
        raise UserError(
            f"the results mix hardware ({'; '.join(names)}); speedups are only computed within one "
            "machine: pass --allow-mixed to list them together"
        )


def compare(df: pd.DataFrame, allow_mixed: bool = False) -> pd.DataFrame:
    """One row per (target, task, drafter, drafter_config) with :data:`COMPARE_COLUMNS`.

    Rows are also grouped by the :data:`SETTING_COLUMNS` (temperature, top_p, top_k, seed,
    max_new_tokens, device, device_name, dtype). When the data holds one value of each, the columns
    are exactly COMPARE_COLUMNS; every setting that varies is inserted as a column right after
    ``config``. ``tau`` is tau micro. A (prompt, turn) run twice with the same settings counts once
    (the first row read). Speedups pair each row with the ``"ar"`` row of the same PAIR_KEYS, so
    they never cross devices or targets, even with ``allow_mixed``; data from more than one
    device (or machine) is refused unless ``allow_mixed``.
    """
    _check_devices(df, allow_mixed)
    if df.empty:
        return pd.DataFrame(columns=COMPARE_COLUMNS)
    varying = [c for c in SETTING_COLUMNS if df[c].nunique(dropna=False) > 1]
    baseline = df[df["drafter"] == BASELINE_DRAFTER]
    group_keys = ["target", "task", "drafter", "drafter_config", *SETTING_COLUMNS]

    records = []
    for key, group in df.groupby(group_keys, sort=True, dropna=False):
        fields = dict(zip(group_keys, key))
        group = group.drop_duplicates(["prompt_id", "turn"], keep="first")
        pairs = pair_with_baseline(group, baseline)
        depth = accept_at_least(group)
        records.append(
            {
                "target": fields["target"],
                "task": fields["task"],
                "drafter": fields["drafter"],
                "config": fields["drafter_config"],
                **{c: fields[c] for c in varying},
                "n_prompts": int(group["prompt_id"].nunique()),
                "tau": tau_micro(group),
                **{f"accept_d{d}": depth[d - 1] for d in range(1, MAX_DEPTH + 1)},
                "draft_share": draft_share(group),
                **speedups(pairs),
                "lossless": lossless(pairs),
            }
        )
    columns = COMPARE_COLUMNS[:4] + varying + COMPARE_COLUMNS[4:]
    out = pd.DataFrame.from_records(records, columns=columns)
    out["lossless"] = out["lossless"].astype(object)
    return out


# --------------------------------------------------------------------------------------------
# formatting


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _plain(value: Any) -> Any:
    """numpy scalars -> Python; NaN -> None (JSON null)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    return None if _missing(value) else value


def _cell(column: str, value: Any) -> str:
    """A human-readable cell for the table and markdown formats."""
    value = _plain(value)
    if value is None:
        return "-"
    if column == "lossless":
        return "yes" if value else "NO"
    if column == "tau":
        return f"{value:.2f}"
    if column.startswith("accept_d"):
        return f"{value:.3f}"
    if column == "draft_share":
        return f"{100 * value:.1f}%"
    if column.endswith(("_speedup_sum", "_speedup_mean")):
        return f"{value:.2f}x"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _numeric(column: str) -> bool:
    return column not in ("target", "task", "drafter", "config", "device", "device_name", "dtype")


def compare_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of a compare() frame as plain dicts (NaN -> None)."""
    return [{c: _plain(v) for c, v in zip(df.columns, row)} for row in df.itertuples(index=False)]


# Short headers for the human table (json / csv / markdown keep the field names).
_TABLE_HEADERS = {
    "n_prompts": "n",
    **{f"accept_d{d}": f"acc>={d}" for d in range(1, MAX_DEPTH + 1)},
    "draft_share": "draft",
    "decode_speedup_sum": "decode\n(sum)",
    "decode_speedup_mean": "decode\n(mean)",
    "e2e_speedup_sum": "e2e\n(sum)",
    "e2e_speedup_mean": "e2e\n(mean)",
}


def compare_table(df: pd.DataFrame, title: str | None = None) -> Table:
    """A rich Table of a compare() frame (short headers; the config column wraps)."""
    table = Table(title=title)
    for column in df.columns:
        table.add_column(
            _TABLE_HEADERS.get(column, column),
            justify="right" if _numeric(column) else "left",
            no_wrap=column != "config",
            overflow="fold" if column == "config" else "ellipsis",
            min_width=12 if column == "config" else None,
            max_width=48 if column == "config" else None,
        )
    for row in df.itertuples(index=False):
        table.add_row(*(_cell(c, v) for c, v in zip(df.columns, row)))
    return table


def _markdown(df: pd.DataFrame) -> str:
    def escape(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(escape(c) for c in df.columns) + " |",
        "|" + "|".join("---:" if _numeric(c) else ":---" for c in df.columns) + "|",
    ]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(escape(_cell(c, v)) for c, v in zip(df.columns, row)) + " |")
    return "\n".join(lines) + "\n"


def format_compare(df: pd.DataFrame, fmt: str, width: int = 1000) -> str:
    """A compare() frame as text: ``table`` (rich, plain text), ``json``, ``csv`` or ``markdown``.

    ``width`` bounds the table; the default lets it take its natural width (config wraps at 48).
    """
    if fmt == "json":
        return json.dumps(compare_records(df), indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "markdown":
        return _markdown(df)
    if fmt == "table":
        console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
        console.print(compare_table(df))
        return console.file.getvalue()
    raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


# --------------------------------------------------------------------------------------------
# end of a run


def run_summary(
    rows_df: pd.DataFrame | list[dict], baseline_df: pd.DataFrame | None
) -> dict[str, Any]:
    """The end-of-run numbers of one run; values that cannot be computed are None.

    Keys: n_prompts, tau_micro, tau_macro, acceptance_rate, draft_share, tokens_per_s,
    drafter_forwards_per_step, decode_speedup_sum/mean, e2e_speedup_sum/mean, n_paired, lossless.
    """
    df = rows_df if isinstance(rows_df, pd.DataFrame) else pd.DataFrame(rows_df)
    if df.empty:
        summary: dict[str, Any] = {"n_prompts": 0, "tau_micro": None, "tau_macro": None}
        summary.update(dict.fromkeys(["acceptance_rate", "draft_share", "tokens_per_s"]))
        summary.update(dict.fromkeys(["drafter_forwards_per_step", *_SPEEDUP_KEYS]))
        summary.update({"n_paired": 0, "lossless": None})
        return summary
    pairs = pair_with_baseline(df, baseline_df)
    summary = {
        "n_prompts": int(df["prompt_id"].nunique()),
        "tau_micro": tau_micro(df),
        "tau_macro": tau_macro(df),
        "acceptance_rate": acceptance_rate(df),
        "draft_share": draft_share(df),
        "tokens_per_s": tokens_per_s(df),
        "drafter_forwards_per_step": drafter_forwards_per_step(df),
        **speedups(pairs),
        "n_paired": int(len(pairs)),
        "lossless": lossless(pairs),
    }
    return {k: _plain(v) for k, v in summary.items()}


_BASELINE_MATCH = ("target", "task", "temperature", "seed", "device", "dtype", "max_new_tokens")
_BASELINE_MATCH_OPTIONAL = ("top_p", "top_k", "device_name")


def find_baseline(results_dir: Path, meta: Mapping[str, Any]) -> pd.DataFrame | None:
    """AR baseline rows in ``results_dir/*.parquet`` for the run described by ``meta``, or None.

    ``meta`` holds target, task, temperature, seed, device, dtype, max_new_tokens (matched
    exactly; top_p, top_k and device_name too when present) and ``keys``: the run's
    (prompt_id, turn) pairs, either a set or a mapping (prompt_id, turn) -> prompt_ids; with a
    mapping a baseline row only counts when its prompt_ids are identical. Newer files win when
    several hold the same key. Returns one row per key, or None unless every key is covered.
    Unreadable files are skipped silently.
    """
    keys = meta["keys"]
    want_ids = keys if isinstance(keys, Mapping) else None
    wanted = [(str(p), int(t)) for p, t in keys]
    if not wanted:
        return None
    if want_ids is not None:
        want_ids = {(str(p), int(t)): list(ids) for (p, t), ids in want_ids.items()}
    wanted_set = set(wanted)
    match = [*_BASELINE_MATCH, *(k for k in _BASELINE_MATCH_OPTIONAL if k in meta)]

    def age(path: Path) -> tuple[float, str]:
        try:
            return (path.stat().st_mtime, path.name)
        except OSError:
            return (0.0, path.name)

    files = sorted(Path(results_dir).glob("*.parquet"), key=age)
    found: dict[tuple[str, int], dict] = {}
    for path in reversed(files):  # newest first
        try:
            df = read_results([path])
        except Exception:  # unreadable, foreign or another schema: not a baseline
            continue
        mask = df["drafter"] == BASELINE_DRAFTER
        for col in match:
            if col in ("temperature", "top_p"):
                mask &= df[col].astype(float) == float(meta[col])
            else:
                mask &= df[col] == meta[col]
        for row in df[mask].to_dict("records"):
            key = (str(row["prompt_id"]), int(row["turn"]))
            if key in found or key not in wanted_set:
                continue
            if want_ids is not None and [int(x) for x in row["prompt_ids"]] != want_ids[key]:
                continue
            found[key] = row
    if any(k not in found for k in wanted):
        return None
    return pd.DataFrame([found[k] for k in wanted]).reset_index(drop=True)
