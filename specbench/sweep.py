"""Sweep files -> cells -> runs: `specbench sweep SWEEP.toml`.

A sweep file (TOML, read with :mod:`tomllib`) names targets, tasks, drafters with their settings,
temperatures and seeds; the grid of their product is the list of *cells*, and each cell is one
:func:`specbench.runner.run` (the function `specbench run` calls) writing one parquet file::

    results_dir = "results/block"          # where every cell's file goes (and baselines are found)
    targets = ["smollm2-135m"]
    tasks = ["humaneval", {name = "mt-bench", limit = 2}]
    temperatures = [0.0]                   # a number or a list
    seeds = [0]
    limit = 3                              # prompts per task (0 = all); a task entry may override
    max_new_tokens = 128                   # likewise
    file = "{label}-{task}"                # file name template (default below)

    [[drafters]]
    drafter = "jetspec"
    set = {budget = [16, 32, 64]}          # a list expands into one cell per value (a grid)
    label = "jetspec-{budget}"             # names the cell; default: drafter plus its options
    tasks = ["humaneval"]                  # optional: only these tasks

Every key is listed in :data:`TOP_KEYS`, :data:`TASK_KEYS` and :data:`DRAFTER_KEYS`; anything else is
refused in one line that names where it is. Relative paths are relative to the current directory,
as on the command line.

* A finished cell (its parquet exists, with the cell's settings) is skipped; an interrupted one
  (its ``.parquet.partial.jsonl`` sidecar, or its baseline's, exists) resumes, because every cell
  runs with ``resume=True`` (which is also a clean start when nothing is on disk).
* AR baselines are shared: cells that differ only in the drafter form a *baseline group*. Its first
  cell (an explicit ``ar`` cell if the group has one) runs first; the runner interleaves the AR
  baseline with it and writes ``<cell>.ar-baseline.parquet`` into ``results_dir``, and the other
  cells of the group find that file through :func:`specbench.runner.find_baseline` and reuse it.
  The Ray executor makes the other cells wait for the first one, so the baseline runs once there too.
* A failing cell does not stop the others; :func:`run_sweep` returns one :class:`CellResult` per cell.

Executors: ``local`` runs the cells in this process, one at a time; ``ray`` runs each cell as a Ray
task with ``resources`` (cpus, gpus) from the file, on a local Ray cluster started by ``ray.init()``
or on an existing one (``address``); every node must see ``results_dir`` at the same path.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from specbench import report, runner
from specbench.results import baseline_path
from specbench.errors import UserError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DEFAULT_FILE = "{target}_{task}_{label}_T{temperature}_s{seed}"
EXECUTORS = ("local", "ray")

TOP_KEYS = {
    "name": "a title for the sweep",
    "results_dir": "folder of the cells' parquet files (default results)",
    "executor": "local or ray",
    "resources": "{cpus = N, gpus = N} per cell, for the ray executor",
    "targets": "list of targets",
    "tasks": "list of task names or {name|file, category, limit, max_new_tokens, label} tables",
    "drafters": "list of [[drafters]] tables",
    "temperatures": "a number or a list (0 = greedy)",
    "seeds": "an integer or a list",
    "limit": "prompts per task, 0 = all (default 20)",
    "max_new_tokens": "default 256",
    "top_p": "default 1.0",
    "top_k": "default 0",
    "device": "auto, cpu or cuda[:N]",
    "dtype": "auto, float32, bfloat16, float16",
    "device_map": "spread each target over the GPUs with accelerate (auto, balanced, sequential)",
    "baseline": "pair every cell with the AR baseline (default true)",
    "warmup": "one untimed generation first (default true)",
    "file": f"file name template (default {DEFAULT_FILE!r})",
}
TASK_KEYS = ("name", "file", "category", "limit", "max_new_tokens", "label")
DRAFTER_KEYS = ("drafter", "set", "path", "label", "tasks", "targets", "baseline", "resources")
RESOURCE_KEYS = ("cpus", "gpus")


@dataclass(frozen=True)
class Resources:
    cpus: float = 1.0
    gpus: float = 0.0


@dataclass(frozen=True)
class Cell:
    """One run of the grid. ``name`` (the file stem) identifies it in every message."""

    name: str
    spec: runner.RunSpec
    label: str  # the drafter entry's label for this cell, e.g. "jetspec-32"
    task_label: str
    resources: Resources = Resources()
    group: tuple = ()  # baseline group: cells with equal groups share one AR baseline

    @property
    def out(self) -> Path:
        assert self.spec.out is not None
        return Path(self.spec.out)

    @property
    def sidecars(self) -> tuple[Path, Path]:
        base = baseline_path(self.out)
        return (self.out.with_name(self.out.name + ".partial.jsonl"),
                base.with_name(base.name + ".partial.jsonl"))

    @property
    def runs_baseline(self) -> bool:
        return self.spec.baseline and self.spec.drafter != runner.BASELINE


@dataclass(frozen=True)
class Sweep:
    path: Path
    name: str
    results_dir: Path
    executor: str
    cells: tuple[Cell, ...]

    def leaders(self) -> dict[tuple, Cell]:
        """Baseline group -> the cell that runs (or first looks for) its AR baseline."""
        out: dict[tuple, Cell] = {}
        for cell in self.cells:
            if cell.group and (cell.runs_baseline or cell.spec.drafter == runner.BASELINE):
                out.setdefault(cell.group, cell)
        return out


@dataclass
class CellResult:
    cell: Cell
    status: str  # "done" (ran now), "skipped" (finished before), "failed"
    error: str = ""
    seconds: float = 0.0
    baseline: str = ""  # the runner's baseline_source


# ------------------------------------------------------------------------------------------------
# reading a sweep file


def _where(path: Path, what: str) -> str:
    return f"{path}: {what}"


def _check_keys(table: Any, allowed, path: Path, where: str) -> dict:
    if not isinstance(table, dict):
        raise UserError(_where(path, f"{where} must be a table, got {type(table).__name__}"))
    unknown = [k for k in table if k not in allowed]
    if unknown:
        raise UserError(_where(path, f"unknown key '{unknown[0]}' in {where}; known keys: {', '.join(allowed)}"))
    return table


def _subset(entry: dict, key: str, noun: str, allowed, path, where: str) -> list[str] | None:
    """``entry[key]``: a list restricting an entry to some of the sweep's ``key`` (None = all)."""
    chosen = entry.get(key)
    if chosen is None:
        return None
    chosen = _as_list(chosen, path, f"{key} of {where}", str)
    for item in chosen:
        if item not in allowed:
            raise UserError(_where(path, f"{where} names {noun} '{item}', which is not in '{key}' ({', '.join(allowed)})"))
    return chosen


def _as_list(value: Any, path: Path, key: str, kind: type | tuple) -> list:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise UserError(_where(path, f"'{key}' is an empty list; give at least one value"))
    for v in values:
        if isinstance(v, bool) or not isinstance(v, kind):
            raise UserError(_where(path, f"'{key}' must hold {_kind_name(kind)}, got {v!r}"))
    return values


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({int: "integers", float: "numbers", str: "strings", dict: "tables"}.get(k, k.__name__) for k in kinds)


def _scalar(table: dict, key: str, kind, default, path: Path, where: str):
    value = table.get(key, default)
    if value is None:
        return None
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise UserError(_where(path, f"'{key}' in {where} must be {_kind_name(kind).rstrip('s')}, got {value!r}"))
    return value


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _fill(template: str, fields: dict, path: Path, where: str) -> str:
    try:
        return template.format(**fields)
    except (KeyError, IndexError) as exc:
        raise UserError(_where(path, f"{where} names {{{exc.args[0]}}}, which is none of: {', '.join(sorted(fields))}")) from None
    except ValueError as exc:
        raise UserError(_where(path, f"{where} is not a valid template ({exc})")) from None


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", text).strip("-") or "cell"


def load_sweep(path: Path | str, executor: str | None = None) -> Sweep:
    """Read and check a sweep file; expand its grid into cells. Every problem is one UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"sweep file {path} does not exist; check the path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a UTF-8 text file; pass a TOML sweep file") from None
    return parse_sweep(text, path, executor)


class CellError(UserError):
    """A cell that :func:`runner.validate` refuses; ``reason`` is runner's own line, in `run`'s option names."""

    def __init__(self, path: Path, cell: str, reason: str) -> None:
        super().__init__(_where(path, f"cell {cell}: {reason}"))
        self.reason = reason


def parse_sweep(text: str, path: Path, executor: str | None = None) -> Sweep:
    """:func:`load_sweep` on ``text``, the contents ``path`` has (or is about to have: `tune` checks its
    generated file before writing it)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path} is not valid TOML ({exc}); fix the file") from None
    _check_keys(data, TOP_KEYS, path, "the top level")
    for key in ("targets", "tasks", "drafters"):
        if key not in data:
            raise UserError(_where(path, f"missing '{key}'; a sweep needs targets, tasks and drafters"))

    executor = executor or _scalar(data, "executor", str, "local", path, "the top level")
    if executor not in EXECUTORS:
        raise UserError(_where(path, f"unknown executor '{executor}'; use one of {', '.join(EXECUTORS)}"))
    results_dir = Path(_scalar(data, "results_dir", str, "results", path, "the top level"))
    targets = _as_list(data["targets"], path, "targets", str)
    temperatures = [float(t) for t in _as_list(data.get("temperatures", 0.0), path, "temperatures", (int, float))]
    seeds = _as_list(data.get("seeds", 0), path, "seeds", int)
    top = {
        "limit": _scalar(data, "limit", int, 20, path, "the top level"),
        "max_new_tokens": _scalar(data, "max_new_tokens", int, 256, path, "the top level"),
    }
    top_p = _scalar(data, "top_p", float, 1.0, path, "the top level")
    top_k = _scalar(data, "top_k", int, 0, path, "the top level")
    device = _scalar(data, "device", str, "auto", path, "the top level")
    dtype = _scalar(data, "dtype", str, "auto", path, "the top level")
    device_map = _scalar(data, "device_map", str, None, path, "the top level")
    baseline = _scalar(data, "baseline", bool, True, path, "the top level")
    warmup = _scalar(data, "warmup", bool, True, path, "the top level")
    file_template = _scalar(data, "file", str, DEFAULT_FILE, path, "the top level")
    resources = _resources(data.get("resources", {}), Resources(), path, "[resources]")

    tasks = [_task(entry, i, top, path) for i, entry in enumerate(_as_list(data["tasks"], path, "tasks", (str, dict)))]
    seen: set[str] = set()
    for t in tasks:
        if t["label"] in seen:
            raise UserError(_where(path, f"task '{t['label']}' is listed twice; give one of them a different label"))
        seen.add(t["label"])
    drafters = [_drafter(entry, i, [t["label"] for t in tasks], targets, baseline, resources, path)
                for i, entry in enumerate(_as_list(data["drafters"], path, "drafters", dict))]

    cells: list[Cell] = []
    for target, task, temperature, seed in itertools.product(targets, tasks, temperatures, seeds):
        group_cells: list[Cell] = []
        for d in drafters:
            if d["tasks"] is not None and task["label"] not in d["tasks"]:
                continue
            if d["targets"] is not None and target not in d["targets"]:
                continue
            for options, drafter_path, label in d["variants"]:
                spec = runner.RunSpec(
                    drafter=d["drafter"], target=target, task=task["name"], task_file=task["file"],
                    category=task["category"], limit=None if task["limit"] == 0 else task["limit"], seed=seed,
                    max_new_tokens=task["max_new_tokens"], temperature=temperature, top_p=top_p, top_k=top_k,
                    options=options, drafter_path=drafter_path, device=device, dtype=dtype, out=None,
                    results_dir=results_dir, resume=True, baseline=d["baseline"], warmup=warmup, device_map=device_map,
                )
                fields = {"target": target, "task": task["label"], "label": label, "drafter": d["drafter"],
                          "temperature": f"{temperature:g}", "seed": seed, "limit": task["limit"],
                          "max_new_tokens": task["max_new_tokens"]}
                name = safe_name(_fill(file_template, fields, path, "'file'"))
                spec = dataclasses.replace(spec, out=results_dir / f"{name}.parquet")
                group = (target, task["label"], temperature, seed)
                group_cells.append(Cell(name, spec, label, task["label"], d["resources"], group))
        # an explicit ar cell leads its group, so the drafters reuse its rows
        group_cells.sort(key=lambda c: c.spec.drafter != runner.BASELINE)
        cells.extend(group_cells)

    if not cells:
        raise UserError(_where(path, "the grid is empty (every drafter's 'tasks'/'targets' excludes every task/target)"))
    by_name: dict[str, Cell] = {}
    for cell in cells:
        if cell.name in by_name:
            other = by_name[cell.name]
            raise UserError(_where(path, f"cells {other.label} x {other.task_label} and {cell.label} x {cell.task_label} "
                                         f"both write {cell.out}; give the drafters distinct labels or widen 'file'"))
        by_name[cell.name] = cell
    for cell in cells:  # every check that needs no model (drafter, --set keys, task, numbers)
        try:
            runner.validate(cell.spec)
        except UserError as exc:
            raise CellError(path, cell.name, str(exc)) from None
    name = _scalar(data, "name", str, path.stem, path, "the top level")
    return Sweep(path, name, results_dir, executor, tuple(cells))


def select(sweep: Sweep, patterns: list[str]) -> Sweep:
    """The sweep narrowed to the cells whose name (the file stem) matches any of ``patterns`` (shell
    globs); every pattern must match a cell. No patterns: the sweep unchanged."""
    if not patterns:
        return sweep
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(c.name, pattern) for c in sweep.cells):
            names = ", ".join(c.name for c in sweep.cells[:6]) + (", ..." if len(sweep.cells) > 6 else "")
            raise UserError(f"--only '{pattern}' matches no cell of {sweep.path} (cells: {names}); "
                            "see `specbench sweep --dry-run` for the names")
    cells = tuple(c for c in sweep.cells if any(fnmatch.fnmatchcase(c.name, p) for p in patterns))
    return dataclasses.replace(sweep, cells=cells)


def _resources(table: Any, default: Resources, path: Path, where: str) -> Resources:
    _check_keys(table, RESOURCE_KEYS, path, where)
    cpus = _scalar(table, "cpus", float, default.cpus, path, where)
    gpus = _scalar(table, "gpus", float, default.gpus, path, where)
    if cpus < 0 or gpus < 0:
        raise UserError(_where(path, f"{where}: cpus and gpus must be >= 0"))
    return Resources(cpus, gpus)


def _task(entry: Any, i: int, top: dict, path: Path) -> dict:
    if isinstance(entry, str):
        entry = {"name": entry}
    where = f"tasks entry {i + 1}"
    _check_keys(entry, TASK_KEYS, path, where)
    name = _scalar(entry, "name", str, None, path, where)
    file = _scalar(entry, "file", str, None, path, where)
    if (name is None) == (file is None):
        raise UserError(_where(path, f"{where} needs exactly one of 'name' (a built-in task) or 'file' (a JSONL task file)"))
    label = _scalar(entry, "label", str, name if name is not None else Path(file).stem, path, where)
    limit = _scalar(entry, "limit", int, top["limit"], path, where)
    return {
        "name": name, "file": None if file is None else Path(file), "label": label,
        "category": _scalar(entry, "category", str, None, path, where),
        "limit": limit, "max_new_tokens": _scalar(entry, "max_new_tokens", int, top["max_new_tokens"], path, where),
    }


def _drafter(entry: dict, i: int, task_labels: list[str], targets: list[str], baseline: bool,
             resources: Resources, path: Path) -> dict:
    where = f"drafters entry {i + 1}"
    name = _scalar(entry, "drafter", str, None, path, where)
    if name is None:
        raise UserError(_where(path, f"{where} has no 'drafter' (see `specbench drafters`)"))
    where = f"drafters entry {i + 1} ({name})"
    _check_keys(entry, DRAFTER_KEYS, path, where)
    options = _check_keys(entry.get("set", {}), _AnyKey(), path, f"'set' of {where}")
    axes: list[tuple[str, list]] = []
    for key, value in options.items():
        values = value if isinstance(value, list) else [value]
        if not values:
            raise UserError(_where(path, f"'set.{key}' of {where} is an empty list"))
        if any(isinstance(v, (list, dict)) for v in values):
            raise UserError(_where(path, f"'set.{key}' of {where}: give a value or a list of values, not nested lists or tables"))
        axes.append((key, values))
    paths = entry.get("path")
    path_values = [None] if paths is None else _as_list(paths, path, f"path of {where}", str)
    label_template = _scalar(entry, "label", str, None, path, where)
    variants = []
    for combo in itertools.product(*(v for _, v in axes)):
        chosen = dict(zip((k for k, _ in axes), combo))
        for drafter_path in path_values:
            pairs = tuple(f"{k}={_option_text(v)}" for k, v in chosen.items())
            fields = {"drafter": name, **{k: _option_text(v) for k, v in chosen.items()}}
            if drafter_path is not None:
                fields["path"] = Path(drafter_path).name
            if label_template is not None:
                label = _fill(label_template, fields, path, f"'label' of {where}")
            else:
                parts = [f"{k}={_option_text(v)}" for k, v in chosen.items()]
                parts += [] if drafter_path is None else [Path(drafter_path).name]
                label = "-".join([name, *parts])
            variants.append((pairs, None if drafter_path is None else Path(drafter_path), label))
    only_tasks = _subset(entry, "tasks", "task", task_labels, path, where)
    only_targets = _subset(entry, "targets", "target", targets, path, where)
    return {
        "drafter": name, "variants": variants, "tasks": only_tasks, "targets": only_targets,
        "baseline": _scalar(entry, "baseline", bool, baseline, path, where),
        "resources": _resources(entry.get("resources", {}), resources, path, f"'resources' of {where}"),
    }


class _AnyKey:
    """Every key is allowed ('set' is checked against the drafter's config by runner.validate)."""

    def __contains__(self, key) -> bool:
        return True

    def __iter__(self):
        return iter(())


# ------------------------------------------------------------------------------------------------
# the state of a cell on disk


# settings a finished file must share with its cell (device and dtype may read "auto" in the file)
_FINISHED_KEYS = ("target", "drafter", "drafter_config", "task", "temperature", "top_p", "top_k", "seed", "max_new_tokens")


def expected_meta(cell: Cell) -> dict:
    from specbench.drafter import config_json, drafter_class, parse_config

    spec = cell.spec
    pairs = list(spec.options) + ([] if spec.drafter_path is None else [f"path={spec.drafter_path}"])
    config = parse_config(drafter_class(spec.drafter).Config, pairs)
    return {"target": spec.target, "drafter": spec.drafter, "drafter_config": config_json(config),
            "task": runner.task_name(spec), "temperature": float(spec.temperature), "top_p": float(spec.top_p),
            "top_k": int(spec.top_k), "seed": int(spec.seed), "max_new_tokens": int(spec.max_new_tokens)}


def cell_state(cell: Cell) -> tuple[str, str]:
    """("done", "") | ("stale", why) for a finished file; ("resume", "") | ("new", "") otherwise."""
    if cell.out.exists():
        mismatch = _finished_mismatch(cell)
        return ("stale", mismatch) if mismatch else ("done", "")
    if any(s.exists() for s in cell.sidecars):
        return ("resume", "")
    return ("new", "")


def _finished_mismatch(cell: Cell) -> str:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(cell.out, columns=list(_FINISHED_KEYS) + ["prompt_id", "turn"])
    except Exception as exc:  # noqa: BLE001 - unreadable or foreign file
        return f"{cell.out} is not a readable specbench results file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    want = expected_meta(cell)
    rows = table.slice(0, 1).to_pylist()
    if not rows:
        return f"{cell.out} holds no rows"
    for key, value in want.items():
        have = rows[0][key]
        same = float(have) == float(value) if key in ("temperature", "top_p") else have == value
        if not same:
            return f"{cell.out} was run with {key}={have!r}, the sweep asks {key}={value!r}"
    want_prompts = len(runner.load_prompts(cell.spec))
    have_prompts = len(set(table.column("prompt_id").to_pylist()))
    if have_prompts != want_prompts:
        return f"{cell.out} holds {have_prompts} prompts, the sweep asks {want_prompts}"
    return ""


# ------------------------------------------------------------------------------------------------
# running cells


def _load_target(spec: runner.RunSpec):
    from specbench.targets import load_target

    return load_target(spec.target, spec.device, spec.dtype, device_map=spec.device_map)


def run_cell(cell: Cell, progress: Callable | None = None) -> CellResult:
    """Run one cell (skip it when finished); every failure becomes a failed CellResult, never raises
    (except KeyboardInterrupt)."""
    start = time.perf_counter()
    try:
        state, why = cell_state(cell)
        if state == "done":
            return CellResult(cell, "skipped")
        if state == "stale":
            raise UserError(f"{why}; delete the file or change the sweep's 'file' template")
        outcome = runner.run(cell.spec, _load_target, progress)
        return CellResult(cell, "done", seconds=time.perf_counter() - start, baseline=outcome.baseline_source)
    except UserError as exc:
        return CellResult(cell, "failed", str(exc), time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - one broken cell must not stop the sweep
        lines = [line for line in str(exc).splitlines() if line.strip()]
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
        return CellResult(cell, "failed", f"{type(exc).__name__}: {lines[0] if lines else ''}{at}",
                          time.perf_counter() - start)


def _run_cell_in_worker(cell: Cell, *after) -> CellResult:
    """A Ray task: one cell with as many torch threads as the CPUs it was given. ``after`` holds the
    results of the cells it waits for (its baseline group's first cell), unused."""
    import torch

    torch.set_num_threads(max(1, int(cell.resources.cpus)))
    return run_cell(cell)


@dataclass
class Events:
    """Callbacks of a sweep: ``start(cell)``, ``finish(result)``, ``cell_progress(done, total, label)``."""

    start: Callable[[Cell], None] = lambda cell: None
    finish: Callable[[CellResult], None] = lambda result: None
    cell_progress: Callable[[int, int, str], None] | None = None


def run_local(sweep: Sweep, events: Events | None = None) -> list[CellResult]:
    events = events or Events()
    out = []
    for cell in sweep.cells:
        events.start(cell)
        result = run_cell(cell, events.cell_progress)
        events.finish(result)
        out.append(result)
    return out


def run_ray(sweep: Sweep, events: Events | None = None, address: str | None = None,
            num_cpus: int | None = None) -> list[CellResult]:
    """Each cell a Ray task with its resources; a baseline group's other cells wait for its first."""
    events = events or Events()
    try:
        import ray
    except ImportError:
        raise UserError("the ray executor needs Ray: pip install 'specbench[ray]' (or use --executor local)") from None
    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        except ConnectionError as exc:
            raise UserError(f"cannot join the Ray cluster at {address} ({exc}); check --address") from None
    try:
        remote = ray.remote(_run_cell_in_worker)
        leaders = sweep.leaders()
        refs: dict[Any, Cell] = {}
        leader_refs: dict[tuple, Any] = {}
        for cell in sweep.cells:
            options = remote.options(num_cpus=cell.resources.cpus, num_gpus=cell.resources.gpus,
                                     max_retries=0, name=f"cell {cell.name}")
            lead = leaders.get(cell.group)
            if lead is not None and lead is not cell and cell.runs_baseline:
                ref = options.remote(_absolute(cell), leader_refs[cell.group])
            else:
                ref = options.remote(_absolute(cell))
                if lead is cell:
                    leader_refs[cell.group] = ref
            refs[ref] = cell
            events.start(cell)
        results: dict[str, CellResult] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                cell = refs[ref]
                try:
                    result = ray.get(ref)
                    result = dataclasses.replace(result, cell=cell)
                except Exception as exc:  # noqa: BLE001 - a worker that died (out of memory, killed)
                    result = CellResult(cell, "failed", f"Ray task failed: {type(exc).__name__}: "
                                                        f"{(str(exc).strip().splitlines() or [''])[-1]}")
                results[cell.name] = result
                events.finish(result)
        return [results[c.name] for c in sweep.cells]
    finally:
        if started_here:
            ray.shutdown()


def _absolute(cell: Cell) -> Cell:
    """The cell with absolute paths, so a worker in another directory writes to the same files."""
    spec = cell.spec
    spec = dataclasses.replace(
        spec, out=Path(spec.out).absolute(), results_dir=Path(spec.results_dir).absolute(),
        task_file=None if spec.task_file is None else Path(spec.task_file).absolute(),
        drafter_path=None if spec.drafter_path is None or not Path(spec.drafter_path).exists()
        else Path(spec.drafter_path).absolute(),
    )
    return dataclasses.replace(cell, spec=spec)


def run_sweep(sweep: Sweep, events: Events | None = None, address: str | None = None) -> list[CellResult]:
    if sweep.executor == "ray":
        return run_ray(sweep, events, address)
    return run_local(sweep, events)


def describe(sweep: Sweep) -> list[dict[str, str]]:
    """One dict per cell for `--dry-run`: its number, file, settings, state on disk, baseline role."""
    leaders = sweep.leaders()
    number = {cell.name: i + 1 for i, cell in enumerate(sweep.cells)}
    rows = []
    for cell in sweep.cells:
        spec = cell.spec
        state, why = cell_state(cell)
        if not cell.runs_baseline:
            role = "-" if spec.drafter != runner.BASELINE else "is AR"
        elif leaders.get(cell.group) is cell:
            role = "runs AR"
        else:
            role = f"AR of #{number[leaders[cell.group].name]}"
        options = " ".join(spec.options) + ("" if spec.drafter_path is None else f" path={spec.drafter_path}")
        rows.append({
            "#": str(number[cell.name]), "cell (file stem)": cell.name, "drafter": spec.drafter, "options": options.strip() or "-",
            "T": f"{spec.temperature:g}", "seed": str(spec.seed), "limit": "all" if spec.limit is None else str(spec.limit),
            "max new": str(spec.max_new_tokens), "state": state + (f": {why}" if why else ""), "baseline": role,
        })
    return rows


def describe_view(sweep: Sweep, width: int) -> list[RenderableType]:
    """What `--dry-run` prints in a terminal ``width`` columns wide: a table of the cells, with the settings
    every cell shares in a line under it instead of a column repeated down the page; where even that
    table would cut words (long checkpoint paths in 80 columns), one record per cell."""
    rows = describe(sweep)
    title = f"{sweep.name}: {len(rows)} cells → {sweep.results_dir} (executor {sweep.executor})"
    keys = ["#", "cell (file stem)", "state", "baseline"]
    shared = [c for c in rows[0] if c not in keys and len(rows) > 1 and len({row[c] for row in rows}) == 1]
    shown = [c for c in rows[0] if c not in shared]
    note = ("every cell: " + " · ".join(f"{c} {rows[0][c]}" for c in shared)) if shared else None
    table = Table(title=title, caption=note, caption_justify="left")
    for column in shown:
        table.add_column(column)
    for row in rows:
        table.add_row(*(row[c] for c in shown))
    if report.fits(table, width):
        return [table]
    heads = [f"#{row['#']} {row['cell (file stem)']} · {row['state']} · baseline: {row['baseline']}" for row in rows]
    fields = [[f"{c} {row[c]}" for c in shown if c not in keys] for row in rows]
    return [Text(title), *report.record_lines(heads, fields, width, note)]


__all__ = ["Cell", "CellResult", "Events", "Resources", "Sweep", "cell_state", "describe", "describe_view", "load_sweep",
           "run_cell", "run_local", "run_ray", "run_sweep"]
