"""`specbench run` as a library call: prompts -> (baseline and drafter, interleaved) -> result rows.

Fairness rules kept here:

* the AR baseline runs through the same decoding loop and target code as the drafter;
* when the baseline is run (not reused), it is interleaved prompt by prompt with the drafter, so
  slow drift of a noisy machine hits both alike;
* both get one untimed warm-up generation first;
* at temperature > 0 every (prompt, turn) gets its own random stream seeded from (seed, prompt id,
  turn), so a resumed run draws what the uninterrupted one would have.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specbench import results
from specbench.decode import Generation, generate
from specbench.drafter import Sampling, UserError, config_json, drafter_class, parse_config, takes_checkpoint
from specbench.tasks import Prompt, load_task, load_task_file, render_chat, select

BASELINE = "ar"


@dataclass(frozen=True)
class RunSpec:
    drafter: str = "ngram"
    target: str = "smollm2-135m"
    task: str | None = "humaneval"
    task_file: Path | None = None
    category: str | None = None
    limit: int | None = None
    seed: int = 0
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    options: tuple[str, ...] = ()  # --set key=value
    drafter_path: Path | None = None
    device: str = "auto"
    dtype: str = "auto"
    out: Path | None = None
    results_dir: Path = Path("results")
    resume: bool = False
    baseline: bool = True
    warmup: bool = True
    shard: tuple[int, int] | None = None  # (rank, world size) of a data-parallel run: prompts[rank::world]
    device_map: str | None = None  # accelerate's placement of the target over the GPUs, e.g. "auto"
    compile: bool = False  # the target on a static cache, its tree forward compiled into CUDA graphs (specbench.static)


@dataclass
class RunOutcome:
    out: Path
    baseline_out: Path | None
    rows: list[dict] = field(default_factory=list)
    baseline_rows: list[dict] | None = None
    baseline_source: str = ""  # "ran", "reused <file>", or "" when skipped


def check_numbers(spec: RunSpec) -> None:
    if spec.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {spec.max_new_tokens}")
    if spec.temperature < 0:
        raise UserError(f"--temperature must be >= 0 (0 = greedy), got {spec.temperature}")
    if not 0 < spec.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {spec.top_p}")
    if spec.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0 = off), got {spec.top_k}")
    if spec.limit is not None and spec.limit < 1:
        raise UserError(f"--limit must be at least 1 (0 = all prompts), got {spec.limit}")


def load_prompts(spec: RunSpec) -> list[Prompt]:
    if spec.task_file is not None:
        prompts = load_task_file(spec.task_file)
    elif spec.task is not None:
        prompts = load_task(spec.task, spec.category)
    else:
        raise UserError("give --task NAME or --task-file FILE.jsonl (see `specbench tasks`)")
    prompts = select(prompts, spec.limit, spec.seed)
    if spec.shard is not None:  # the same subset on every rank, then every world-th prompt
        rank, world = spec.shard
        prompts = prompts[rank::world]
    return prompts


def task_name(spec: RunSpec) -> str:
    if spec.task_file is not None:
        return f"file:{Path(spec.task_file).stem}"
    return spec.task if spec.category is None else f"{spec.task}/{spec.category}"


def default_run_id(spec: RunSpec) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    raw = f"{spec.target}_{task_name(spec)}_{spec.drafter}_{stamp}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)


def option_pairs(options: tuple[str, ...], drafter_path: Path | None) -> list[str]:
    """The drafter's ``--set`` pairs, with ``--drafter-path`` last (it wins over a ``--set path=``)."""
    return list(options) + ([f"path={drafter_path}"] if drafter_path is not None else [])


def build_drafter(name: str, target, options: tuple[str, ...], drafter_path: Path | None):
    cls = drafter_class(name)  # validate() has checked that the drafter takes a checkpoint if one is given
    config = parse_config(cls.Config, option_pairs(options, drafter_path))
    return cls(target, config), config


class _Session:
    """One drafter on one target over the prompts; turns run in order, turn 2 sees answer 1."""

    def __init__(self, spec: RunSpec, target, drafter, drafter_name: str, config, run_id: str, env: dict):
        self.spec, self.target, self.drafter = spec, target, drafter
        self.meta = {
            "run_id": run_id,
            "target": spec.target,
            "drafter": drafter_name,
            "drafter_config": config_json(config),
            # which weights ran: sha256 of the files read (or of in-memory weights) and where from
            "checkpoint_hash": None if drafter.checkpoint is None else drafter.checkpoint.sha256,
            "checkpoint_path": None if drafter.checkpoint is None else drafter.checkpoint.path,
            "task": task_name(spec),
            "temperature": float(spec.temperature),
            "top_p": float(spec.top_p),
            "top_k": int(spec.top_k),
            "seed": int(spec.seed),
            "max_new_tokens": int(spec.max_new_tokens),
            **env,
        }

    def sampling(self, prompt_id: str, turn: int) -> Sampling:
        if self.spec.temperature == 0:
            return Sampling()
        gen = torch.Generator(device=self.target.device)
        gen.manual_seed(self.spec.seed * 1_000_003 + zlib.crc32(f"{prompt_id}#{turn}".encode()))
        return Sampling(self.spec.temperature, self.spec.top_p, self.spec.top_k, gen)

    def run_prompt(self, prompt: Prompt) -> list[dict]:
        messages: list[dict[str, str]] = []
        rows = []
        for turn, text in enumerate(prompt.turns):
            messages.append({"role": "user", "content": text})
            ids = render_chat(self.target.tokenizer, messages)
            check_fits(self.target, prompt.id, len(ids))
            gen = generate(
                self.target, self.drafter, torch.tensor(ids, dtype=torch.long), self.spec.max_new_tokens,
                self.sampling(prompt.id, turn),
            )
            rows.append(self.row(prompt, turn, ids, gen))
            answer = self.target.tokenizer.decode(gen.output_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
        return rows

    def row(self, prompt: Prompt, turn: int, prompt_ids: list[int], gen: Generation) -> dict:
        steps = gen.steps
        return {
            **self.meta,
            "category": prompt.category,
            "prompt_id": prompt.id,
            "turn": turn,
            "prompt_ids": list(prompt_ids),
            "output_ids": list(gen.output_ids),
            "n_new_tokens": len(gen.output_ids),
            "n_steps": len(steps),
            "accepted_per_step": [s.accepted for s in steps],
            "tree_size_per_step": [s.tree_size for s in steps],
            "tree_depth_per_step": [s.tree_depth for s in steps],
            "drafter_forwards_per_step": [s.drafter_forwards for s in steps],
            "prefill_s": gen.prefill_s,
            "decode_s": gen.decode_s,
            "draft_s": sum(s.draft_s for s in steps),
            "verify_s": sum(s.verify_s for s in steps),
            "other_s": sum(s.other_s for s in steps),
            "load_1min": results.load_average(),
            "margin_ulps_per_token": gen.margin_ulps,
            "runner_up_per_token": gen.runner_up,
            # the drafter's own decision records since the previous row (warm-up's go to the first row)
            **({} if (log := self.drafter.take_log()) is None else {"drafter_log": json.dumps(log, sort_keys=True)}),
        }

    def warmup(self, prompt: Prompt) -> None:
        ids = render_chat(self.target.tokenizer, [{"role": "user", "content": prompt.turns[0]}])
        check_fits(self.target, prompt.id, len(ids))
        generate(self.target, self.drafter, torch.tensor(ids, dtype=torch.long), 8, self.sampling("warmup", 0))


def check_fits(target, prompt_id: str, n_tokens: int) -> None:
    if n_tokens >= target.max_context:
        raise UserError(
            f"prompt '{prompt_id}' has {n_tokens} tokens, more than {target.name}'s context of {target.max_context}; "
            "shorten it or drop it from the task file"
        )


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(spec: RunSpec) -> None:
    if spec.device_map is None:
        return
    if spec.device_map not in DEVICE_MAPS:
        raise UserError(f"unknown --device-map '{spec.device_map}'; use one of {', '.join(DEVICE_MAPS)}")
    if not torch.cuda.is_available():
        raise UserError("--device-map spreads the target over GPUs and this machine has none (CPU only); drop --device-map")
    if spec.device != "auto":
        raise UserError(f"--device-map places the target itself; drop --device {spec.device}")


def placement(device_map: str, model) -> str:
    """``auto: cuda:0, cuda:1`` — the strategy and the devices accelerate put the target's layers on."""
    devices = (getattr(model, "hf_device_map", None) or {}).values()
    where = sorted({f"cuda:{d}" if isinstance(d, int) else str(d) for d in devices})
    return f"{device_map}: {', '.join(where) or 'unknown'}"


def validate(spec: RunSpec) -> list[Prompt]:
    """Every check that needs no model: numbers, device and dtype names, prompts, drafter name and --set keys.
    Cheap."""
    from specbench.targets import check_dtype, parse_device

    check_numbers(spec)
    parse_device(spec.device)
    check_dtype(spec.dtype)
    check_device_map(spec)
    if spec.compile:
        from specbench.static import check_compile
        from specbench.targets import pick_device

        check_compile(pick_device(spec.device))
    prompts = load_prompts(spec)
    cls = drafter_class(spec.drafter)
    parse_config(cls.Config, list(spec.options))
    if spec.drafter_path is not None and not takes_checkpoint(cls):
        raise UserError(f"drafter '{spec.drafter}' loads no checkpoint; drop --drafter-path")
    if spec.resume and spec.out is None:
        raise UserError("--resume needs --out FILE.parquet of the interrupted run")
    if spec.out is not None and Path(spec.out).suffix != ".parquet":
        raise UserError(f"--out must end in .parquet, got '{spec.out}'")
    return prompts


def check_checkpoint_exists(spec: RunSpec) -> None:
    """A checkpoint folder that does not exist fails here, before the target is fetched and loaded (a real
    target's first use downloads and converts it): ``--drafter-path``, or else the last ``--set path=...``
    (the drafter reads the same value; ``auto`` and ``random`` name no folder). Not part of :func:`validate`:
    a sweep file may name heads that its own training steps have not written yet, and it is checked when
    the cell runs."""
    config = parse_config(drafter_class(spec.drafter).Config, option_pairs(spec.options, spec.drafter_path))
    path = getattr(config, "path", None)  # the value build_drafter will hand the drafter
    if path is not None and str(path) not in ("auto", "random"):
        from drafters.common.loading import require_folder
        from drafters.common.locate import checkpoint_dir  # where the drafter itself will look

        require_folder(checkpoint_dir(path), f"{spec.drafter} checkpoint '{path}'")


def run(spec: RunSpec, load_target: Callable, progress: Callable | None = None) -> RunOutcome:
    """Run ``spec``; ``load_target(spec)`` returns a Target; ``progress(done, total, label)`` reports."""
    prompts = validate(spec)
    check_checkpoint_exists(spec)
    out = Path(spec.out) if spec.out is not None else Path(spec.results_dir) / f"{default_run_id(spec)}.parquet"
    writer = results.RunWriter(out, resume=spec.resume, flag="--out" if spec.out is not None else "--results-dir")

    target = load_target(spec)
    if spec.compile:  # drafter and AR baseline alike run on the static, compiled target
        from specbench.static import bucket, make_static

        longest = max((sum(len(target.tokenizer.encode(t)) for t in p.turns) + 64 * len(p.turns)
                       + spec.max_new_tokens * len(p.turns) for p in prompts), default=0)
        target = make_static(target, True, max_len=min(bucket(longest + 512), target.max_context + 1))
    env = results.env_fingerprint(str(target.device.type), str(target.dtype).removeprefix("torch."))
    if spec.device_map is not None:  # an extra fingerprint column, only on runs that use one
        env["device_map"] = placement(spec.device_map, target.model)
    if spec.compile:  # likewise: how the target forward ran
        env["target_mode"] = target.mode
    run_id = out.stem
    drafter, config = build_drafter(spec.drafter, target, spec.options, spec.drafter_path)
    session = _Session(spec, target, drafter, spec.drafter, config, run_id, env)
    writer.check_compatible(session.meta)
    for p in prompts:  # a prompt longer than the context is an error before any work is done
        check_fits(target, p.id, len(render_chat(target.tokenizer, [{"role": "user", "content": p.turns[0]}])))

    outcome = RunOutcome(out=out, baseline_out=None)
    base_session = base_writer = None
    if spec.baseline and spec.drafter != BASELINE:
        keys = {(p.id, t) for p in prompts for t in range(len(p.turns))}
        # a compiled run always measures its own baseline on the same compiled target
        found = None if spec.compile else find_baseline(Path(spec.results_dir), session.meta, keys)
        if found is not None:
            outcome.baseline_rows, outcome.baseline_source = found
        else:
            base_drafter, base_config = build_drafter(BASELINE, target, (), None)
            base_out = results.baseline_path(out)
            base_writer = results.RunWriter(base_out, resume=spec.resume)
            base_session = _Session(spec, target, base_drafter, BASELINE, base_config, base_out.stem, env)
            base_writer.check_compatible(base_session.meta)  # its partial rows may be all there is
            outcome.baseline_out = base_out
            outcome.baseline_source = "ran"

    todo = [p for p in prompts if (p.id, 0) not in writer.done]
    if spec.warmup and todo:
        if base_session is not None:
            base_session.warmup(todo[0])
        session.warmup(todo[0])
    done = len(prompts) - len(todo)
    if progress:
        progress(done, len(prompts), "")
    for p in prompts:
        if base_session is not None and (p.id, 0) not in base_writer.done:
            base_writer.add(base_session.run_prompt(p))
        if (p.id, 0) not in writer.done:
            writer.add(session.run_prompt(p))
            done += 1
            if progress:
                progress(done, len(prompts), p.id)
    if base_writer is not None:
        base_writer.finish()
        outcome.baseline_rows = list(base_writer.rows)
    writer.finish()
    outcome.rows = list(writer.rows)
    return outcome


def find_baseline(results_dir: Path, meta: dict, keys: set) -> tuple[list[dict], str] | None:
    """A finished AR run in the results folder with the same settings covering every prompt."""
    from specbench import report

    df = report.find_baseline(results_dir, {**meta, "keys": keys})
    if df is None or df.empty:
        return None
    source = df["run_id"].iloc[0] if "run_id" in df.columns else "results folder"
    return df.to_dict("records"), f"reused {source}"
