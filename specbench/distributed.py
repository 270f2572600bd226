"""Data-parallel `specbench run` under torchrun: `torchrun --nproc-per-node N -m specbench run ...`.

* Every rank selects the same prompt subset (``--limit``/``--seed``) and runs ``prompts[rank::N]``
  (``RunSpec.shard``), on ``cuda:LOCAL_RANK`` when ``--device auto`` finds GPUs, else on the CPU.
* The AR baseline shards the same way: each rank runs (or reuses from ``--results-dir``) the baseline
  of its own prompts, interleaved with its drafter run on the same device, so every speedup pair is
  measured on one device, as in a single-process run.
* Each rank writes its part, ``<out>.rank<R>-of-<N>.parquet`` (and ``...ar-baseline.parquet``), with
  the usual sidecar, so ``--resume`` continues every rank where it stopped.
* The rows then travel to rank 0 over ``torch.distributed`` (gloo; no shared filesystem needed, so
  ``--nnodes`` with a rendezvous works too), which writes ``<out>`` (and ``<out stem>.ar-baseline.parquet``)
  with every prompt exactly once, in the single-process order, ``run_id`` = the file stem as a
  single-process run has it, and deletes the parts. Only the timings (and the machine a row ran on)
  differ from a single-process run.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specbench import results, runner
from specbench.errors import UserError


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int


def from_env() -> World | None:
    """The torchrun world of this process, or None outside torchrun (or with one process)."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise UserError("WORLD_SIZE, RANK and LOCAL_RANK must be integers (set by torchrun); unset them for one process") from None
    if size <= 1:
        return None
    return World(rank, size, local_rank)


def part_path(out: Path, world: World, rank: int | None = None) -> Path:
    rank = world.rank if rank is None else rank
    return out.with_name(f"{out.stem}.rank{rank}-of-{world.size}.parquet")


def _init(world: World):
    import torch.distributed as dist

    if not dist.is_initialized():
        # a long timeout: ranks wait for the slowest one's prompts before the merge
        dist.init_process_group("gloo", timeout=_dt.timedelta(hours=48))
    return dist


def _device(spec: runner.RunSpec, world: World) -> str:
    import torch

    if spec.device == "auto" and torch.cuda.is_available():
        return f"cuda:{world.local_rank % torch.cuda.device_count()}"
    return spec.device


def run(spec: runner.RunSpec, load_target: Callable, progress: Callable | None = None,
        world: World | None = None) -> runner.RunOutcome | None:
    """This rank's share of ``spec``; on rank 0 the merged outcome (as :func:`runner.run` returns it),
    None on the other ranks."""
    world = world or from_env()
    if world is None:
        return runner.run(spec, load_target, progress)
    if spec.shard is not None:
        raise UserError("RunSpec.shard is set by the data-parallel run itself; leave it unset")
    if spec.device_map is not None:
        raise UserError("--device-map under torchrun would spread every rank over all GPUs; "
                        "use one GPU per rank (drop --device-map) or one process with --device-map")
    runner.validate(spec)  # every rank refuses a bad command the same way, before the group forms
    dist = _init(world)
    try:
        # one output name for all ranks (the default one has a timestamp), and rank 0's look at it
        out = Path(spec.out) if spec.out is not None else Path(spec.results_dir) / f"{runner.default_run_id(spec)}.parquet"
        state = "run"
        if out.exists():
            state = "done" if spec.resume else f"{out} exists; pass --resume to continue it or choose another --out"
        box = [out, state]
        dist.broadcast_object_list(box, src=0)
        out, state = box
        if state == "done":  # merged by an earlier run: nothing left to do, as with one process
            return runner.RunOutcome(out=out, baseline_out=None, rows=results.read_results([out]).to_dict("records")) \
                if world.rank == 0 else None
        if state != "run":
            raise UserError(state)
        mine = dataclasses.replace(spec, out=part_path(out, world), shard=(world.rank, world.size), device=_device(spec, world))
        outcome = runner.run(mine, load_target, progress)
        gathered = [None] * world.size if world.rank == 0 else None
        payload = (outcome.rows, outcome.baseline_rows, outcome.baseline_source)
        dist.gather_object(payload, gathered, dst=0)
        merged = _merge(spec, out, gathered) if world.rank == 0 else None
        dist.barrier()  # rank 0 has written the merged file: every rank drops its parts
        part = part_path(out, world)
        part.unlink(missing_ok=True)
        results.baseline_path(part).unlink(missing_ok=True)
        return merged
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _order(spec: runner.RunSpec) -> dict[str, int]:
    return {p.id: i for i, p in enumerate(runner.load_prompts(spec))}


def _write(out: Path, rows: list[dict], order: dict[str, int], run_id: str) -> list[dict]:
    rows = sorted(rows, key=lambda r: (order[str(r["prompt_id"])], int(r["turn"])))
    keys = [(str(r["prompt_id"]), int(r["turn"])) for r in rows]
    if len(keys) != len(set(keys)):
        raise UserError(f"the ranks' parts of {out} hold a (prompt, turn) twice; delete the .rank* files and rerun")
    out.unlink(missing_ok=True)  # a leftover of an earlier attempt at this run (the merged file did not exist)
    writer = results.RunWriter(out, resume=False)
    batch: list[dict] = []
    for row in rows:  # one batch per prompt, as the runner writes them
        row = {**row, "run_id": run_id}
        if batch and batch[-1]["prompt_id"] != row["prompt_id"]:
            writer.add(batch)
            batch = []
        batch.append(row)
    writer.add(batch)
    writer.finish()
    return list(writer.rows)


def _merge(spec: runner.RunSpec, out: Path, gathered: list) -> runner.RunOutcome:
    order = _order(spec)
    rows = [r for part, _, _ in gathered for r in part]
    missing = sorted(set(order) - {str(r["prompt_id"]) for r in rows})
    if missing:
        raise UserError(f"the ranks returned no rows for prompts {', '.join(missing[:5])}; rerun with --resume --out {out}")
    outcome = runner.RunOutcome(out=out, baseline_out=None)
    outcome.rows = _write(out, rows, order, out.stem)
    ran = [r for _, base, source in gathered if source == "ran" for r in (base or [])]
    every = sorted((r for _, base, _ in gathered for r in (base or [])),
                   key=lambda r: (order[str(r["prompt_id"])], int(r["turn"])))
    if ran:  # the ranks that ran their baseline share one merged baseline file
        base_out = results.baseline_path(out)
        _write(base_out, ran, order, base_out.stem)
        outcome.baseline_out, outcome.baseline_source = base_out, "ran"
    elif any(source for _, _, source in gathered):
        outcome.baseline_source = sorted({source for _, _, source in gathered if source})[0]
    outcome.baseline_rows = every or None
    return outcome


__all__ = ["World", "from_env", "part_path", "run"]
