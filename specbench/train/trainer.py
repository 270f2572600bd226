"""The one training loop every learned drafter uses.

A drafter family supplies a *trainable* (its recipe, its module, its loss); this module supplies
the rest, the same for every family: batches drawn from the feature cache, AdamW, linear warm-up
then cosine decay (transformers' ``get_cosine_schedule_with_warmup``), gradient clipping, a
held-out evaluation every ``eval_every`` steps and at the end, and a checkpoint of the whole
training state every ``save_every`` steps that a rerun resumes from.

Determinism: the model is initialised under ``torch.manual_seed(recipe.seed)`` by the family, and
the batch plan (which sequences, in which order, each epoch) is a pure function of the seed and the
data, so a resumed run sees exactly the batches an uninterrupted one would have seen.

Metrics are ``{name: (numerator, denominator)}`` pairs (a masked loss sum and its token count, hits
and trials), summed over batches before dividing, so held-out numbers do not depend on batching.

Shards and data parallelism. Each step's global batch (the ``batch_tokens`` plan above, the same
whatever the number of processes) is split by sequence into ``recipe.shards`` shards; the step's
gradient is the sum over shards of ``w_k * grad(loss(shard k))``, ``w_k`` the shard's share of the
batch's loss tokens. ``shards=1`` (the default on one process) is the plain whole-batch loss. Under ``torchrun`` (a
:class:`~specbench.distributed.World`) rank r computes shards r, r+N, ... and the gradients are
summed over the ranks (``all_reduce``), so N processes take exactly the steps one process takes with
the same ``shards`` (gradient accumulation), up to float summation order. Held-out batches are
spread over the ranks the same way and their metric sums added. Rank 0 alone writes the state, the
log and reports steps.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from specbench.errors import UserError
from specbench.train.features import FeatureCache

STATE_FILE = "trainer_state.pt"
LOG_FILE = "train_log.jsonl"


@dataclass(frozen=True)
class TrainRecipe:
    """What every family's recipe holds; a family subclasses it to add its own fields and defaults."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_ratio: float = 0.05
    epochs: int = 2
    batch_tokens: int = 4096  # padded tokens per optimizer step
    max_length: int = 1024  # conversations are cut to this many tokens
    grad_clip: float = 0.5
    eval_every: int = 100  # steps between held-out evaluations (and one at the end)
    save_every: int = 50  # steps between training-state checkpoints
    seed: int = 0
    shards: int = 0  # shards of each global batch (gradient accumulation / data-parallel split); 0 = one per process
    regenerate: bool = False  # default of --regenerate/--no-regenerate for this family

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.epochs < 1 or self.batch_tokens < 1 or self.max_length < 2:
            raise ValueError("lr, epochs, batch_tokens must be positive and max_length at least 2")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError("warmup_ratio must be in [0, 1)")
        if self.shards < 0:
            raise ValueError("shards must be at least 1 (or 0: one per process)")


@dataclass(frozen=True)
class Batch:
    """Padded sequences with their cached target states (right padding; ``valid`` marks real tokens)."""

    tokens: Tensor  # [B, T] int64
    loss_mask: Tensor  # [B, T] bool: assistant tokens (the ones a drafter is scored on)
    valid: Tensor  # [B, T] bool
    hidden: Tensor  # [B, T, L, H] float32: the target's hidden states at the cache's layers
    argmax: Tensor  # [B, T] int64: the target's top-1 next token at each position

    @property
    def n_tokens(self) -> int:
        return int(self.valid.sum())


class Trainable(abc.ABC):
    """What a drafter family hands the trainer and the pipeline (``DrafterClass.training()``).

    The pipeline builds it as ``Trainable(target, recipe, input_ids, loss_mask)`` (the training
    token ids and loss masks, e.g. to choose a draft vocabulary), caches the target's hidden states
    at :attr:`cache_layers`, trains :attr:`module` with :meth:`loss`, and writes the checkpoint with
    :meth:`save`. :meth:`preflight` runs before anything is loaded or written.
    """

    Recipe: ClassVar[type[TrainRecipe]] = TrainRecipe
    # recipe options (``key=value``) for the conformance suite's brief fit on a tiny target
    test_recipe: ClassVar[tuple[str, ...]] = ()
    recipe: TrainRecipe
    module: nn.Module  # the parameters that train (and whose state_dict is checkpointed)

    @abc.abstractmethod
    def __init__(self, target, recipe: TrainRecipe, input_ids: list[list[int]], loss_mask: list[list[int]]) -> None: ...

    @staticmethod
    def preflight(recipe: TrainRecipe, target_name: str) -> None:
        """Checks that need no model (e.g. a required checkpoint exists); raise UserError. Default: none."""

    @property
    @abc.abstractmethod
    def cache_layers(self) -> tuple[int, ...]:
        """HF hidden_states indices the feature cache must hold for :meth:`loss`."""

    @abc.abstractmethod
    def loss(self, batch: Batch) -> tuple[Tensor, dict[str, tuple[float, float]]]:
        """The scalar training loss and metrics as (numerator, denominator) pairs."""

    def backward(self, batch: Batch, scale: float) -> tuple[float, dict[str, tuple[float, float]]]:
        """Add ``scale * grad(loss(batch))`` to the parameters' gradients; returns the loss value and
        the metrics. The trainer calls this; a family may override it to bound memory (e.g. the block
        families backpropagate chunk by chunk), with the same gradient as the default."""
        loss, metrics = self.loss(batch)
        (loss * scale).backward()
        return float(loss.detach()), metrics

    @abc.abstractmethod
    def save(self, out: Path, dtype: torch.dtype = torch.float16) -> Path:
        """Write the checkpoint in the family's released layout into ``out``; returns ``out``."""


@dataclass(frozen=True)
class TokenizedSet:
    """Sequences in feature-cache order: ``input_ids[s]`` and ``loss_mask[s]`` are cache sequence s."""

    input_ids: list[list[int]]
    loss_mask: list[list[int]]
    cache: FeatureCache


@dataclass(frozen=True)
class StepReport:
    step: int
    total_steps: int
    epoch: int
    lr: float
    metrics: dict[str, float]  # training metrics of this step
    tokens_per_s: float  # training tokens (valid rows) per second, running mean over this call
    heldout: dict[str, float] | None  # set on evaluation steps


@dataclass(frozen=True)
class TrainResult:
    steps: int
    total_steps: int  # steps of the whole schedule (steps == total_steps: finished)
    seconds: float  # wall time of this call (a resumed run counts only its own part)
    train_tokens_seen: int  # valid tokens passed through the model over all steps (all epochs)
    heldout: dict[str, float]  # the final held-out metrics
    resumed_from: int  # the step a previous run had reached (0 = fresh)
    # Training wall time of the steps that make up the result, summed over every call, interrupted
    # ones included (each checkpoint records it): work an interruption threw away (steps after the
    # last checkpoint, redone by the next call) is not counted.
    seconds_all_calls: float = 0.0


def plan_batches(lengths: Sequence[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """This epoch's batches of sequence ids: a seeded shuffle, sorted by length inside windows of
    64 sequences (less padding), packed up to ``batch_tokens`` padded slots, batches shuffled."""
    rng = random.Random(f"{seed}/{epoch}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    for w in range(0, len(order), 64):
        window = sorted(order[w : w + 64], key=lambda s: lengths[s])
        cur: list[int] = []
        width = 0
        for s in window:
            new_width = max(width, lengths[s])
            if cur and new_width * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur, new_width = [], lengths[s]
            cur.append(s)
            width = new_width
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def split_shards(data: TokenizedSet, seqs: Sequence[int], shards: int) -> list[tuple[list[int], float]]:
    """``seqs`` (one global batch) as ``shards`` (sequence ids, weight) pairs: dealt longest first in
    turn (balanced padded sizes), each keeping the batch's order; weight = share of loss tokens."""
    order = sorted(range(len(seqs)), key=lambda i: (-len(data.input_ids[seqs[i]]), i))
    parts: list[list[int]] = [[] for _ in range(shards)]
    for j, i in enumerate(order):
        parts[j % shards].append(i)
    groups = [[seqs[i] for i in sorted(part)] for part in parts]
    counts = [float(sum(sum(data.loss_mask[s]) for s in g)) for g in groups]
    total = sum(counts)
    if total > 0:
        weights = [c / total for c in counts]
    else:  # no loss token in the batch: by sequence count
        weights = [len(g) / len(seqs) for g in groups]
    return list(zip(groups, weights))


def collate(data: TokenizedSet, seqs: Sequence[int], device: torch.device | str = "cpu") -> Batch:
    cache = data.cache
    width = max(len(data.input_ids[s]) for s in seqs)
    n_layers, hsize = cache.hidden.shape[1], cache.hidden.shape[2]
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    loss_mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    hidden = torch.zeros(len(seqs), width, n_layers, hsize, dtype=torch.float32)
    argmax = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, s in enumerate(seqs):
        n = len(data.input_ids[s])
        tokens[row, :n] = torch.as_tensor(data.input_ids[s])
        loss_mask[row, :n] = torch.as_tensor(data.loss_mask[s], dtype=torch.bool)
        valid[row, :n] = True
        rows = cache.rows(s)
        hidden[row, :n] = torch.from_numpy(cache.states(rows))  # float16 or bfloat16 storage, as float32
        argmax[row, :n] = torch.from_numpy(np.asarray(cache.argmax[rows], dtype=np.int64))
    to = lambda t: t.to(device)  # noqa: E731
    return Batch(to(tokens), to(loss_mask), to(valid), to(hidden), to(argmax))


def _ratios(sums: dict[str, list[float]]) -> dict[str, float]:
    return {k: (num / den if den else float("nan")) for k, (num, den) in sums.items()}


def _accumulate(sums: dict[str, list[float]], metrics: dict[str, tuple[float, float]]) -> None:
    for k, (num, den) in metrics.items():
        acc = sums.setdefault(k, [0.0, 0.0])
        acc[0] += float(num)
        acc[1] += float(den)


def _gather_sums(sums: dict[str, list[float]], world) -> dict[str, list[float]]:
    """Every rank's metric sums added up (the same dict on every rank); ``sums`` itself without a world."""
    if world is None:
        return sums
    import torch.distributed as dist

    parts: list[Any] = [None] * world.size
    dist.all_gather_object(parts, sums)
    total: dict[str, list[float]] = {}
    for part in parts:
        for k, (num, den) in part.items():
            acc = total.setdefault(k, [0.0, 0.0])
            acc[0] += num
            acc[1] += den
    return total


def _all_reduce_grads(params: list[nn.Parameter]) -> None:
    """Sum the ranks' gradients; a parameter no rank has a gradient for keeps none (as on one process)."""
    import torch.distributed as dist

    has = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    dist.all_reduce(has)
    dist.all_reduce(flat)
    offset = 0
    for p, used in zip(params, has.tolist()):
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone() if used else None
        offset += n


def eval_batches(data: TokenizedSet, batch_tokens: int, device: torch.device | str = "cpu", world=None) -> Iterator[Batch]:
    """The evaluation's batches of ``data``: every sequence once, in the fixed plan of seed 0, epoch 0
    (the same batches for every checkpoint); under a world, this rank's share of them."""
    batches = plan_batches([len(x) for x in data.input_ids], batch_tokens, seed=0, epoch=0)
    if world is not None:
        batches = batches[world.rank :: world.size]
    return (collate(data, seqs, device) for seqs in batches)


@torch.no_grad()
def evaluate(trainable: Trainable, data: TokenizedSet, device: torch.device | str = "cpu", world=None) -> dict[str, float]:
    """Metrics over every sequence of ``data`` (fixed batches, model in eval mode); under a world the
    batches are spread over the ranks and the sums added (the same numbers)."""
    module = trainable.module
    was_training = module.training
    module.eval()
    sums: dict[str, list[float]] = {}
    for batch in eval_batches(data, trainable.recipe.batch_tokens, device, world):
        _, metrics = trainable.loss(batch)
        _accumulate(sums, metrics)
    module.train(was_training)
    return _ratios(_gather_sums(sums, world))


def recipe_key(recipe: TrainRecipe) -> dict:
    """The recipe as a resume key; ``shards=1`` (the behaviour before shards existed) is left out, so
    runs started before then still resume."""
    d = asdict(recipe)
    if d.get("shards") == 1:
        del d["shards"]
    return d


# Recipe fields that change when state is written or how many rows run at once, never what is trained: a run
# resumes with other values (a block run's chunks give the one-piece gradient, to float rounding:
# tests/test_block_training.py::test_chunked_backward_is_the_whole_batch_gradient; so a run started on one machine
# may take the chunk sizes another machine runs fastest).
BOOKKEEPING = ("save_every", "anchor_chunk", "logit_chunk")


def _same_run(stored: str, key: str) -> bool:
    """Whether a stored resume key names the same training as ``key``, bookkeeping fields aside (a run
    checkpointed every 50 steps may be resumed checkpointing every 20)."""
    def strip(k: str) -> dict:
        d = json.loads(k)
        for name in BOOKKEEPING:
            d.get("recipe", {}).pop(name, None)
        return d
    return strip(stored) == strip(key)


def _config_key(trainable: Trainable, data_key: str, n_shards: int) -> str:
    recipe = recipe_key(dataclasses.replace(trainable.recipe, shards=n_shards))
    return json.dumps({"recipe": recipe, "data": data_key, "family": type(trainable).__name__}, sort_keys=True, default=str)


def train(
    trainable: Trainable,
    train_data: TokenizedSet,
    heldout: TokenizedSet,
    out_dir: Path,
    data_key: str,
    device: torch.device | str = "cpu",
    on_step: Callable[[StepReport], Any] | None = None,
    stop_after: int | None = None,
    world=None,
) -> TrainResult:
    """Train ``trainable`` on ``train_data``; resume from ``out_dir`` when it holds a matching state.

    ``data_key`` names the data (a run with other data or another recipe refuses to resume).
    ``stop_after`` ends the call after that many steps in total, leaving a resumable state (tests).
    ``world`` (a :class:`~specbench.distributed.World`, process group initialised): data-parallel
    over its ranks (see the module doc); ``recipe.shards`` must then be a multiple of its size.
    """
    from transformers import get_cosine_schedule_with_warmup

    recipe = trainable.recipe
    n_shards = recipe.shards or (world.size if world is not None else 1)
    if world is not None and n_shards % world.size:
        raise UserError(f"shards={n_shards} cannot be spread over {world.size} processes; "
                        f"pass --set shards=N with N a multiple of {world.size}")
    lead = world is None or world.rank == 0  # the rank that writes the state and the log and reports
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    module = trainable.module.to(device)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay, betas=(0.9, 0.95))
    lengths = [len(x) for x in train_data.input_ids]
    plans = [plan_batches(lengths, recipe.batch_tokens, recipe.seed, e) for e in range(recipe.epochs)]
    total_steps = sum(len(p) for p in plans)
    scheduler = get_cosine_schedule_with_warmup(optimizer, math.ceil(recipe.warmup_ratio * total_steps), total_steps)

    key = _config_key(trainable, data_key, n_shards)
    step = 0
    tokens_seen = 0
    seconds_before = 0.0  # training time of the steps a resumed state holds
    state_path = out_dir / STATE_FILE
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        if not _same_run(state["key"], key):
            raise UserError(f"{state_path} was made with another recipe or data; rerun with the same settings "
                            "or choose a new --out")
        module.load_state_dict(state["module"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, tokens_seen = int(state["step"]), int(state["tokens_seen"])
        seconds_before = float(state.get("seconds", 0.0))  # absent in states written before it was recorded
    resumed_from = step
    if world is not None:  # every rank starts from rank 0's weights (the same seed makes them equal anyway)
        import torch.distributed as dist

        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)

    def save_state() -> None:
        if not lead:
            return
        tmp = state_path.with_suffix(".tmp")
        torch.save({"key": key, "module": module.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": step, "tokens_seen": tokens_seen,
                    "seconds": seconds_before + time.perf_counter() - start}, tmp)
        tmp.replace(state_path)

    log = (out_dir / LOG_FILE).open("a", encoding="utf-8") if lead else None
    start = time.perf_counter()
    call_tokens = 0
    heldout_metrics: dict[str, float] = {}
    module.train()
    flat = [(e, seqs) for e, plan in enumerate(plans) for seqs in plan]
    try:
        for epoch, seqs in flat[step:]:
            if stop_after is not None and step >= stop_after:
                break
            optimizer.zero_grad(set_to_none=True)
            shards = split_shards(train_data, seqs, n_shards)
            sums: dict[str, list[float]] = {}
            objective = 0.0
            for seqs_k, weight in (shards if world is None else shards[world.rank :: world.size]):
                if not seqs_k:
                    continue
                value, metrics = trainable.backward(collate(train_data, seqs_k, device), weight)
                objective += weight * value
                _accumulate(sums, {k: v for k, v in metrics.items() if k != "loss"})
            if world is not None:
                _all_reduce_grads(params)
                sums = _gather_sums({**sums, "loss": [objective, 0.0]}, world)
                objective = sums.pop("loss")[0]
            sums["loss"] = [objective, 1.0]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip))
            optimizer.step()
            scheduler.step()
            step += 1
            n_tokens = sum(len(train_data.input_ids[s]) for s in seqs)  # the global batch's valid tokens
            tokens_seen += n_tokens
            call_tokens += n_tokens
            train_metrics = _ratios(sums)
            train_metrics["grad_norm"] = grad_norm
            evaluated = None
            if step % recipe.eval_every == 0 or step == total_steps:
                evaluated = heldout_metrics = evaluate(trainable, heldout, device, world)
            if step % recipe.save_every == 0 or step == total_steps:
                save_state()
            elapsed = time.perf_counter() - start
            report = StepReport(step, total_steps, epoch, scheduler.get_last_lr()[0], train_metrics,
                                call_tokens / max(elapsed, 1e-9), evaluated)
            if not lead:
                continue
            log.write(json.dumps({"step": step, "epoch": epoch, "lr": report.lr, "tokens_seen": tokens_seen,
                                  "seconds": elapsed, **{f"train/{k}": v for k, v in train_metrics.items()},
                                  **({f"heldout/{k}": v for k, v in evaluated.items()} if evaluated else {})}) + "\n")
            log.flush()
            if on_step is not None:
                on_step(report)
    finally:
        if log is not None:
            log.close()
        if step > resumed_from and step % recipe.save_every and step != total_steps:
            save_state()  # interrupted between checkpoints: keep what was done
    if not heldout_metrics:
        heldout_metrics = evaluate(trainable, heldout, device, world)
    seconds = time.perf_counter() - start
    return TrainResult(step, total_steps, seconds, tokens_seen, heldout_metrics, resumed_from,
                       seconds_all_calls=seconds_before + seconds)


__all__ = ["TrainRecipe", "Batch", "Trainable", "TokenizedSet", "StepReport", "TrainResult", "plan_batches",
           "split_shards", "collate", "eval_batches", "evaluate", "train", "recipe_key", "STATE_FILE", "LOG_FILE"]
