"""tau against training tokens: every learned family on one figure (issue 10's learning curve).

Inputs are what already exists: benchmark result files (``specbench bench`` parquet; each row
names the checkpoint it ran, ``checkpoint_path`` and ``checkpoint_hash``) and the checkpoints'
``training.json`` (written by ``specbench train`` beside the weights). A checkpoint's training
tokens are its ``train_loss_tokens`` (the assistant tokens it trained on; ``job.budget_tokens``
when absent). A result row's checkpoint is found by its path, else by the sha256 of the weight
files among the checkpoint folders passed in (``checkpoints``), so results measured elsewhere
still match a local copy; a folder that keeps only the card (``training.json`` without weights, as
``reports/data/tau-curve/heads``) matches by the ``checkpoint_sha256`` its training recorded. Rows whose checkpoint has no ``training.json`` (random weights, a
released head) are left out and counted.

One point = one (drafter configuration, task, checkpoint): tau micro (``report.tau_micro``) of its
rows. A line joins the points of one family configuration (the drafter, its options other than
the checkpoint path, and the recipe's ``draft_vocab_size`` so the reduced-vocabulary variant gets
its own line) over the budgets; one panel per task.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from specbench import report
from specbench.drafter import CheckpointId
from specbench.errors import UserError

# every file a learned drafter's loader hashes into its CheckpointId (SpecBlock's vocabulary maps included);
# tests/test_tau_curve.py checks each family's saver + loader against checkpoint_hash
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "mask_embedding.pt", "vocab_mapping.pt")
POINT_COLUMNS = ["label", "drafter", "task", "tokens", "tau", "rows", "checkpoint"]


def checkpoint_hash(folder: Path) -> str | None:
    """The sha256 a drafter records for the weights in ``folder`` (its weight files), None without any."""
    files = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    return CheckpointId.of_files(folder, files).sha256 if files else None


def _training(folder: Path) -> dict | None:
    try:
        summary = json.loads((folder / "training.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return summary if summary.get("finished", True) else None


def _tokens(summary: dict) -> int:
    return int(summary.get("train_loss_tokens") or summary["job"]["budget_tokens"])


def _label(drafter: str, config: str, summary: dict) -> str:
    try:
        options = json.loads(config) if config else {}
    except json.JSONDecodeError:
        options = {}
    options = {k: v for k, v in options.items() if k not in ("path", "seed")} if isinstance(options, dict) else {}
    vocab = (summary.get("job", {}).get("recipe") or {}).get("draft_vocab_size")
    shown = [f"{k}={v}" for k, v in sorted(options.items()) if k in ("tree", "budget", "total_tokens", "width", "top_k")]
    if vocab and drafter != "eagle3":
        shown.append(f"vocab={vocab}")
    return " ".join([drafter, *shown])


def curve_points(df: pd.DataFrame, checkpoints: Iterable[Path] = ()) -> tuple[pd.DataFrame, int]:
    """(points, rows left out): one point per (configuration, task, checkpoint with a training.json)."""
    by_hash: dict[str, Path] = {}
    for folder in map(Path, checkpoints):
        if (folder / "training.json").is_file():
            # a folder with weights: their hash; a kept card without them: the hash its training recorded
            digest = checkpoint_hash(folder) or (_training(folder) or {}).get("checkpoint_sha256")
            if digest:
                by_hash[digest] = folder
    points = []
    left_out = 0
    if df.empty:
        return pd.DataFrame(columns=POINT_COLUMNS), 0
    keys = ["drafter", "drafter_config", "task", "checkpoint_path", "checkpoint_hash"]
    for (drafter, config, task, path, digest), group in df.groupby(
            [df[k].fillna("") for k in keys], sort=True):
        folder = Path(path) if path else None
        summary = _training(folder) if folder is not None and (folder / "training.json").is_file() else None
        if summary is None and digest in by_hash:
            folder = by_hash[digest]
            summary = _training(folder)
        if summary is None or drafter == report.BASELINE_DRAFTER:
            left_out += len(group)
            continue
        points.append({"label": _label(drafter, config, summary), "drafter": drafter, "task": task,
                       "tokens": _tokens(summary), "tau": report.tau_micro(group), "rows": len(group),
                       "checkpoint": str(folder)})
    out = pd.DataFrame(points, columns=POINT_COLUMNS)
    return out.sort_values(["task", "label", "tokens"], ignore_index=True), left_out


def plot_curve(points: pd.DataFrame, path: Path, subtitle: str = "") -> Path:
    """tau vs training tokens (log x), one line per configuration, one panel per task."""
    from specbench.plots import _PALETTE, _figure, _save

    if points.empty:
        raise UserError("no result row ran a checkpoint with a training.json; pass the checkpoint folders "
                        "with --checkpoints, or benchmark trained checkpoints first")
    tasks = sorted(points["task"].unique())
    labels = sorted(points["label"].unique())
    colors = {label: _PALETTE[i % len(_PALETTE)] for i, label in enumerate(labels)}
    fig, axes = _figure(4.8 * len(tasks) + 1.2, 4.2, ncols=len(tasks))
    for ax, task in zip(axes, tasks):
        sub = points[points["task"] == task]
        for label in labels:
            line = sub[sub["label"] == label].sort_values("tokens")
            if line.empty:
                continue
            ax.plot(line["tokens"], line["tau"], marker="o", color=colors[label], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("training tokens (assistant)")
        ax.set_ylabel("tau (tokens per target forward)")
        ax.set_title(str(task), fontsize=10)
        ax.grid(axis="x", alpha=0.3, which="both")
    axes[-1].legend(fontsize=7.5, loc="best")
    return _save(fig, "tau vs training tokens", subtitle, Path(path))


__all__ = ["curve_points", "plot_curve", "checkpoint_hash", "POINT_COLUMNS"]
