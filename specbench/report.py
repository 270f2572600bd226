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
* divergence: when lossless is False, ``"near-tie"`` if every differing pair first differs at a
  rounding near-tie of a bf16/fp16 target, else ``"real"`` (:func:`divergence`); None otherwise. A
  near-tie: at the first differing token each run's token is the other's recorded runner-up and both
  recorded top-2 margins are at most :data:`NEAR_TIE_ULPS` ulps of the target's dtype. float32 rows
  record no margins, so a float32 difference is always real. Tables show such a row's lossless cell
  as ``tie``: not token-for-token equal, and nothing but rounding explains it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import math
import re
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich import box
from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from specbench.errors import UserError
from specbench.results import BASELINE_SUFFIX, read_results

BASELINE_DRAFTER = "ar"

# Run settings beyond (target, task, drafter, config, checkpoint) that make two rows incomparable.
# compare() always groups by them; a setting that takes more than one value in the data becomes an
# extra column after the key columns, so every output row stays distinguishable.
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


TAU_LEVEL = 0.95  # the confidence level of compare()'s tau_lo / tau_hi
TAU_RESAMPLES = 2000


def _prompt_totals(df: pd.DataFrame) -> pd.DataFrame:
    """New tokens and steps summed per prompt (a prompt's turns together), sorted by prompt id."""
    return df.groupby("prompt_id", sort=True)[["n_new_tokens", "n_steps"]].sum()


def _resampled_tau(totals: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """Pooled tau of each resample: ``totals`` holds (new tokens, steps) per prompt, ``picks`` prompt indices."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return totals[picks, 0].sum(axis=1) / totals[picks, 1].sum(axis=1)


def _percentile_interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` percentile interval of the finite ``draws`` (NaN, NaN when there are none)."""
    draws = draws[np.isfinite(draws)]
    if not draws.size:
        return NAN, NAN
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def tau_interval(df: pd.DataFrame, level: float = TAU_LEVEL, resamples: int = TAU_RESAMPLES,
                 seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap interval for :func:`tau_micro`: the prompts are resampled with
    replacement (all turns of a prompt together, since they share a conversation) and tau is
    pooled over each resample. Fixed ``seed``: the same rows give the same interval. NaN, NaN with
    fewer than two prompts. Each resample's tau is a step-weighted mean of per-prompt taus, so the
    interval lies within their range; it says how far the prompt sample alone can move tau, not how
    a different task or target would."""
    totals = _prompt_totals(df).to_numpy(dtype=float)
    if len(totals) < 2:
        return NAN, NAN
    picks = np.random.default_rng(seed).integers(0, len(totals), size=(resamples, len(totals)))
    return _percentile_interval(_resampled_tau(totals, picks), level)


def tau_ratio_interval(cells: list[tuple[pd.DataFrame, pd.DataFrame]], level: float = TAU_LEVEL,
                       resamples: int = TAU_RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """The mean over ``cells`` of tau(second) / tau(first), with a paired percentile-bootstrap interval:
    each cell is a (first, second) pair of runs on the same prompts (two heads, one setting and task);
    a resample draws each cell's prompts with replacement, the same draw for both runs (a prompt's
    turns together), so what the prompts share cancels and only the heads' difference is left.
    Prompts that only one run has are left out. (mean ratio, lo, hi); NaNs when no cell has two
    shared prompts (those cells still count in the mean, at their full-sample ratio)."""
    rng = np.random.default_rng(seed)
    point, draws, resampled = [], [], False
    for first, second in cells:
        a, b = _prompt_totals(first), _prompt_totals(second)
        shared = a.index.intersection(b.index)
        a, b = (x.loc[shared].to_numpy(dtype=float) for x in (a, b))  # columns: new tokens, steps
        ratio = _ratio(_ratio(b[:, 0].sum(), b[:, 1].sum()), _ratio(a[:, 0].sum(), a[:, 1].sum()))
        point.append(ratio)
        if len(shared) < 2:
            draws.append(np.full(resamples, ratio))
            continue
        resampled = True
        picks = rng.integers(0, len(shared), size=(resamples, len(shared)))
        with np.errstate(divide="ignore", invalid="ignore"):
            draws.append(_resampled_tau(b, picks) / _resampled_tau(a, picks))
    if not point:
        return NAN, NAN, NAN
    mean = float(np.mean(point))
    if not resampled:
        return mean, NAN, NAN
    return (mean, *_percentile_interval(np.mean(draws, axis=0), level))


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


def accept_at_least(df: pd.DataFrame, max_depth: int | None = None) -> list[float]:
    """[P(accepted >= d) for d in 1..max_depth] over all steps of all rows (NaN when no step).

    ``max_depth`` defaults to the deepest accepted length in ``df`` (at least 1).
    """
    accepted = _per_step(df, "accepted_per_step")
    if max_depth is None:
        max_depth = max(1, int(accepted.max())) if accepted.size else 1
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


def pair_with_baseline(df: pd.DataFrame, baseline: pd.DataFrame | None, keys: list[str] | None = None) -> pd.DataFrame:
    """Rows of ``df`` joined to their baseline partner on ``keys`` (default :data:`PAIR_KEYS`).

    A run whose own baseline (``<run_id>.ar-baseline``, measured interleaved with it) is among
    ``baseline`` pairs with that one only; a run without one (a sweep's cells share the baseline its
    first cell measured, and files written before ``run_id``) pairs with the first baseline row of
    its keys. So no speedup depends on the order of the files when two runs' baselines cover the same
    prompts. Baseline columns carry the suffix ``_base``; ``run_id_base`` names the baseline run each
    pair divides by. Duplicate keys in ``df`` (a benchmark run twice) keep their first row, so each
    (prompt, turn) counts once.
    """
    keys = PAIR_KEYS if keys is None else keys
    cols = ["n_new_tokens", "prefill_s", "decode_s", "output_ids", *MARGIN_COLUMNS]
    out_cols = keys + cols + ["run_id"] + [c + "_base" for c in cols] + ["run_id_base"]
    if baseline is None or df.empty or baseline.empty:
        return pd.DataFrame(columns=out_cols)

    def side(frame: pd.DataFrame, unique: list[str]) -> pd.DataFrame:
        missing = [c for c in [*MARGIN_COLUMNS, "run_id"] if c not in frame.columns]  # rows built before they existed
        frame = frame.assign(**dict.fromkeys(missing)).drop_duplicates(unique, keep="first")
        return frame[keys + cols + ["run_id"]].reset_index(drop=True)

    mine = side(df, keys)
    base = side(baseline, keys + ["run_id"])
    present = set(base["run_id"].dropna())
    own = mine["run_id"].map(lambda r: f"{r}{BASELINE_SUFFIX}" if isinstance(r, str) and f"{r}{BASELINE_SUFFIX}" in present else None)
    base = base.rename(columns={c: c + "_base" for c in cols + ["run_id"]})
    with_own = mine[own.notna()].assign(run_id_base=own[own.notna()]).reset_index()
    pairs_own = with_own.merge(base, on=keys + ["run_id_base"], how="inner")
    pairs_first = mine[own.isna()].reset_index().merge(base.drop_duplicates(keys, keep="first"), on=keys, how="inner")
    parts = [p for p in (pairs_own, pairs_first) if not p.empty]
    if not parts:
        return pd.DataFrame(columns=out_cols)
    return pd.concat(parts, ignore_index=True).sort_values("index", kind="stable").reset_index(drop=True)[out_cols]


# A greedy output depends on the target, prompt, settings and dtype, not on the machine that ran it.
OUTPUT_KEYS = [k for k in PAIR_KEYS if k not in ("device", "device_name")]


def pair_outputs(df: pd.DataFrame, baseline: pd.DataFrame | None, pairs: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """``pairs`` (same-machine, from :func:`pair_with_baseline`) plus, for each (prompt, turn) of
    ``df`` that has no partner there, an AR baseline row from another machine with the same
    :data:`OUTPUT_KEYS`; how many pairs came from another machine; and how many (prompt, turn) were
    left out because the AR outputs of those machines differ from each other (then no single AR output
    is the reference, and which one a row met would depend on the order of the files). Only for output
    checks (lossless, divergence): timings never pair across machines."""
    if baseline is None or df.empty or baseline.empty:
        return pairs, 0, 0
    turns = ["prompt_id", "turn"]
    covered = pd.MultiIndex.from_frame(pairs[turns]) if not pairs.empty else pd.MultiIndex.from_tuples([], names=turns)
    unpaired = df[~pd.MultiIndex.from_frame(df[turns]).isin(covered)]
    elsewhere = pair_with_baseline(unpaired, baseline, keys=OUTPUT_KEYS)
    if elsewhere.empty:
        return pairs, 0, 0
    candidates = baseline.merge(elsewhere[OUTPUT_KEYS].drop_duplicates(), on=OUTPUT_KEYS)
    outputs = candidates["output_ids"].map(_output_key)
    n_outputs = outputs.groupby([candidates[k] for k in OUTPUT_KEYS], dropna=False).nunique()
    ambiguous = pd.MultiIndex.from_frame(elsewhere[OUTPUT_KEYS]).isin(n_outputs[n_outputs > 1].index)
    elsewhere = elsewhere[~ambiguous]
    parts = [p for p in (pairs, elsewhere) if not p.empty]
    merged = pd.concat(parts, ignore_index=True) if parts else pairs
    return merged, len(elsewhere), int(ambiguous.sum())


def cross_machine_note(frame: pd.DataFrame) -> str | None:
    """A one-line note when :func:`compare`'s lossless column used AR outputs from another machine, or
    left (prompt, turn) out because the other machines' AR outputs disagree."""
    n = int(frame.attrs.get("cross_machine_pairs", 0))
    split = int(frame.attrs.get("cross_machine_split", 0))
    if not n and not split:
        return None
    parts = []
    if n:
        parts.append(f"lossless checks {n} (prompt, turn) pair{'s' if n != 1 else ''} against AR outputs from another "
                     "machine (same target, settings and dtype); a float32 difference there can be arithmetic, not the drafter")
    if split:
        parts.append(f"{split} (prompt, turn) left out of lossless: the AR outputs of the other machines differ there, "
                     "so none is the reference (run AR on the drafter's machine)")
    return "; ".join(parts)


def baseline_partners(baseline: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``baseline`` that ``pairs`` (from :func:`pair_with_baseline`) divide by."""
    if pairs.empty or baseline.empty:
        return baseline.iloc[:0]
    if "run_id" not in baseline.columns or pairs["run_id_base"].isna().any():
        return baseline.merge(pairs[PAIR_KEYS].drop_duplicates(), on=PAIR_KEYS)
    keys = pairs[PAIR_KEYS + ["run_id_base"]].drop_duplicates().rename(columns={"run_id_base": "run_id"})
    return baseline.merge(keys, on=PAIR_KEYS + ["run_id"])


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


def _greedy(pairs: pd.DataFrame) -> pd.DataFrame:
    return pairs[pairs["temperature"].astype(float) == 0.0] if not pairs.empty else pairs


def _output_key(ids: Any) -> tuple[int, ...]:
    """One output's token ids as a hashable tuple of ints, whatever array or list type the row stored them in."""
    return tuple(np.asarray(ids, dtype=np.int64).tolist())


def _same_output(a: Any, b: Any) -> bool:
    return _output_key(a) == _output_key(b)


def lossless(pairs: pd.DataFrame) -> bool | None:
    """True iff every greedy pair has identical output_ids; None when there is no greedy pair."""
    greedy = _greedy(pairs)
    if greedy.empty:
        return None
    return all(_same_output(a, b) for a, b in zip(greedy["output_ids"], greedy["output_ids_base"]))


MARGIN_COLUMNS = ["margin_ulps_per_token", "runner_up_per_token"]
# the widest top-2 gap, in ulps of the target's dtype, that still counts as a rounding near-tie
NEAR_TIE_ULPS = 4.0


def _near_tie(row: Any, max_ulps: float) -> bool:
    """Whether one differing greedy pair first differs at a near-tie (see the module docstring)."""
    out, base = np.asarray(row.output_ids, dtype=np.int64), np.asarray(row.output_ids_base, dtype=np.int64)
    n = min(len(out), len(base))
    differ = np.flatnonzero(out[:n] != base[:n])
    if not differ.size:  # one output is a prefix of the other: a real difference
        return False
    i = int(differ[0])
    sides = []
    for suffix in ("", "_base"):
        margins, runners = getattr(row, "margin_ulps_per_token" + suffix), getattr(row, "runner_up_per_token" + suffix)
        if _missing(margins) or _missing(runners) or len(margins) <= i or len(runners) <= i:
            return False
        sides.append((float(margins[i]), int(runners[i])))
    (m_out, r_out), (m_base, r_base) = sides
    return r_out == base[i] and r_base == out[i] and max(m_out, m_base) <= max_ulps


def divergence(pairs: pd.DataFrame, max_ulps: float = NEAR_TIE_ULPS) -> str | None:
    """``"near-tie"`` or ``"real"`` when some greedy pair's outputs differ (module docstring), else None."""
    differing = [row for row in _greedy(pairs).itertuples(index=False) if not _same_output(row.output_ids, row.output_ids_base)]
    if not differing:
        return None
    return "near-tie" if all(_near_tie(row, max_ulps) for row in differing) else "real"


# --------------------------------------------------------------------------------------------
# compare

# Result columns that may name the checkpoint a drafter loaded. Older files lack them or leave them
# empty. A row's checkpoint identity is its first non-empty hash column, else its path.
CHECKPOINT_HASH_COLUMNS = ("checkpoint_sha256", "checkpoint_hash")
CHECKPOINT_PATH_COLUMN = "checkpoint_path"

# The columns of a compare() frame, in order: the keys (``setting`` is the short label of the
# drafter options that differ from its defaults, ``config`` the full JSON), ``checkpoint`` and
# ``checkpoint_path`` when any row names a checkpoint, each SETTING_COLUMN that varies, then the
# values with one ``accept_d{d}`` per depth (see compare_columns).
KEY_COLUMNS = ["target", "task", "drafter", "setting", "config"]
CHECKPOINT_COLUMNS = ["checkpoint", "checkpoint_path"]


def accept_columns(depths: int) -> list[str]:
    """``accept_d1 .. accept_d{depths}``: P(accepted >= d) per depth."""
    return [f"accept_d{d}" for d in range(1, depths + 1)]


def compare_columns(depths: int, checkpoint: bool = False, varying: tuple[str, ...] | list[str] = (),
                    load: bool = False) -> list[str]:
    """The columns of a compare() frame with ``depths`` per-depth columns (``cpu_shared`` last when
    ``load``: the files sampled the machine's load)."""
    return [
        *KEY_COLUMNS,
        *(CHECKPOINT_COLUMNS if checkpoint else []),
        *varying,
        "n_prompts",
        "tau",
        "tau_lo",
        "tau_hi",
        *accept_columns(depths),
        "draft_share",
        *_SPEEDUP_KEYS,
        "lossless",
        "divergence",
        *(["cpu_shared"] if load else []),
    ]


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


def _text(value: Any) -> str:
    """A cell as stripped text; '' for None, NaN and NA."""
    if value is None:
        return ""
    try:
        if pd.isna(value):
            return ""
    except (TypeError, ValueError):  # arrays and other non-scalars
        pass
    return str(value).strip()


def checkpoint_identity(df: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per row: (sha256 of the checkpoint loaded, its path), each '' when the files do not say."""
    hashes = pd.Series("", index=df.index, dtype=object)
    for column in reversed(CHECKPOINT_HASH_COLUMNS):  # the first column listed wins
        if column in df.columns:
            values = df[column].map(_text)
            hashes = values.where(values != "", hashes)
    if CHECKPOINT_PATH_COLUMN in df.columns:
        paths = df[CHECKPOINT_PATH_COLUMN].map(_text)
    else:
        paths = pd.Series("", index=df.index, dtype=object)
    return hashes, paths


def deepest_accepted(df: pd.DataFrame) -> int:
    """The largest number of drafts accepted in one step over all rows (0 with no step)."""
    accepted = _per_step(df, "accepted_per_step") if not df.empty else np.zeros(0, dtype=np.int64)
    return int(accepted.max()) if accepted.size else 0


def natural_key(text: str) -> tuple:
    """Sort key that orders ``budget=16`` before ``budget=128``."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part)


def compare(df: pd.DataFrame, allow_mixed: bool = False, depths: int | None = None,
            outputs_across_machines: bool = False) -> pd.DataFrame:
    """One row per (target, task, drafter, drafter_config, checkpoint) with :func:`compare_columns`.

    Rows are also grouped by the :data:`SETTING_COLUMNS` (temperature, top_p, top_k, seed,
    max_new_tokens, device, device_name, dtype); every setting that varies in the data becomes a
    column after the keys. Two runs of one drafter with different checkpoints (``checkpoint_sha256``
    or ``checkpoint_hash``, else ``checkpoint_path``, when the files carry them) never share a row;
    their ``setting`` labels then end in ``@`` and a short hash. ``cpu_shared`` (only when some row
    sampled the load, ``load_1min``) is True where the row's runs or their paired AR baseline were
    timed while other processes shared the CPU (:func:`cpu_shared`), so its speedups are unreliable;
    None where none of those rows sampled the load. ``setting`` lists the options that
    differ from the drafter's defaults (:func:`setting_labels`), ``config`` is the full JSON.

    ``tau`` is tau micro. ``accept_d1 .. accept_dK`` run to the deepest accepted depth in the data
    (at least 1), or to ``depths`` when that is smaller. A (prompt, turn) run twice with the same
    settings counts once (the first row read). Speedups pair each row with the ``"ar"`` row of the
    same PAIR_KEYS, its own run's when that is among the inputs (:func:`pair_with_baseline`), so
    they never cross devices or targets, even with ``allow_mixed``; data from
    more than one device (or machine) is refused unless ``allow_mixed``.

    ``outputs_across_machines`` (implies ``allow_mixed``): a greedy row with no AR baseline on its own
    machine checks ``lossless`` and ``divergence`` against one from another machine with the same
    :data:`OUTPUT_KEYS` (:func:`pair_outputs`); ``attrs["cross_machine_pairs"]`` counts those pairs and
    ``attrs["cross_machine_split"]`` the (prompt, turn) left out because the other machines' AR outputs differ.
    Speedups still pair within one machine only.

    Rows come ordered by target, task, the settings that vary, then drafter with the AR baseline
    first, then setting (``default`` first).
    The frame is plain: callers may add columns before formatting it. ``attrs["shared"]`` holds the
    target and settings that are the same on every row (for a table title).
    """
    if depths is not None and depths < 1:
        raise UserError(f"--depths {depths}: give 1 or more (the deepest per-depth acceptance shown)")
    _check_devices(df, allow_mixed or outputs_across_machines)
    n_depths = max(1, deepest_accepted(df))
    if depths is not None:
        n_depths = min(n_depths, depths)
    if df.empty:
        out = pd.DataFrame(columns=compare_columns(n_depths))
        out.attrs["shared"] = {}
        out.attrs["cross_machine_pairs"] = out.attrs["cross_machine_split"] = 0
        return out

    hashes, paths = checkpoint_identity(df)
    df = df.assign(_ckpt=hashes.where(hashes != "", paths), _ckpt_hash=hashes, _ckpt_path=paths)
    with_checkpoint = bool((df["_ckpt"] != "").any())
    with_load = "load_1min" in df.columns and bool(df["load_1min"].notna().any())
    varying = [c for c in SETTING_COLUMNS if df[c].nunique(dropna=False) > 1]
    shared = {c: _plain(df[c].iloc[0]) for c in ["target", *SETTING_COLUMNS] if c not in varying and df[c].nunique(dropna=False) == 1}
    baseline = df[df["drafter"] == BASELINE_DRAFTER]
    group_keys = ["target", "task", "drafter", "drafter_config", "_ckpt", *SETTING_COLUMNS]
    groups = [(dict(zip(group_keys, key)), group) for key, group in df.groupby(group_keys, sort=False, dropna=False)]
    labels = setting_labels((str(f["drafter"]), _text(f["drafter_config"]), f["_ckpt"]) for f, _ in groups)

    records = []
    cross_machine = cross_split = 0
    for fields, group in groups:
        group = group.drop_duplicates(["prompt_id", "turn"], keep="first")
        pairs = pair_with_baseline(group, baseline)
        output_pairs, n_elsewhere, n_split = pair_outputs(group, baseline, pairs) if outputs_across_machines else (pairs, 0, 0)
        cross_machine += n_elsewhere
        cross_split += n_split
        depth = accept_at_least(group, n_depths)
        load = {}
        if with_load:  # this row's runs and the baseline rows its speedups divide by
            load = {"cpu_shared": cpu_shared(*_load_peak(group, baseline_partners(baseline, pairs)))}
        checkpoint = {}
        if with_checkpoint:
            chk_paths = sorted({p for p in group["_ckpt_path"] if p})
            checkpoint = {
                "checkpoint": group["_ckpt_hash"].iloc[0] or None,
                "checkpoint_path": "; ".join(chk_paths) or None,
            }
        records.append(
            {
                "target": fields["target"],
                "task": fields["task"],
                "drafter": fields["drafter"],
                "setting": labels[(str(fields["drafter"]), _text(fields["drafter_config"]), fields["_ckpt"])],
                "config": fields["drafter_config"],
                **checkpoint,
                **{c: fields[c] for c in varying},
                "n_prompts": int(group["prompt_id"].nunique()),
                "tau": tau_micro(group),
                **dict(zip(("tau_lo", "tau_hi"), tau_interval(group))),
                **{f"accept_d{d}": depth[d - 1] for d in range(1, n_depths + 1)},
                "draft_share": draft_share(group),
                **speedups(pairs),
                "lossless": lossless(output_pairs),
                "divergence": divergence(output_pairs),
                **load,
                "_ckpt": fields["_ckpt"],
            }
        )

    def order(rec: dict) -> tuple:
        return (
            natural_key(_text(rec["target"])),
            natural_key(_text(rec["task"])),
            *(natural_key(_text(rec[c])) for c in varying),  # each set of comparable rows together
            rec["drafter"] != BASELINE_DRAFTER,
            natural_key(_text(rec["drafter"])),
            rec["setting"] != "default",
            natural_key(rec["setting"]),
            rec["_ckpt"],
        )

    records.sort(key=order)
    columns = compare_columns(n_depths, with_checkpoint, varying, with_load)
    out = pd.DataFrame.from_records(records, columns=columns)
    out["lossless"] = out["lossless"].astype(object)
    out["divergence"] = out["divergence"].astype(object).where(out["divergence"].notna(), None)
    if with_load:
        out["cpu_shared"] = out["cpu_shared"].astype(object).where(out["cpu_shared"].notna(), None)
    for column in CHECKPOINT_COLUMNS if with_checkpoint else []:  # None, not NaN, where unknown
        out[column] = out[column].astype(object).where(out[column].notna(), None)
    out.attrs["shared"] = shared
    out.attrs["cross_machine_pairs"] = cross_machine
    out.attrs["cross_machine_split"] = cross_split
    return out


# --------------------------------------------------------------------------------------------
# setting labels

_NO_DEFAULT = object()


@functools.lru_cache(maxsize=None)
def _drafter_defaults(name: str) -> tuple[tuple[str, Any], ...] | None:
    """(option, default) of an installed drafter's Config, in declaration order; None when the
    drafter is not installed or its class does not load."""
    try:
        from specbench.drafter import available_drafters

        entry = available_drafters().get(name)
        if entry is None:
            return None
        config_cls = entry.load().Config
        fields = dataclasses.fields(config_cls)
    except Exception:  # noqa: BLE001 - a missing or broken plugin falls back to the JSON label
        return None
    out = []
    for f in fields:
        if f.default is not dataclasses.MISSING:
            out.append((f.name, f.default))
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out.append((f.name, f.default_factory()))  # type: ignore[misc]
        else:
            out.append((f.name, _NO_DEFAULT))
    return tuple(out)


def _canonical(value: Any) -> Any:
    """A value as JSON would store it (tuples -> lists), so defaults compare with stored configs."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)


def option_text(value: Any) -> str:
    """A short text for one option value: a path by its last part, floats by %g."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(option_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    text = str(value)
    if "/" in text or "\\" in text:
        text = re.split(r"[\\/]", text.rstrip("/\\"))[-1] or text
    return text


def _parse_options(config: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(config) if config else {}
    except (TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _label(options: dict[str, Any], keys: list[str]) -> str:
    parts = [f"{k}={option_text(options[k])}" for k in keys if k in options]
    return ", ".join(parts) if parts else "default"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:7]


def _checkpoint_tags(identities: list[str]) -> dict[str, str]:
    """A short distinct tag per checkpoint identity: 7 hex digits of a hash, or a path's last part."""
    tags = {i: i[:7] if re.fullmatch(r"[0-9a-fA-F]{7,}", i) else option_text(i) for i in identities}
    if len(set(tags.values())) < len(tags):
        tags = {i: _short_hash(i) for i in identities}
    return tags


def setting_labels(items: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str, str], str]:
    """A short label per (drafter, config JSON, checkpoint identity).

    The label lists the options whose value differs from the default of the drafter's ``Config``
    (``budget=32, tree=marginal``; a path by its last part), in the Config's order, or ``default``.
    When the drafter is not installed, the options that differ between its configs in ``items``
    are listed instead (all of them when there is only one config). Distinct configs always get
    distinct labels: should two read alike (two paths with one last part), ``#`` and a hash of
    the config follow. When a drafter appears with more than one checkpoint, each label of a row
    with a checkpoint ends in ``@`` and a short tag of it (7 hex digits of its sha256).
    """
    by_drafter: dict[str, set[tuple[str, str]]] = {}
    for drafter, config, ckpt in items:
        by_drafter.setdefault(drafter, set()).add((config, ckpt))
    out: dict[tuple[str, str, str], str] = {}
    for drafter, pairs in by_drafter.items():
        configs = sorted({c for c, _ in pairs})
        parsed = {c: _parse_options(c) for c in configs}
        defaults = _drafter_defaults(drafter)
        base: dict[str, str] = {}
        if defaults is not None:
            default_of = dict(defaults)
            for c in configs:
                options = parsed[c]
                if options is None:
                    base[c] = c or "default"
                    continue
                keys = [k for k, _ in defaults] + sorted(k for k in options if k not in default_of)
                differ = [
                    k for k in keys
                    if k in options and (default_of.get(k, _NO_DEFAULT) is _NO_DEFAULT
                                         or _canonical(options[k]) != _canonical(default_of[k]))
                ]
                base[c] = _label(options, differ)
        else:
            dicts = [parsed[c] or {} for c in configs]
            keys = sorted({k for d in dicts for k in d})
            if len(configs) > 1:
                keys = [k for k in keys if len({json.dumps(d.get(k, "<unset>"), sort_keys=True, default=str) for d in dicts}) > 1]
            for c in configs:
                base[c] = _label(parsed[c], keys) if parsed[c] is not None else (c or "default")
        seen: dict[str, int] = {}
        for label in base.values():
            seen[label] = seen.get(label, 0) + 1
        for c in configs:
            if seen[base[c]] > 1:
                base[c] = f"{base[c]} #{_short_hash(c)}"
        identities = {k for _, k in pairs}
        tags = _checkpoint_tags(sorted(i for i in identities if i)) if len(identities) > 1 else {}
        for config, ckpt in pairs:
            label = base[config]
            if ckpt in tags:
                label = f"{label} @{tags[ckpt]}"
            out[(drafter, config, ckpt)] = label
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
    if column == "cpu_shared":
        return "SHARED" if value else "idle"
    if column in ("tau", "tau_lo", "tau_hi"):
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


_TEXT_COLUMNS = {"target", "task", "drafter", "setting", "config", "checkpoint", "checkpoint_path", "device", "device_name", "dtype"}


def _numeric(column: str) -> bool:
    return column not in _TEXT_COLUMNS


def compare_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of a compare() frame as plain dicts (NaN -> None)."""
    return [{c: _plain(v) for c, v in zip(df.columns, row)} for row in df.itertuples(index=False)]


# The human table. ACCEPT is its compact per-depth column: P(accepted >= d) in percent for
# d = 1..K, joined by "/", trailing zeros left out (the accept_d* fields hold the numbers).
ACCEPT = "accept"

# Column headers in the table (json / csv / markdown keep the field names). A column added to a
# compare() frame by a caller shows under its own name unless it is given a header here.
TABLE_HEADERS = {
    "n_prompts": "prompts",
    "tau_lo": "tau\n95% lo",
    "tau_hi": "tau\n95% hi",
    "draft_share": "draft\nshare",
    "decode_speedup_sum": "decode\nspeedup",
    "decode_speedup_mean": "decode\n(mean)",
    "e2e_speedup_sum": "e2e\nspeedup",
    "e2e_speedup_mean": "e2e\n(mean)",
    "temperature": "T",
    "top_p": "top-p",
    "top_k": "top-k",
    "max_new_tokens": "max\nnew",
    "device_name": "machine",
    "checkpoint_path": "checkpoint\npath",
    "cpu_shared": "CPU",
}

# The default table: the key columns (never hidden; target only when there is more than one, then
# every SETTING_COLUMN the frame has), then these value columns. When the terminal is too narrow,
# HIDE_FIRST are dropped in this order and named under the table; if the keys and the remaining
# values still do not fit, each row is printed as one record instead. A caller that adds a column
# to the frame and wants it in the default table appends it to both lists.
TABLE_VALUES = ["n_prompts", "tau", ACCEPT, "draft_share", "decode_speedup_sum", "lossless"]
HIDE_FIRST = ["draft_share", "n_prompts", ACCEPT]

# Words for --columns / --sort besides the field names (the table's headers).
_ALIASES = {
    "prompts": "n_prompts",
    "draft": "draft_share",
    "draft share": "draft_share",
    "speedup": "decode_speedup_sum",
    "decode speedup": "decode_speedup_sum",
    "acc": ACCEPT,
    "p(acc)": ACCEPT,
}


def _depth_columns(df: pd.DataFrame) -> list[str]:
    return sorted((c for c in df.columns if re.fullmatch(r"accept_d\d+", str(c))), key=lambda c: int(c[8:]))


def _valid_names(df: pd.DataFrame) -> list[str]:
    return [*map(str, df.columns), ACCEPT]


def resolve_column(df: pd.DataFrame, name: str, option: str) -> str:
    """A field name of ``df`` (or ACCEPT) for a user's column name; unknown names raise UserError."""
    key = name.strip()
    lowered = key.lower()
    if key in df.columns or key == ACCEPT:
        return key
    if lowered in df.columns:
        return lowered
    alias = _ALIASES.get(lowered)
    if alias is not None and (alias in df.columns or alias == ACCEPT):
        return alias
    raise UserError(f"unknown column '{key}' for {option}; valid columns: {', '.join(_valid_names(df))}")


def parse_columns(df: pd.DataFrame, spec: str) -> list[str]:
    """``"a,b,c"`` -> column names of ``df`` (ACCEPT for the compact per-depth column)."""
    names = [part for part in (p.strip() for p in spec.split(",")) if part]
    if not names:
        raise UserError(f"--columns needs at least one column; valid columns: {', '.join(_valid_names(df))}")
    out: list[str] = []
    for name in names:
        column = resolve_column(df, name, "--columns")
        if column not in out:
            out.append(column)
    return out


def sort_compare(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """Rows of a compare() frame ordered by ``column``: numbers high to low, text A to Z, missing
    values last; ties keep their order. ``accept`` sorts by accept_d1."""
    key = resolve_column(df, column, "--sort")
    if key == ACCEPT:
        depth = _depth_columns(df)
        if not depth:
            return df
        key = depth[0]
    numeric = _numeric(key)
    values = df[key]
    if numeric:
        values = pd.to_numeric(values.map(lambda v: None if _plain(v) is None else float(_plain(v))), errors="coerce")
    else:
        values = values.map(lambda v: None if _plain(v) is None else natural_key(str(v)))

    def sort_key(i: int) -> tuple:
        value = values.iloc[i]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return (1, 0)
        return (0, -value if numeric else value)

    order = sorted(range(len(df)), key=sort_key)
    out = df.iloc[order].reset_index(drop=True)
    out.attrs = dict(df.attrs)
    return out


def select_columns(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The frame with only ``columns`` (ACCEPT expands to every accept_d*)."""
    fields: list[str] = []
    for column in columns:
        for field in (_depth_columns(df) if column == ACCEPT else [column]):
            if field not in fields:
                fields.append(field)
    if "lossless" in fields and "divergence" in df.columns and "divergence" not in fields:
        fields.insert(fields.index("lossless") + 1, "divergence")  # lossless is read with its divergence
    out = df[fields]
    out.attrs = dict(df.attrs)
    return out


def _accept_cell(values: list[Any]) -> str:
    plain = [_plain(v) for v in values]
    if not plain or all(v is None for v in plain):
        return "-"
    parts = ["-" if v is None else str(int(math.floor(100 * float(v) + 0.5))) for v in plain]
    while len(parts) > 1 and parts[-1] == "0":
        parts.pop()
    return "/".join(parts)


def _header(df: pd.DataFrame, column: str) -> str:
    if column == ACCEPT:
        n = len(_depth_columns(df))
        return f"P(acc>=d) %\nd=1..{n}" if n > 1 else "P(acc>=d) %\nd=1"
    if column.startswith("accept_d"):
        return f"acc>={column[8:]}"
    return TABLE_HEADERS.get(column, column)


def lossless_label(value: Any, kind: Any) -> str:
    """A lossless value as shown: yes / NO / -, and ``tie`` where its divergence is only near-ties."""
    return "tie" if _plain(value) is False and kind == "near-tie" else _cell("lossless", value)


def _lossless_cells(df: pd.DataFrame) -> list[str]:
    """The lossless column as shown (:func:`lossless_label`), reading the divergence column when present."""
    kinds = df["divergence"] if "divergence" in df.columns else [None] * len(df)
    return [lossless_label(v, kind) for v, kind in zip(df["lossless"], kinds)]


def _cells(df: pd.DataFrame, column: str) -> list[str]:
    if column == "lossless":
        return _lossless_cells(df)
    if column == ACCEPT:
        depth = _depth_columns(df)
        return [_accept_cell(list(row)) for row in df[depth].itertuples(index=False)] if depth else ["-"] * len(df)
    return [_cell(column, v) for v in df[column]]


def _wraps(column: str, wide: bool) -> bool:
    """Only text that reads well broken at spaces may wrap: the setting label (and config when not --wide)."""
    return column == "setting" or (column == "config" and not wide)


@dataclass
class _Column:
    name: str
    header: str
    cells: list[str]
    wrap: bool

    @property
    def natural(self) -> int:
        return max(cell_len(line) for text in [self.header, *self.cells] for line in text.split("\n"))

    @property
    def minimum(self) -> int:
        if not self.wrap:
            return self.natural
        words = [w for text in [self.header, *self.cells] for w in text.split()]
        return max((cell_len(w) for w in words), default=1)


def _table(specs: list[_Column], n_rows: int, title: str | None = None, caption: str | None = None) -> Table:
    """A borderless rich table (a rule under the headers, one space of padding between columns).

    Numbers never wrap and never shrink below their width; the text columns that may wrap
    (:func:`_wraps`) break at spaces and keep their longest word whole."""
    table = Table(title=title, caption=caption, caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, collapse_padding=True)
    for spec in specs:
        table.add_column(
            spec.header,
            justify="right" if _numeric(spec.name) and spec.name != ACCEPT else "left",  # depth 1 values align
            no_wrap=not spec.wrap,
            overflow="fold",
            min_width=spec.minimum,
        )
    for i in range(n_rows):
        table.add_row(*(s.cells[i] for s in specs))
    return table


def _measure(table: Table) -> Measurement:
    """(narrowest, natural) width of a table, as rich lays it out."""
    console = Console(file=io.StringIO(), width=100_000, color_system=None)
    return Measurement.get(console, console.options, table)


def _title(df: pd.DataFrame, columns: list[str]) -> str | None:
    shared = dict(df.attrs.get("shared", {}))
    parts = []
    if "target" not in columns and shared.get("target") is not None:
        parts.append(str(shared["target"]))
    temperature = shared.get("temperature")
    if temperature is not None:
        parts.append("greedy" if float(temperature) == 0.0 else f"T={temperature:g}")
    if shared.get("max_new_tokens") is not None:
        parts.append(f"max {shared['max_new_tokens']} new tokens")
    if shared.get("device") is not None:
        parts.append(" ".join(str(shared[k]) for k in ("device", "dtype") if shared.get(k) is not None))
    return " · ".join(parts) or None


@dataclass
class CompareView:
    """What the table format prints: a rich table (or one record per row), the width to render it
    at, and the value columns hidden to fit (named in ``note``)."""

    renderables: list[RenderableType]
    width: int
    hidden: list[str]

    def text(self) -> str:
        console = Console(file=io.StringIO(), width=self.width, color_system=None, force_terminal=False,
                          highlight=False, emoji=False, markup=False)
        for item in self.renderables:
            console.print(item, crop=False)
        return console.file.getvalue()


def record_lines(heads: list[str], fields: list[list[str]], width: int, caption: str | None = None) -> list[RenderableType]:
    """One record per row, for a terminal too narrow for a table: each head (wrapped between words,
    continued four spaces in, below the two-space indent of the values), then its ``name value``
    fields, whole ones filled to ``width`` (one longer than a line wraps between words, continued
    four spaces in); the caption last."""
    def wrap(text: str, first: str) -> list[Text]:
        return [Text(line) for line in textwrap.wrap(text, width, initial_indent=first, subsequent_indent="    ",
                                                     break_long_words=False, break_on_hyphens=False)]

    lines: list[RenderableType] = []
    for head, pairs in zip(heads, fields, strict=True):
        lines += wrap(head, "")
        current = ""
        for pair in pairs:  # fill lines with whole "name value" pairs
            if current and cell_len(f"  {current}  {pair}") > width:
                lines += wrap(current, "  ")
                current = pair
            else:
                current = f"{current}  {pair}" if current else pair
        if current:
            lines += wrap(current, "  ")
    if caption:
        lines.append(Text(caption))
    return lines


def fits(table: Table, width: int) -> bool:
    """Whether rich can lay ``table`` out in ``width`` columns without cutting a word."""
    return _measure(table).minimum <= width


def _records_view(df: pd.DataFrame, columns: list[_Column], keys: list[str], width: int, caption: str | None) -> list[RenderableType]:
    """One record per row: the keys on one line, then ``header value`` pairs (see :func:`record_lines`)."""
    heads = [" · ".join(c.cells[i] if c.name in _TEXT_COLUMNS else f"{' '.join(c.header.split())}={c.cells[i]}"
                        for c in columns if c.name in keys) for i in range(len(df))]
    fields = [[f"{' '.join(c.header.split())} {c.cells[i]}" for c in columns if c.name not in keys] for i in range(len(df))]
    return record_lines(heads, fields, width, caption)


def compare_view(df: pd.DataFrame, width: int = 100, wide: bool = False, columns: list[str] | None = None) -> CompareView:
    """The compare table of a compare() frame for a terminal ``width`` columns wide.

    By default: the key columns (target when there is more than one, task, drafter, setting, the
    settings that vary) and :data:`TABLE_VALUES`, with per-depth acceptance in one compact column.
    No number is ever cut: when the table is too wide, :data:`HIDE_FIRST` columns are dropped (and
    named in a line under it), and when even that does not fit, each row becomes a record.
    ``wide`` shows every column of the frame; ``columns`` exactly those (ACCEPT for the compact
    column); both take their natural width, which may exceed ``width``.
    """
    varying = [c for c in SETTING_COLUMNS if c in df.columns]
    if wide:
        names = list(map(str, df.columns))
    elif columns:
        names = list(columns)
    else:
        many_targets = "target" in df.columns and df["target"].nunique(dropna=False) > 1
        names = [*(["target"] if many_targets else []), "task", "drafter", "setting", *varying]
        names = [c for c in names if c in df.columns]
        names += [c for c in TABLE_VALUES if c == ACCEPT or c in df.columns]
        if "cpu_shared" in df.columns and bool(df["cpu_shared"].eq(True).any()):
            names.append("cpu_shared")  # only when a row's timing is suspect: an idle table stays as it was
    keys = [c for c in names if c in ("target", "task", "drafter", "setting", *varying)]
    specs = [_Column(c, _header(df, c), _cells(df, c), _wraps(c, wide)) for c in names]
    has_accept = any(c.name == ACCEPT for c in specs)
    caption = None
    if has_accept:
        n = len(_depth_columns(df))
        caption = (f"P(acc>=d): % of steps accepting >= d drafts, d=1..{n} (trailing 0s left out)" if n > 1
                   else "P(acc>=d): % of steps accepting >= d drafts, d=1")

    hidden: list[str] = []
    fixed = wide or bool(columns)
    if not fixed:
        order = [c for c in HIDE_FIRST if any(s.name == c for s in specs)]
        while _measure(_table(specs, len(df))).minimum > width and order:
            name = order.pop(0)
            hidden.append(name)
            specs = [s for s in specs if s.name != name]
        if _measure(_table(specs, len(df))).minimum > width:  # not even the keys and main values fit
            every = [_Column(c, _header(df, c), _cells(df, c), False) for c in names]
            return CompareView(_records_view(df, every, keys, width, caption if has_accept else None), width, [])

    shows_accept = any(s.name == ACCEPT for s in specs)
    table = _table(specs, len(df), _title(df, names), caption if shows_accept else None)
    render_width = max(width, _measure(table).maximum) if fixed else width
    renderables: list[RenderableType] = [table]
    if hidden:
        words = ", ".join("P(acc>=d)" if h == ACCEPT else " ".join(_header(df, h).split()) for h in hidden)
        renderables.append(Text(f"hidden to fit {width} columns: {words}; --wide shows all"))
    return CompareView(renderables, render_width, hidden)


def _markdown(df: pd.DataFrame) -> str:
    def escape(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(escape(str(c)) for c in df.columns) + " |",
        "|" + "|".join("---:" if _numeric(str(c)) else ":---" for c in df.columns) + "|",
    ]
    shown = _lossless_cells(df) if "lossless" in df.columns else []
    for i, row in enumerate(df.itertuples(index=False)):
        cells = [shown[i] if str(c) == "lossless" else _cell(str(c), v) for c, v in zip(df.columns, row)]
        lines.append("| " + " | ".join(escape(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def format_compare(df: pd.DataFrame, fmt: str, width: int = 100, wide: bool = False,
                   columns: list[str] | None = None) -> str:
    """A compare() frame as text: ``table`` (rich, plain text, see :func:`compare_view`), ``json``,
    ``csv`` or ``markdown`` (every column, full config). ``columns`` picks columns in any format."""
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "table":
        return compare_view(df, width, wide=wide, columns=columns).text()
    if columns:
        df = select_columns(df, columns)
    if fmt == "json":
        return json.dumps(compare_records(df), indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        return df.to_csv(index=False)
    return _markdown(df)


# --------------------------------------------------------------------------------------------
# end of a run


def cpu_shared(peak_load: float | None, threads: int | None) -> bool | None:
    """Whether other processes shared the CPU while a run was timed: the highest 1-minute load average
    sampled after its prompts above the run's own threads (+0.5). None when either is unknown.

    The peak alone decides: the average lags by about a minute, so a process that ended just before
    the run raises the first samples without competing with it for long. Interleaving a run with its
    baseline cancels a slow drift in load, not contention: the README's ngram main job measured a
    1.65x decode speedup on an idle 2-core machine and 0.99x beside a training run (same outputs)."""
    if peak_load is None or threads is None or peak_load != peak_load:
        return None
    return bool(peak_load > threads + 0.5)


def _load_peak(*frames: pd.DataFrame | None) -> tuple[float | None, int | None]:
    """The highest sampled load and the most threads over the rows of ``frames`` (None if unsampled)."""
    loads, threads = [], []
    for f in frames:
        if f is None or f.empty:
            continue
        if "load_1min" in f.columns:
            loads += [float(x) for x in f["load_1min"] if x is not None and x == x]
        if "threads" in f.columns:
            threads += [int(x) for x in f["threads"] if x is not None and x == x]
    return (max(loads) if loads else None), (max(threads) if threads else None)


# What a row records of the machine and software that timed it; a speedup dividing by a baseline that
# differs in one of these divides timings of two set-ups.
TIMING_ENV_COLUMNS = ("device_name", "cpu_model", "threads", "torch_version", "transformers_version", "specbench_sha")


def _env_differences(run: pd.DataFrame, base: pd.DataFrame) -> list[str]:
    """The :data:`TIMING_ENV_COLUMNS` whose recorded values differ between a run and the baseline rows it
    divides by, as ``"specbench_sha cd4898c, its baseline's 8c6d8c7"`` (columns a file lacks are skipped)."""
    found = []
    for col in TIMING_ENV_COLUMNS:
        if col not in run.columns or col not in base.columns:
            continue
        mine, theirs = sorted(map(str, run[col].dropna().unique())), sorted(map(str, base[col].dropna().unique()))
        if mine and theirs and mine != theirs:
            found.append(f"{col} {', '.join(mine)}, its baseline's {', '.join(theirs)}")
    return found


def baseline_note(df: pd.DataFrame) -> str | None:
    """One sentence naming the drafter runs of ``df`` that have no baseline of their own among the inputs
    and divide by another run's (the one :func:`pair_with_baseline` chose) where that choice matters:
    several baseline runs cover their prompts, or the chosen one was timed on another machine or with
    other software or specbench code (:data:`TIMING_ENV_COLUMNS`), e.g. in another session. None when
    there are none."""
    if df.empty or "run_id" not in df.columns:
        return None
    baseline = df[df["drafter"] == BASELINE_DRAFTER]
    if baseline.empty:
        return None
    flagged = []
    for run_id, group in df[df["drafter"] != BASELINE_DRAFTER].groupby("run_id", sort=True):
        pairs = pair_with_baseline(group, baseline)
        if pairs.empty or (pairs["run_id_base"] == f"{run_id}{BASELINE_SUFFIX}").all():
            continue  # unpaired, or paired with its own baseline
        chosen = [str(r) for r in pairs["run_id_base"].unique()]
        covering = baseline.drop_duplicates(PAIR_KEYS + ["run_id"]).merge(
            group[PAIR_KEYS].drop_duplicates(), on=PAIR_KEYS)["run_id"].unique().tolist()
        why = [f"of {', '.join(map(str, covering))}"] if len(covering) > 1 else []
        differences = _env_differences(group, baseline[baseline["run_id"].astype(str).isin(chosen)])
        why += [f"timed with {'; '.join(differences)}"] if differences else []
        if why:
            flagged.append(f"{run_id} divides by {', '.join(chosen)} ({'; '.join(why)})")
    if not flagged:
        return None
    return (f"{len(flagged)} run(s) without their own AR baseline among these files divide by another run's, chosen "
            f"among several or timed in another set-up: {'; '.join(flagged)}. Their speedups mix two measurements' "
            "timings; compare a run with its own baseline.")


def shared_cpu_note(df: pd.DataFrame) -> str | None:
    """One sentence naming the runs (``run_id``) of ``df`` timed while other processes shared the CPU
    (:func:`cpu_shared`), or None when there are none or no row sampled the load."""
    if df.empty or "load_1min" not in df.columns or "run_id" not in df.columns:
        return None
    flagged, n_runs = [], 0
    for run_id, group in df.groupby("run_id", sort=True, dropna=False):
        n_runs += 1
        peak, threads = _load_peak(group)
        if cpu_shared(peak, threads):
            flagged.append(f"{group['drafter'].iloc[0]} on {group['task'].iloc[0]} (load {peak:.1f}, {threads} threads)")
    if not flagged:
        return None
    return (f"{len(flagged)} of {n_runs} runs were timed while other processes shared the CPU: {'; '.join(flagged)}. "
            "Their tokens/s and every speedup that involves them are unreliable; rerun them on an idle machine.")


def run_summary(
    rows_df: pd.DataFrame | list[dict], baseline_df: pd.DataFrame | None
) -> dict[str, Any]:
    """The end-of-run numbers of one run; values that cannot be computed are None.

    Keys: n_prompts, tau_micro, tau_lo, tau_hi (:func:`tau_interval`), tau_macro, acceptance_rate, draft_share, tokens_per_s,
    drafter_forwards_per_step, decode_speedup_sum/mean, e2e_speedup_sum/mean, n_paired, lossless,
    divergence, load_max (the highest 1-minute load average after a prompt, run and baseline) and cpu_shared
    (:func:`cpu_shared`: other processes competed for the CPU, so the timings are suspect).
    """
    df = rows_df if isinstance(rows_df, pd.DataFrame) else pd.DataFrame(rows_df)
    if df.empty:
        summary: dict[str, Any] = {"n_prompts": 0, "tau_micro": None, "tau_lo": None, "tau_hi": None, "tau_macro": None}
        summary.update(dict.fromkeys(["acceptance_rate", "draft_share", "tokens_per_s"]))
        summary.update(dict.fromkeys(["drafter_forwards_per_step", *_SPEEDUP_KEYS]))
        summary.update({"n_paired": 0, "lossless": None, "divergence": None, "load_max": None, "cpu_shared": None})
        return summary
    pairs = pair_with_baseline(df, baseline_df)
    summary = {
        "n_prompts": int(df["prompt_id"].nunique()),
        "tau_micro": tau_micro(df),
        **dict(zip(("tau_lo", "tau_hi"), tau_interval(df))),
        "tau_macro": tau_macro(df),
        "acceptance_rate": acceptance_rate(df),
        "draft_share": draft_share(df),
        "tokens_per_s": tokens_per_s(df),
        "drafter_forwards_per_step": drafter_forwards_per_step(df),
        **speedups(pairs),
        "n_paired": int(len(pairs)),
        "lossless": lossless(pairs),
        "divergence": divergence(pairs),
    }
    peak, threads = _load_peak(df, baseline_df)
    summary.update({"load_max": peak, "cpu_shared": cpu_shared(peak, threads)})
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
