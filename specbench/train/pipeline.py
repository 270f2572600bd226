"""`specbench train` as a library call: data -> (self-distillation) -> features -> trainer -> checkpoint.

Every learned drafter goes through :func:`run_training` with the same data, split and token budget
(those are harness settings, not recipe settings); a family only supplies its trainable
(``DrafterClass.trainer()``) and recipe. The output directory holds:

* the checkpoint in the family's released layout (EAGLE-3: config.json + model.safetensors);
* ``training.json``: the job, the recipe, data and cost figures, final held-out metrics, hardware;
* ``train_log.jsonl``: one line per optimizer step (and held-out metrics on evaluation steps);
* ``trainer_state.pt``: what a rerun of the same command resumes from.

Data-parallel: ``torchrun --nproc-per-node N -m specbench train ...`` runs the same job on N
processes (gloo on CPU, NCCL on CUDA, one GPU per process: ``cuda:LOCAL_RANK``). Rank 0 regenerates
answers and builds the feature caches first while the others wait, then they reuse those caches
(one node, or a filesystem the ranks share); the trainer splits every global batch into
``recipe.shards`` shards (0, the default under torchrun, = one per process) and sums the gradients
(see :mod:`specbench.train.trainer`), so the steps are those of one process with the same
``shards``. Rank 0 alone writes the checkpoint, ``training.json`` and the card.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specbench.drafter import UserError, drafter_class, parse_config
from specbench.outputs import check_folder
from specbench.train.data import TRAIN_SETS

JOB_FILE = "training.json"
LOCK_FILE = ".train.lock"  # held (flock) by the process training into the folder; holds its pid
DEFAULT_BUDGET_TOKENS = 20_000
DEFAULT_HELDOUT_TOKENS = 6_000


@dataclass(frozen=True)
class TrainJob:
    drafter: str = "eagle3"
    target: str = "smollm2-135m"
    data: tuple[str, ...] = tuple(TRAIN_SETS)
    budget_tokens: int = DEFAULT_BUDGET_TOKENS  # assistant (loss) tokens of training data
    heldout_tokens: int = DEFAULT_HELDOUT_TOKENS  # assistant tokens of held-out data (evaluation)
    holdout_fraction: float = 0.02
    regenerate: bool | None = None  # None = the recipe's default
    options: tuple[str, ...] = ()  # --set key=value on the recipe
    out: Path = Path("checkpoints/eagle3")
    device: str = "auto"
    max_new_tokens: int = 256  # self-distillation answer cap
    data_seed: int = 0


@dataclass(frozen=True)
class Progress:
    """What the pipeline reports to a display: a stage name and its counts."""

    stage: str  # "regenerate", "heldout", "features", "train"
    done: int
    total: int
    fields: dict[str, Any] = field(default_factory=dict)


def trainer_of(name: str):
    training = drafter_class(name).training()
    if training is None:
        raise UserError(f"drafter '{name}' has no training recipe; `specbench train` works for learned drafters")
    return training


def validate(job: TrainJob) -> tuple[type, Any]:
    """User errors before anything loads: returns (trainable class, recipe), the recipe's ``shards``
    resolved (0 = one per process: the torchrun world size, 1 alone)."""
    from specbench.distributed import from_env

    training = trainer_of(job.drafter)
    recipe = parse_config(training.Recipe, list(job.options))
    world = from_env()
    n_procs = 1 if world is None else world.size
    if recipe.shards == 0:
        recipe = dataclasses.replace(recipe, shards=n_procs)
    if recipe.shards % n_procs:
        raise UserError(f"--set shards={recipe.shards} cannot be spread over {n_procs} processes; "
                        f"use a multiple of {n_procs} (or 0: one shard per process)")
    if world is not None and job.device.startswith("cuda:"):
        raise UserError(f"--device {job.device} under torchrun puts every process on one GPU; "
                        "use --device auto or cuda (each process takes cuda:LOCAL_RANK)")
    if world is not None and job.device in ("auto", "cuda") and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world.size))
        if local > torch.cuda.device_count():
            raise UserError(f"{local} processes on this node but {torch.cuda.device_count()} GPU(s); NCCL needs one GPU "
                            f"per process: use --nproc-per-node {torch.cuda.device_count()} or fewer (or --device cpu)")
    if job.budget_tokens <= 0 or job.heldout_tokens <= 0:
        raise UserError("--budget-tokens and --heldout-tokens must be positive")
    unknown = [d for d in job.data if d not in TRAIN_SETS]
    if unknown or not job.data:
        raise UserError(f"unknown training set {', '.join(map(repr, unknown)) or '(none)'}; choose from: {', '.join(TRAIN_SETS)}")
    training.preflight(recipe, job.target)  # a family's own checks that need no model (e.g. a required checkpoint)
    if job.out.exists() and not job.out.is_dir():
        raise UserError(f"--out '{job.out}' is a file; pass a directory for the checkpoint")
    previous = job.out / JOB_FILE
    if previous.exists():
        try:
            before = json.loads(previous.read_text())["job"]
        except (json.JSONDecodeError, KeyError):
            raise UserError(f"--out '{job.out}' holds an unreadable {JOB_FILE}; choose another --out") from None
        before, now = _resumable(before), _resumable(_job_dict(job, recipe))
        if before != now:
            changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            raise UserError(f"--out '{job.out}' holds a training run with other settings ({', '.join(changed)}); "
                            "rerun with the same settings to resume, or choose a new --out")
    check_folder(job.out, "--out", "the checkpoint")  # a folder under a file, or read-only: one line, not a traceback
    return training, recipe


def _resumable(job: dict) -> dict:
    """A job as compared for resuming: bookkeeping (how often state is saved) may change between calls."""
    from specbench.train.trainer import BOOKKEEPING

    job = {**job, "recipe": {k: v for k, v in job.get("recipe", {}).items() if k not in BOOKKEEPING}}
    job["options"] = [o for o in job.get("options", []) if o.split("=", 1)[0].strip() not in BOOKKEEPING]
    return job


def _job_dict(job: TrainJob, recipe: Any) -> dict:
    from specbench.train.trainer import recipe_key

    d = dataclasses.asdict(job)
    d.pop("out")
    d.pop("device")
    d["data"] = list(job.data)
    d["options"] = list(job.options)
    d["recipe"] = recipe_key(recipe)
    d["regenerate"] = _regen_flag(job, recipe)
    return d


def _regen_flag(job: TrainJob, recipe: Any) -> bool:
    return bool(recipe.regenerate) if job.regenerate is None else job.regenerate


def _digest_ids(ids: list[list[int]], masks: list[list[int]]) -> str:
    h = hashlib.sha256()
    for x, m in zip(ids, masks):
        h.update(json.dumps([x, m]).encode())
    return h.hexdigest()


def _prepare(ds, target, budget: int, max_length: int, seed: int):
    """Tokenized, budget-selected rows: (input_ids, loss_mask)."""
    from specbench.train.data import _column, budget_select, tokenize_dataset

    tok = tokenize_dataset(ds, target.tokenizer, max_length)
    total = sum(_column(tok, "n_loss_tokens"))
    chosen = budget_select(tok, min(budget, total), seed=seed)
    return _column(chosen, "input_ids"), _column(chosen, "loss_mask")


def run_training(job: TrainJob, load_target: Callable[[TrainJob], Any],
                 progress: Callable[[Progress], Any] | None = None, stop_after: int | None = None,
                 command: str = "") -> dict:
    """Run ``job``; returns the summary also written to ``training.json`` (and ``TRAINING.md``).

    ``command`` is the command line to record (the CLI passes its own). Under torchrun every rank
    calls this; rank 0 alone reports ``progress`` and writes files.
    """
    from specbench.distributed import from_env

    training, recipe = validate(job)
    world = from_env()
    if world is None:
        with exclusive_run(job.out):
            return _run(job, training, recipe, load_target, progress, stop_after, command, None)
    import torch.distributed as dist

    device = _rank_device(job.device, world)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", timeout=_dt.timedelta(hours=48))
    try:  # rank 0 writes the folder, so it holds the lock (torchrun stops the others if it is refused)
        with exclusive_run(job.out) if world.rank == 0 else contextlib.nullcontext():
            return _run(dataclasses.replace(job, device=device), training, recipe, load_target,
                        progress if world.rank == 0 else None, stop_after, command, world)
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def exclusive_run(out: Path):
    """Hold ``out``'s training lock for the call, so a second `specbench train --out` on the same folder (a
    resume command or script rerun while the first run still trains) is refused in one line instead of
    training over the first run's checkpoints. An advisory ``flock``: the system releases it when the process
    ends, however it ends, so a stale lock file never blocks a resume. (Where there is no ``fcntl``, as on
    Windows, there is no lock.)"""
    try:
        import fcntl
    except ImportError:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK_FILE, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip()
            raise UserError(f"--out '{out}' is being trained by another process{f' (pid {holder})' if holder else ''}; "
                            "wait for it to finish or stop it, then rerun the same command to resume, "
                            "or give another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield  # closing the file releases the lock


def _rank_device(device: str, world) -> str:
    """This rank's device: ``auto`` and ``cuda`` take ``cuda:LOCAL_RANK`` when there are GPUs."""
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{world.local_rank}"  # validate() checked there is one GPU per local process
    return "cpu" if device == "auto" else device


def _rank0_first(world, fn: Callable[[], Any]) -> Any:
    """``fn()`` on rank 0 while the others wait, then on the others (which find rank 0's caches)."""
    if world is None:
        return fn()
    import torch.distributed as dist

    if world.rank == 0:
        out = fn()
        dist.barrier()
        return out
    dist.barrier()
    return fn()


def _write_job_file(out: Path, content: dict) -> None:
    """Replace the job file in one step, so a reader (a resume, another rank's validate) never sees half of it."""
    tmp = out / (JOB_FILE + ".tmp")
    tmp.write_text(json.dumps(content, indent=2, default=str) + "\n")
    tmp.replace(out / JOB_FILE)


def _run(job: TrainJob, training, recipe, load_target, progress, stop_after, command, world) -> dict:
    from specbench.fetch import cache_root
    from specbench.results import env_fingerprint
    from specbench.train.data import load_conversations, split_holdout
    from specbench.train.features import build_feature_cache
    from specbench.train.probe import root_probe
    from specbench.train.regenerate import RegenConfig, regenerate, target_digest
    from specbench.train.trainer import TokenizedSet, train

    lead = world is None or world.rank == 0
    report = progress or (lambda p: None)
    previous_seconds = 0.0
    # Only the lead process reads and writes the job file (other ranks would race its rewrite).
    if lead and (job.out / JOB_FILE).exists():  # a resumed run: wall time adds up over the calls
        previous_seconds = float(json.loads((job.out / JOB_FILE).read_text()).get("seconds", {}).get("all_calls", 0.0))
    wall_start = time.perf_counter()
    job.out.mkdir(parents=True, exist_ok=True)
    if lead and not (job.out / JOB_FILE).exists():  # the settings first, so a rerun with others is refused
        _write_job_file(job.out, {"job": _job_dict(job, recipe), "finished": False})
    target = load_target(job)
    torch.manual_seed(recipe.seed)
    digest = target_digest(target)
    split = split_holdout(load_conversations(list(job.data)), job.holdout_fraction, seed=job.data_seed)
    regen = _regen_flag(job, recipe)
    regen_stats = {}
    if regen:
        cfg = RegenConfig(max_new_tokens=job.max_new_tokens, seed=job.data_seed)
        train_ds, st = _rank0_first(world, lambda: regenerate(
            split.train, target, cache_root() / "regen", job.budget_tokens, recipe.max_length, cfg,
            lambda d, t: report(Progress("regenerate", d, t))))
        held_ds, sth = _rank0_first(world, lambda: regenerate(
            split.heldout, target, cache_root() / "regen", job.heldout_tokens, recipe.max_length, cfg,
            lambda d, t: report(Progress("regenerate held-out", d, t))))
        regen_stats = {"train": dataclasses.asdict(st), "heldout": dataclasses.asdict(sth)}
        if st.loss_tokens < job.budget_tokens:
            raise UserError(f"the training sets hold only {st.loss_tokens:,} regenerated loss tokens, less than "
                            f"--budget-tokens {job.budget_tokens:,}; lower the budget or add sets")
    else:
        train_ds, held_ds = split.train, split.heldout
    report(Progress("tokenize", 0, 2))
    train_ids, train_mask = _prepare(train_ds, target, job.budget_tokens, recipe.max_length, job.data_seed)
    report(Progress("tokenize", 1, 2))
    held_ids, held_mask = _prepare(held_ds, target, job.heldout_tokens, recipe.max_length, job.data_seed)
    report(Progress("tokenize", 2, 2))

    trainable = training(target, recipe, train_ids, train_mask)
    feature_start = time.perf_counter()
    caches = {}
    for name, ids, masks in (("train", train_ids, train_mask), ("heldout", held_ids, held_mask)):
        caches[name] = _rank0_first(world, lambda name=name, ids=ids, masks=masks: build_feature_cache(
            target, ids, trainable.cache_layers, cache_root() / "features", target_digest=digest,
            data_fingerprint=_digest_ids(ids, masks), batch_tokens=2048,
            progress=lambda d, t, n=name: report(Progress(f"features ({n})", d, t))))
    feature_seconds = time.perf_counter() - feature_start
    train_set = TokenizedSet(train_ids, train_mask, caches["train"])
    held_set = TokenizedSet(held_ids, held_mask, caches["heldout"])

    device = target.device
    data_key = _digest_ids(train_ids, train_mask) + _digest_ids(held_ids, held_mask)
    result = train(trainable, train_set, held_set, job.out, data_key, device,
                   on_step=lambda r: report(Progress("train", r.step, r.total_steps, {"report": r})),
                   stop_after=stop_after, world=world)
    done = result.steps >= result.total_steps
    weights_sha256 = None
    if done and lead:
        from specbench.train.curve import checkpoint_hash

        trainable.save(job.out)
        weights_sha256 = checkpoint_hash(job.out)  # what a benchmark row records as its checkpoint_hash
    summary = {
        "job": _job_dict(job, recipe),
        "finished": done,
        "checkpoint_sha256": weights_sha256,  # names the weights even where only this card is kept
        "steps": result.steps,
        "train_conversations": len(train_ids),
        "train_loss_tokens": int(sum(map(sum, train_mask))),
        "train_tokens": int(sum(map(len, train_ids))),
        "heldout_conversations": len(held_ids),
        "heldout_loss_tokens": int(sum(map(sum, held_mask))),
        "tokens_seen": result.train_tokens_seen,
        "command": portable_command(command),
        "seconds": {"all_calls": previous_seconds + time.perf_counter() - wall_start,
                    "total_this_call": time.perf_counter() - wall_start, "features_this_call": feature_seconds,
                    "train_this_call": result.seconds, "train_all_calls": result.seconds_all_calls,
                    "regenerate_this_call": regen_stats.get("train", {}).get("seconds", 0.0)
                    + regen_stats.get("heldout", {}).get("seconds", 0.0)},
        "resumed_from_step": result.resumed_from,
        "regenerate": regen_stats,
        "heldout": result.heldout,
        "root_probe": root_probe(result.heldout),  # block families (None for the others)
        "feature_cache": {k: portable_path(v.path) for k, v in caches.items()},
        "hardware": {**env_fingerprint(str(device), str(target.dtype).removeprefix("torch.")),
                     "machine": platform.machine(), "processes": 1 if world is None else world.size},
    }
    if not lead:
        return summary
    job.out.mkdir(parents=True, exist_ok=True)
    _write_job_file(job.out, summary)
    if done:
        (job.out / "TRAINING.md").write_text(training_card(summary))
    return summary


SNAPSHOT_FILE = "snapshot.json"


def snapshot(run_dir: Path, dest: Path, load_target: Callable[[str], Any]) -> dict:
    """Write the weights of ``run_dir``'s last saved state (``trainer_state.pt``, written every
    ``save_every`` steps) into ``dest`` in the family's checkpoint layout, so an unfinished run can be
    decoded or replayed like a finished one; ``dest/snapshot.json`` says which step. ``load_target(name)``
    loads the run's target (it gives the module's shapes), once the job file is read. Returns that record."""
    from specbench.train.trainer import STATE_FILE

    try:
        job = json.loads((run_dir / JOB_FILE).read_text())["job"]
    except (OSError, json.JSONDecodeError, KeyError):
        raise UserError(f"'{run_dir}' holds no readable {JOB_FILE}; give the --out folder of a `specbench train` run") from None
    if not (run_dir / STATE_FILE).exists():
        raise UserError(f"'{run_dir}' has no {STATE_FILE} yet (it is written every save_every steps); try again later")
    target = load_target(job["target"])
    training = trainer_of(job["drafter"])
    recipe = parse_config(training.Recipe, list(job["options"]))
    state = torch.load(run_dir / STATE_FILE, map_location="cpu", weights_only=False)
    # placeholder data: it only seeds a reduced vocabulary's maps, which the saved state replaces
    ids = [list(range(target.vocab_size))]
    trainable = training(target, recipe, ids, [[1] * len(ids[0])])
    trainable.module.load_state_dict(state["module"])
    dest.mkdir(parents=True, exist_ok=True)
    trainable.save(dest)
    record = {"run": run_dir.name, "drafter": job["drafter"], "target": job["target"], "step": int(state["step"]),
              "tokens_seen": int(state["tokens_seen"]), "options": job["options"]}
    (dest / SNAPSHOT_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def portable_path(path: Path | str) -> str:
    """A cache path as ``$SPECBENCH_CACHE/...`` (the same on every machine); any other path unchanged."""
    from specbench.fetch import CACHE_ENV, cache_root

    try:
        return f"${CACHE_ENV}/" + Path(path).resolve().relative_to(cache_root().resolve()).as_posix()
    except ValueError:
        return str(path)


def portable_command(command: str) -> str:
    """The recorded command without this machine's paths: an absolute ``--out`` becomes its folder's
    name (the card lives in that folder) and a cache path ``$SPECBENCH_CACHE/...``."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        return command
    out = []
    for i, word in enumerate(words):
        if i and words[i - 1] == "--out" and Path(word).is_absolute():
            word = Path(word).name
        elif word.startswith("--out=") and Path(word[6:]).is_absolute():
            word = "--out=" + Path(word[6:]).name
        elif Path(word).is_absolute():
            word = portable_path(word)
        out.append(word)
    from specbench.fetch import CACHE_ENV

    return " ".join(w if w.startswith(f"${CACHE_ENV}/") else shlex.quote(w) for w in out)


def training_card(summary: dict) -> str:
    """TRAINING.md: how a checkpoint was made, from its training.json."""
    job, hw, secs = summary["job"], summary["hardware"], summary["seconds"]
    regen = summary.get("regenerate") or {}
    lines = [
        f"# {job['drafter']} head for `{job['target']}`",
        "",
        "Written by `specbench train` from `training.json` (which holds every figure below and more).",
        "",
        "## Command",
        "",
        "```bash",
        summary.get("command") or "(not recorded)",
        "```",
        "",
        "## Data",
        "",
        f"- Training sets: {', '.join(job['data'])} (vendored, see `specbench train-sets`), held-out share "
        f"{job['holdout_fraction']:.0%} by a hash of each conversation id.",
        f"- Token budget: {job['budget_tokens']:,} assistant tokens requested; {summary['train_loss_tokens']:,} assistant "
        f"tokens in {summary['train_conversations']:,} conversations ({summary['train_tokens']:,} tokens with prompts), "
        f"{job['recipe']['epochs']} epochs.",
        f"- Held-out: {summary['heldout_loss_tokens']:,} assistant tokens in {summary['heldout_conversations']} conversations.",
    ]
    if job["regenerate"]:
        tr = regen.get("train", {})
        lines.append(
            f"- Answers regenerated by the target (greedy, first exchange of each conversation, at most "
            f"{job['max_new_tokens']} new tokens); {tr.get('n_unfinished', '?')} of {tr.get('n_conversations', '?')} "
            "answers hit that cap. Generation time is in the regeneration cache's first run, not in the wall time "
            "below when the cache already held the answers."
        )
    else:
        lines.append("- Answers as in the data sets (not regenerated).")
    lines += [
        "",
        "## Recipe",
        "",
        "```json",
        json.dumps(job["recipe"], indent=2, sort_keys=True),
        "```",
        "",
        "## Cost",
        "",
        f"- Wall time: {secs['all_calls'] / 60:.1f} min over the calls that ran to their end (last call: features "
        f"{secs['features_this_call']:.0f} s, training {secs['train_this_call']:.0f} s, regeneration "
        f"{secs['regenerate_this_call']:.0f} s)." + (
            f" Training alone took {secs['train_all_calls'] / 60:.1f} min over all calls, interrupted ones included "
            "(each checkpoint records it; steps an interruption threw away are not counted)."
            if "train_all_calls" in secs else ""),
        f"- Hardware: {hw.get('device_name')} / {hw.get('cpu_model')}, {hw.get('threads')} threads, {hw.get('dtype')} target"
        + (f", training precision {job['recipe']['precision']}" if "precision" in job["recipe"] else "") + ", "
        f"torch {hw.get('torch_version')}, transformers {hw.get('transformers_version')}, specbench {hw.get('specbench_sha')}.",
        f"- Optimizer steps: {summary['steps']}; tokens through the model: {summary['tokens_seen']:,}.",
        "",
        "## Final held-out metrics",
        "",
        "Top-1 agreement with the target's greedy choice at each drafting depth, on held-out data with the "
        "true prefix (the family's training view: EAGLE-3's self-fed unroll, a block drafter's anchor blocks), "
        "and the family's loss there: a cheap proxy for acceptance.",
        "",
        "| depth | top-1 acc | loss (nats) |",
        "|---:|---:|---:|",
    ]
    held = summary["heldout"]
    for d in sorted(int(k[4:]) for k in held if k.startswith("acc_")):
        lines.append(f"| {d + 1} | {held[f'acc_{d}']:.3f} | {held[f'loss_{d}']:.3f} |")
    if "in_vocab" in held:  # a reduced draft vocabulary (EAGLE-3): the accuracies above are conditional on it
        lines += ["", f"The draft vocabulary holds the target's greedy token at {held['in_vocab']:.1%} of the held-out "
                  "depth-1 positions. The accuracies above count only those positions (a token outside it can never "
                  f"be drafted), so the head's top-1 equals the target's at about {held['acc_0'] * held['in_vocab']:.3f} "
                  "of all depth-1 positions."]
    if "chain_tau" in held:
        lines += ["", f"Held-out `chain_tau` (1 + the leading run of top-1 agreements in a block): {held['chain_tau']:.3f}."]
    if "rank_confusion_0_0" in held:  # a rank head (SpecBlock): rows = true class, shares of all scored slots
        names = ["rank 1", "rank 2-4", "rank 5-10", "rank > 10"]
        lines += ["", "Rank head confusion on held-out data (block 1, every scored slot; rows: the target token's "
                  "rank class in the draft distribution, columns: the head's prediction; share of all rows"
                  + (f"; accuracy {held['rank_acc']:.3f}" if "rank_acc" in held else "") + "):", "",
                  "| true \\ predicted | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for t, name in enumerate(names):
            lines.append(f"| {name} | " + " | ".join(f"{held.get(f'rank_confusion_{t}_{p}', float('nan')):.3f}"
                                                   for p in range(len(names))) + " |")
    if summary.get("root_probe"):
        from specbench.train.probe import card_lines

        lines += ["", *card_lines(summary["root_probe"])]
    return "\n".join(lines) + "\n"


__all__ = ["TrainJob", "Progress", "run_training", "validate", "trainer_of", "JOB_FILE"]
