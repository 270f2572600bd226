"""The harness's own time per decode step, apart from the target forward (`specbench hardware overhead`).

One step of :func:`specbench.decode.generate` is: the drafter's proposal, then the harness's parts,
each timed here on its own with the very functions the decoding loop calls:

* ``tree build``   — :meth:`TreeBuilder.build` (host lists to device tensors, pruning when a budget is given);
* ``tree tensors`` — node depths and the ancestor mask (:attr:`DraftTree.depth`, :attr:`DraftTree.ancestors`);
* ``mask``         — the additive attention mask (:meth:`Target.tree_mask`);
* ``forward``      — the target's forward over the tree (:meth:`Target.forward_masked`): the model's time;
* ``acceptance``   — greedy verification (:func:`specbench.verify.verify_greedy`);
* ``commit + context`` — K/V commit and the drafter's next context (:func:`specbench.decode.advance`) and
  the token count (:func:`specbench.decode.emit`).

The tree is a layered tree of ``nodes`` nodes (root included; ``depth`` layers, parents drawn at
random from the layer above) at a context of ``context`` tokens, with a path of ``depth`` accepted
drafts planted in it (the token of each path node is the target's own greedy choice at its parent),
so acceptance walks a full-depth path and the commit gathers a non-contiguous path: the expensive
case. Each part's time is the median over ``repeats``; on CUDA every boundary synchronises.

The non-model share is (every part but the forward) / (every part). The drafter's own work is not
the harness's and is not counted.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from specbench.errors import UserError

PARTS = ("tree build", "tree tensors", "mask", "forward", "acceptance", "commit + context")


@dataclass
class Overhead:
    target: str
    device: str
    dtype: str
    threads: int
    nodes: int
    depth: int
    context: int
    repeats: int
    accepted: int  # drafts accepted in the timed step (the planted path's length)
    ms: dict[str, float] = field(default_factory=dict)  # median per part

    @property
    def step_ms(self) -> float:
        return sum(self.ms.values())

    @property
    def non_model_ms(self) -> float:
        return sum(v for k, v in self.ms.items() if k != "forward")

    @property
    def non_model_share(self) -> float:
        return self.non_model_ms / self.step_ms if self.step_ms > 0 else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "step_ms": self.step_ms, "non_model_ms": self.non_model_ms,
                "non_model_share": self.non_model_share}


def layered_tree(nodes: int, depth: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(parents, path) of a tree with ``nodes`` nodes in ``depth`` layers below the root, node ids
    layer by layer, parents drawn at random from the layer above, except that each layer's first
    node hangs from the previous layer's first: ``path`` = the root and those first nodes."""
    if nodes < 2 or depth < 1 or depth > nodes - 1:
        raise UserError(f"a tree of {nodes} nodes cannot have {depth} layers; use --nodes >= 2 and 1 <= --depth < --nodes")
    per_layer = [(nodes - 1) // depth + (1 if i < (nodes - 1) % depth else 0) for i in range(depth)]
    parents, path, start, prev = [-1], [0], 1, [0]
    for width in per_layer:
        ids = list(range(start, start + width))
        parents += [prev[0]] + [rng.choice(prev) for _ in ids[1:]]
        path.append(ids[0])
        prev, start = ids, start + width
    return parents, path


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def measure_overhead(target, name: str, nodes: int = 256, depth: int = 8, context: int = 512, repeats: int = 10,
                     seed: int = 0, progress: Callable[[str], None] | None = None) -> Overhead:
    """Time the parts of one greedy decode step over a ``nodes``-node tree (see the module docstring)."""
    from specbench.decode import advance, emit
    from specbench.tree import TreeBuilder
    from specbench.verify import verify_greedy

    if repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {repeats}")
    if context < 1 or context + depth + 2 > target.max_context:
        raise UserError(f"--context {context} does not fit the target's {target.max_context} positions")
    rng = random.Random(seed)
    dev = target.device
    vocab = target.vocab_size
    parents, path = layered_tree(nodes, depth, rng)
    tokens = [rng.randrange(vocab) for _ in parents]
    prompt = torch.tensor([rng.randrange(vocab) for _ in range(context + 1)], dtype=torch.long)
    target.prefill(prompt[:-1])
    pos = context

    def builder() -> TreeBuilder:
        b = TreeBuilder(tokens[0])
        for i in range(1, len(tokens)):
            b.add(parents[i], tokens[i], -float(i))
        return b

    # plant the accepted path: each path node takes the target's greedy token at its parent (one
    # untimed forward per depth, since a node's logits depend on its ancestors' tokens)
    for d in range(1, len(path)):
        out = target.forward_tree(builder().build(device=dev), pos)
        tokens[path[d]] = int(out.logits[path[d - 1]].argmax())
        target.truncate(pos)
        if progress:
            progress(f"planting the accepted path: depth {d}/{depth}")

    timings: dict[str, list[float]] = {p: [] for p in PARTS}
    accepted = 0
    for r in range(repeats + 1):  # the first round warms up and is not kept
        b = builder()
        t0 = _clock(dev)
        tree = b.build(device=dev)
        t1 = _clock(dev)
        _ = tree.depth, tree.ancestors
        t2 = _clock(dev)
        mask = None if tree.is_chain else target.tree_mask(tree, pos)
        t3 = _clock(dev)
        out = target.forward_masked(tree, pos, mask)
        t4 = _clock(dev)
        result = verify_greedy(tree, out.logits)
        t5 = _clock(dev)
        new_tokens, _ctx = advance(target, tree, result, out, pos)
        emit([], new_tokens, set(target.stop_token_ids), 1 << 30)
        t6 = _clock(dev)
        target.truncate(pos)
        accepted = len(result.path) - 1
        if r == 0:
            continue
        for part, a, z in zip(PARTS, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6)):
            timings[part].append((z - a) * 1e3)
        if progress:
            progress(f"repeat {r}/{repeats}")
    return Overhead(target=name, device=str(dev), dtype=str(target.dtype).removeprefix("torch."),
                    threads=torch.get_num_threads(), nodes=len(parents), depth=depth, context=context,
                    repeats=repeats, accepted=accepted, ms={p: statistics.median(v) for p, v in timings.items()})
