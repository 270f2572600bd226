"""The ONE decoding loop, used by every drafter and by the autoregressive baseline.

Positions: the committed sequence is ``x[0..L)``; the target's cache holds ``[0, L-1)``; the root
``x[L-1]`` sits at ``pos = L-1`` and has not been run through the target yet. So the prefill covers
``prompt[:-1]`` and the first step's forward computes the logits of the last prompt token, for the
baseline and the drafters alike.

One step:  1. propose -> 2. forward_tree -> 3. verify -> 4. commit -> 5. next DraftContext,
timed as draft (1) / verify (2 + 3) / other (4 + 5 and bookkeeping).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from specbench.drafter import DraftContext, Drafter, Sampling
from specbench.targets import Target
from specbench.verify import margins_recorded, verify


@dataclass(frozen=True)
class Step:
    tree_size: int  # nodes including the root
    tree_depth: int  # deepest node's depth (0 for the root alone)
    accepted: int  # accepted drafts (the bonus token not counted)
    drafter_forwards: int
    draft_s: float
    verify_s: float
    other_s: float


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]  # generated tokens, up to and including the first stop token
    steps: list[Step] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # greedy on a bf16/fp16 target: per output token, the target's top-2 margin (in ulps of its dtype)
    # at the decision that produced it, and the runner-up token there (None otherwise)
    margin_ulps: list[float] | None = None
    runner_up: list[int] | None = None


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def advance(target: Target, tree, result, out, pos: int) -> tuple[list[int], DraftContext]:
    """Steps 4 and 5: commit the accepted path's K/V right after the prefix, and the drafter's next
    context: accepted drafts + bonus (the new root), with the features of the root and the accepted
    nodes (never of the bonus: it was not run). Returns (new tokens, context)."""
    dev = target.device
    target.commit(pos, result.path)
    path = torch.as_tensor(result.path, device=dev)
    drafts = result.tokens if result.tokens is not None else tree.tokens[path[1:]].tolist()
    new_tokens = drafts + [result.bonus]
    ctx = DraftContext(
        tokens=torch.tensor(new_tokens, dtype=torch.long, device=dev),
        features=None if out.features is None else out.features[path],
        pos=pos + len(result.path),
        accepted_nodes=path,
    )
    return new_tokens, ctx


def emit(output: list[int], new_tokens: list[int], stop: set[int], max_new_tokens: int) -> bool:
    """Append ``new_tokens`` up to and including the first stop token or the length limit; True when done."""
    for tok in new_tokens:
        output.append(tok)
        if tok in stop or len(output) >= max_new_tokens:
            return True
    return False


def generate(
    target: Target, drafter: Drafter, prompt_ids: Tensor, max_new_tokens: int, sampling: Sampling
) -> Generation:
    """Speculative generation of at most ``max_new_tokens`` tokens after ``prompt_ids`` ([L] int64)."""
    dev = target.device
    layers = tuple(drafter.feature_layers)
    stop = set(target.stop_token_ids)
    margin_dtype = target.dtype if sampling.greedy and margins_recorded(target.dtype) else None
    margins: list[float] | None = [] if margin_dtype is not None else None
    runners: list[int] | None = [] if margin_dtype is not None else None
    drafter.reset(sampling)

    t0 = _clock(dev)
    # [L-1, F]: the hidden state at position j pairs with token j+1, so token 0 gets no row
    feats = target.prefill(prompt_ids[:-1], layers)
    pos = prompt_ids.numel() - 1
    ctx = DraftContext(tokens=prompt_ids.to(dev), features=feats, pos=pos, accepted_nodes=None)
    t_start = _clock(dev)
    prefill_s = t_start - t0

    output: list[int] = []
    steps: list[Step] = []
    depths: list[Tensor | None] = []
    t_prev = t_start
    while True:
        # 1. propose a tree rooted at the last committed token
        tree = drafter.propose(ctx)
        t_draft = _clock(dev)
        # 2. one target forward over the whole tree; 3. walk it
        out = target.forward_tree(tree, pos, layers)
        result = verify(tree, out.logits, sampling, margin_dtype)
        t_verify = _clock(dev)
        # 4. keep the accepted path's K/V right after the prefix; 5. the drafter's next context
        new_tokens, ctx = advance(target, tree, result, out, pos)
        pos = ctx.pos
        # count tokens the same way for every method: up to and including the first stop token
        before = len(output)
        done = emit(output, new_tokens, stop, max_new_tokens)
        if margins is not None and runners is not None:
            margins += result.margin_ulps[: len(output) - before]
            runners += result.runner_up[: len(output) - before]
        t_end = _clock(dev)
        # the tree's depth stays on the device until the generation ends (no sync per step)
        depths.append(tree.depth.max() if tree.size > 1 else None)
        steps.append(
            Step(
                tree_size=tree.size,
                tree_depth=0,
                accepted=len(result.path) - 1,
                drafter_forwards=tree.n_forwards,
                draft_s=t_draft - t_prev,
                verify_s=t_verify - t_draft,
                other_s=t_end - t_verify,
            )
        )
        t_prev = t_end
        if done or pos + 1 >= target.max_context:
            break
    deep = [i for i, d in enumerate(depths) if d is not None]
    if deep:
        values = torch.stack([depths[i].to(dev) for i in deep]).tolist()
        for i, d in zip(deep, values):
            steps[i] = replace(steps[i], tree_depth=int(d))
    return Generation(output_ids=output, steps=steps, prefill_s=prefill_s, decode_s=t_prev - t_start,
                      margin_ulps=margins, runner_up=runners)
