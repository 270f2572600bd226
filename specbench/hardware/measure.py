"""``specbench profile``: time the target's forward against the number of query tokens on this device.

For each context length c: prefill c random tokens, then for each n run ``Target.forward_tree`` over a
tree-shaped ``n``-node draft (a binary tree, tree mask forced even when n is 1 or 2), crop the cache
back to c, and keep the median of ``repeats`` timed forwards after one untimed warm-up. On CUDA the
time is taken with CUDA events around the forward, then a synchronize; on CPU with perf_counter.

Each requested drafter is timed as it runs: a short greedy generation on a fixed prompt, its
``draft_s`` summed over steps divided by its drafter forwards (``ms_per_forward``; a drafter that makes
no forward, such as ngram, records its draft time per step instead).
"""

from __future__ import annotations

import datetime as _dt
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from specbench.errors import UserError
from specbench.hardware.profiles import MeasuredProfile
from specbench.tree import DraftTree

DEFAULT_NS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DEFAULT_CONTEXTS = (128, 1024, 4096)


def binary_tree(n: int, root_token: int = 1, vocab: int = 256) -> DraftTree:
    """n nodes, node i's parent (i - 1) // 2: a tree-shaped verify mask of depth log2(n)."""
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, n)], dtype=torch.long)
    tokens = (torch.arange(n, dtype=torch.long) * 7 + root_token) % vocab
    return DraftTree(tokens=tokens, parents=parents)


class _Timer:
    """Seconds of one call: CUDA events + synchronize on CUDA, perf_counter elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.device)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) * 1e-3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def measure_forward(target, ns: list[int], contexts: list[int], repeats: int = 5,
                    progress: Callable[[str], None] | None = None) -> list[list[float]]:
    """[context][n] median milliseconds of one tree-masked target forward."""
    limit = target.max_context
    if max(contexts) + max(ns) > limit:
        raise UserError(f"context {max(contexts)} + n {max(ns)} exceeds {target.name}'s context of {limit}; use smaller --contexts / --tokens")
    timer = _Timer(target.device)
    gen = torch.Generator().manual_seed(0)
    vocab = min(target.vocab_size, 256)
    table = []
    for c in contexts:
        prompt = torch.randint(0, vocab, (c,), generator=gen, dtype=torch.long)
        target.prefill(prompt)
        row = []
        for n in ns:
            tree = binary_tree(n, vocab=vocab)

            def once(tree=tree):
                target.forward_tree(tree, c, force_tree_mask=True)

            once()  # warm-up (allocator, kernels) for this shape
            target.truncate(c)
            times = []
            for _ in range(repeats):
                times.append(timer(once))
                target.truncate(c)
            row.append(statistics.median(times) * 1e3)
            if progress:
                progress(f"context {c}, n {n}: {row[-1]:.3f} ms")
        table.append(row)
    return table


def measure_drafter(target, name: str, options: tuple[str, ...] = (), max_new_tokens: int = 32) -> dict:
    """Milliseconds per drafter forward (or per step for a drafter with no forward) over one generation."""
    from specbench.decode import generate
    from specbench.drafter import Sampling, config_json
    from specbench.runner import build_drafter

    drafter, config = build_drafter(name, target, options, None)
    prompt = torch.tensor(target.tokenizer.encode("def fibonacci(n):\n    # return the n-th Fibonacci number\n"),
                          dtype=torch.long)
    generate(target, drafter, prompt, 8, Sampling())  # warm-up
    out = generate(target, drafter, prompt, max_new_tokens, Sampling())
    draft_s = sum(s.draft_s for s in out.steps)
    forwards = sum(s.drafter_forwards for s in out.steps)
    entry = {"config": config_json(config), "steps": len(out.steps), "forwards": forwards,
             "ms_per_step": draft_s / max(len(out.steps), 1) * 1e3}
    entry["ms_per_forward"] = draft_s / forwards * 1e3 if forwards else 0.0
    return entry


@dataclass(frozen=True)
class ProfileRequest:
    name: str
    ns: tuple[int, ...] = DEFAULT_NS
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    drafters: tuple[str, ...] = ()
    repeats: int = 5


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{what} '{text}' must be comma-separated integers, e.g. 1,2,4,8") from None
    if not values or min(values) < 1:
        raise UserError(f"{what} '{text}' must list integers >= 1, e.g. 1,2,4,8")
    return tuple(sorted(set(values)))


def run_profile(target, target_spec: str, req: ProfileRequest, progress: Callable[[str], None] | None = None) -> MeasuredProfile:
    from specbench import results

    table = measure_forward(target, list(req.ns), list(req.contexts), req.repeats, progress)
    drafters = {}
    for d in req.drafters:
        name, _, rest = d.partition(":")
        options = tuple(o for o in rest.split(",") if o) if rest else ()
        drafters[name] = measure_drafter(target, name, options)
        if progress:
            progress(f"drafter {name}: {drafters[name]['ms_per_forward']:.3f} ms/forward")
    fp = results.env_fingerprint(str(target.device), str(target.dtype).removeprefix("torch."))
    return MeasuredProfile(
        name=req.name, target=target_spec, target_config=target.model.config.to_dict(), contexts=list(req.contexts),
        ns=list(req.ns), t_fwd_ms=table, drafters=drafters, fingerprint=fp, mode=getattr(target, "mode", "eager"),
        created=_dt.datetime.now().isoformat(timespec="seconds"),
    )
