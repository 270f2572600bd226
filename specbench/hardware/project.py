"""Projected decode speedups: a run's per-step logs priced on another device (HARDWARE.md).

tau and tree sizes are hardware-free and every result row logs them per step, so for a profile P::

    speedup_P = sum over steps of AR_cost(committed tokens) / sum over steps of step_cost

    step_cost = t_fix + t_round + forwards * (T_fwd_drafter + t_d) + T_fwd(n, context)
    AR_cost   = t_fix + T_fwd(1, context) for each committed token at its own context

per row, then aggregated like the measured speedups (:mod:`specbench.report`): the ratio of sums
over all rows (``*_sum``) and the mean of per-row ratios (``*_mean``). ``t_round`` is paid only by
a speculative step (a tree of more than the root, or any drafter forward), so an AR run, whose
steps are the root alone with no drafter forward, projects to exactly 1.0.

Per step: context = the target's cached positions when the step runs (``len(prompt) - 1`` plus
every token committed before); n = ``tree_size_per_step``; forwards = ``drafter_forwards_per_step``.
The drafter's forward is priced at one query token.

The target's shape is the run's own (``target`` column: a bundled config, ``random:CONFIG``, a tiny
target, a cached alias or a local directory). ``as_target`` prices the same acceptance pattern on
another model's cost ("what-if"): the drafter is then re-shaped to that model (its layer count and
architecture kept, widths and vocabulary taken from the new target).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from drafters.common.locate import recorded_checkpoint
from specbench.errors import UserError
from specbench.hardware.analytic import AnalyticProfile, Shape, bundled_configs, load_config, shape_from_config
from specbench.hardware.profiles import MeasuredProfile, get_profile

NAN = float("nan")

# --------------------------------------------------------------------------------- shapes of a run


def target_config(name: str) -> dict[str, Any]:
    """The HF config dict of a run's ``target``, without loading weights; else a one-line UserError."""
    if name.startswith("random:"):
        return load_config(name.split(":", 1)[1])[1]
    if name in bundled_configs():
        return load_config(name)[1]
    from specbench.targets import TINY_TARGETS, build_tiny

    if name in TINY_TARGETS:
        return build_tiny(name)[0].config.to_dict()
    from specbench.fetch import ALIASES, alias_dir, is_cached

    if name in ALIASES and is_cached(name) and (Path(alias_dir(name)) / "config.json").is_file():
        return json.loads((Path(alias_dir(name)) / "config.json").read_text())
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return json.loads((path / "config.json").read_text())
    raise UserError(
        f"cannot find the architecture of target '{name}' (no bundled config, not cached, no local config.json); "
        "project it with --as-target CONFIG.json"
    )


def _drafter_config(row: pd.Series | dict) -> tuple[dict[str, Any] | None, str | None]:
    """(the drafter's own HF config, from its checkpoint config.json or draft model; what was looked for
    when it is unknown): a checkpoint folder that cannot be found names itself, so the caller can say so."""
    try:
        options = json.loads(row.get("drafter_config") or "{}")
    except (TypeError, ValueError):
        options = {}
    if not isinstance(options, dict):
        return None, None
    path = options.get("path")
    if isinstance(path, str) and path and path != "random":
        loaded_from = row.get("checkpoint_path")
        folder, looked_for = recorded_checkpoint(str(row.get("drafter")), str(row.get("target")), path,
                                                 loaded_from if isinstance(loaded_from, str) else None)
        return (json.loads((folder / "config.json").read_text()), None) if folder is not None else (None, looked_for)
    model = options.get("model")
    if isinstance(model, str) and model:
        try:
            return target_config(model), None
        except UserError:
            return None, model
    return None, None


_WIDTH_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")


def reshape_drafter(drafter: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """The drafter's config re-shaped onto ``target``: layers and architecture kept, widths replaced."""
    t = target.get("text_config") if isinstance(target.get("text_config"), dict) else target
    out = dict(drafter)
    for key in _WIDTH_KEYS:
        if key in t:
            out[key] = t[key]
    if "head_dim" not in t:
        out.pop("head_dim", None)
    return out


# --------------------------------------------------------------------------------- the step cost


@dataclass(frozen=True)
class StepCost:
    """One profile bound to one target (and drafter): seconds per step and per AR token."""

    t_fix: float
    t_round: float
    fwd: Callable[[int, int], float]  # (n, context) -> seconds of the target forward
    draft: Callable[[int], float] | None  # context -> seconds of one drafter forward; None = unknown

    def step(self, n: int, context: int, forwards: int) -> float:
        speculative = n > 1 or forwards > 0
        if forwards and self.draft is None:
            return NAN
        draft = forwards * self.draft(context) if forwards else 0.0
        return self.t_fix + (self.t_round if speculative else 0.0) + draft + self.fwd(n, context)


def bind(profile: AnalyticProfile | MeasuredProfile, target: Shape, drafter: Shape | None, drafter_name: str,
         drafter_known: bool) -> StepCost:
    if isinstance(profile, MeasuredProfile):
        ms = profile.drafter_forward_ms(drafter_name)
        return StepCost(0.0, 0.0, lambda n, c: profile.t_fwd(target, n, c),
                        None if ms is None else (lambda c: ms * 1e-3))
    draft = (lambda c: profile.drafter_forward(drafter, 1, c)) if drafter_known else None
    return StepCost(profile.t_fix, profile.t_round, lambda n, c: profile.t_fwd(target, n, c), draft)


def row_times(row: pd.Series | dict, cost: StepCost) -> tuple[float, float]:
    """(AR seconds, projected seconds) of one result row's decode, from its per-step logs."""
    pos = len(row["prompt_ids"]) - 1
    remaining = int(row["n_new_tokens"])
    ar = spec = 0.0
    for n, acc, fwd in zip(row["tree_size_per_step"], row["accepted_per_step"], row["drafter_forwards_per_step"]):
        n, acc, fwd = int(n), int(acc), int(fwd)
        spec += cost.step(n, pos, fwd)
        for i in range(min(acc + 1, remaining)):  # the AR baseline commits the same tokens one by one
            ar += cost.step(1, pos + i, 0)
        remaining -= acc + 1
        pos += acc + 1
    return ar, spec


@dataclass(frozen=True)
class Projection:
    hardware: str
    label: str  # "projected" (the run's own target) or "what-if: <shape>"
    speedup_sum: float
    speedup_mean: float
    n_rows: int
    missing: tuple[str, ...] = ()  # drafter checkpoints (or draft models) whose shape was not found: not priced


def check_projection(hardware: list[str] | tuple[str, ...], as_target: str | None = None) -> None:
    """The one-line errors a projection would raise, before any work: an unknown profile, an unknown
    ``as_target`` shape, or ``as_target`` on a measured profile (measured on one target, it has no other shape)."""
    for name in hardware:
        _refuse_as_target_on_measured(name, get_profile(name), as_target)
    if as_target is not None:
        load_config(as_target)


def _refuse_as_target_on_measured(name: str, profile, as_target: str | None) -> None:
    if as_target is not None and isinstance(profile, MeasuredProfile):
        raise UserError(f"--as-target needs an analytic profile; '{name}' is measured on {profile.target}")


def project_rows(rows: pd.DataFrame, hardware: str, as_target: str | None = None) -> Projection:
    """Projected decode speedup of ``rows`` (one drafter configuration's rows) on profile ``hardware``."""
    profile = get_profile(hardware)
    _refuse_as_target_on_measured(hardware, profile, as_target)
    if as_target is not None:
        as_name, as_cfg = load_config(as_target)
    ar_total = spec_total = 0.0
    ratios = []
    cache: dict[tuple, StepCost] = {}
    missing: list[str] = []
    for _, row in rows.iterrows():
        if int(row["n_steps"]) == 0:
            continue
        loaded_from = row.get("checkpoint_path")  # path=auto resolves by it (NaN where a file lacks the column)
        key = (row["target"], row["drafter"], row.get("drafter_config"), loaded_from if isinstance(loaded_from, str) else None)
        if key not in cache:
            cfg = as_cfg if as_target is not None else target_config(str(row["target"]))
            target = shape_from_config(cfg, as_name if as_target is not None else str(row["target"]))
            dcfg, looked_for = _drafter_config(row)
            forwards = sum(int(f) for f in row["drafter_forwards_per_step"])
            known = dcfg is not None or forwards == 0
            if not known and looked_for is not None and looked_for not in missing:
                missing.append(looked_for)
            if dcfg is not None and as_target is not None:
                dcfg = reshape_drafter(dcfg, as_cfg)
            drafter = shape_from_config(dcfg, f"{row['drafter']} drafter") if dcfg is not None else None
            cache[key] = bind(profile, target, drafter, str(row["drafter"]), known)
        ar, spec = row_times(row, cache[key])
        ar_total += ar
        spec_total += spec
        ratios.append(ar / spec if spec > 0 else NAN)
    label = "projected" if as_target is None else f"what-if: {as_name}"
    if not ratios:
        return Projection(hardware, label, NAN, NAN, 0)
    speedup_sum = ar_total / spec_total if spec_total > 0 else NAN
    speedup_mean = NAN if any(math.isnan(r) for r in ratios) else sum(ratios) / len(ratios)
    return Projection(hardware, label, speedup_sum, speedup_mean, len(ratios), tuple(missing))


# --------------------------------------------------------------------------------- compare

PROJECTION_COLUMNS = ["hardware", "projection", "projected_decode_speedup_sum", "projected_decode_speedup_mean"]


def _match(rows: pd.DataFrame, rec: pd.Series, table: pd.DataFrame) -> pd.DataFrame:
    from specbench import report

    mask = (rows["target"] == rec["target"]) & (rows["task"] == rec["task"]) & (rows["drafter"] == rec["drafter"])
    mask &= rows["drafter_config"].astype(str) == str(rec["config"])
    for col in report.SETTING_COLUMNS:
        if col in table.columns and col in rows.columns:
            mask &= rows[col].astype(str) == str(rec[col])
    if "checkpoint" in table.columns or "checkpoint_path" in table.columns:
        hashes, paths = report.checkpoint_identity(rows)
        want = rec.get("checkpoint") or None
        if want:
            mask &= hashes == want
        elif rec.get("checkpoint_path"):
            mask &= paths.isin(str(rec["checkpoint_path"]).split("; "))
        else:  # a row without weights matches only rows without weights, never another head's
            mask &= (hashes == "") & (paths == "")
    return rows[mask].drop_duplicates(["prompt_id", "turn"], keep="first")


def add_projections(rows: pd.DataFrame, table: pd.DataFrame, hardware: list[str], as_target: str | None = None) -> pd.DataFrame:
    """``table`` (the compare frame) with one copy of each row per profile in ``hardware`` and the
    :data:`PROJECTION_COLUMNS` added: the profile, "projected" or "what-if: <shape>", and the
    projected decode speedups (ratio of sums, mean of per-prompt ratios). ``rows`` are the result
    rows the table was built from."""
    if not hardware:
        return table
    check_projection(hardware, as_target)  # before any work
    out = []
    missing: list[str] = []
    for _, rec in table.iterrows():
        matched = _match(rows, rec, table)
        for name in hardware:
            p = project_rows(matched, name, as_target)
            missing += [m for m in p.missing if m not in missing]
            out.append({**rec.to_dict(), "hardware": p.hardware, "projection": p.label,
                        "projected_decode_speedup_sum": p.speedup_sum, "projected_decode_speedup_mean": p.speedup_mean})
    frame = pd.DataFrame.from_records(out, columns=[*table.columns, *PROJECTION_COLUMNS])
    frame.attrs = {**table.attrs, "unpriced_drafters": missing}
    return frame


def unpriced_note(frame: pd.DataFrame) -> str | None:
    """One line naming the drafter checkpoints :func:`add_projections` could not find (their rows show
    no projection), or None when every drafter was priced."""
    missing = frame.attrs.get("unpriced_drafters") or []
    if not missing:
        return None
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return (f"no projected speedup for drafters whose config.json was not found: {shown}; "
            "run compare from the folder the runs were made in, or keep the checkpoint folders where the files name them")
