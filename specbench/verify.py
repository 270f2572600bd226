"""Tree verification: pure functions of (tree, target logits, sampling); no model calls.

Glossary (as in vLLM's spec-decode metrics):

* accepted token: a draft node on the accepted path (the root is not counted);
* bonus token: the one token drawn from the target at the last accepted node. When the walk ended
  on a rejection it is the *recovered* token, drawn from the residual distribution; when it ended
  at a leaf it is a plain sample from the target.

Every step therefore commits ``len(path) - 1`` accepted drafts plus one bonus token.

Greedy (temperature 0): walk from the root; at node i the target's choice is argmax(logits[i]);
move to the child holding that token if there is one, else stop. The bonus is argmax at the stop.

Sampling (temperature > 0): recursive rejection sampling on the tree, which leaves the output
distribution exactly the target's (SpecInfer, Miao et al. 2024, Alg. 2; EAGLE uses the same rule):

* children drafted deterministically (``tree.draft_probs is None``): each child is a point mass.
  Try the children in node order; child token t is accepted with probability residual(t) (the
  residual being normalised), and on rejection residual(t) <- 0 and renormalise;
* children sampled i.i.d. from ``draft_probs[i]`` (q): accept t with min(1, residual(t) / q(t));
  on rejection residual <- normalise(max(residual - q, 0)).

If every child is rejected the recovered token is drawn from the final residual.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specbench.drafter import Sampling
from specbench.tree import DraftTree, children_lists


@dataclass(frozen=True)
class VerifyResult:
    path: list[int]  # accepted node ids, root first: [0, n1, ..., na]
    bonus: int  # the token drawn at the last accepted node
    # the tokens of the accepted drafts (path[1:]) when the verifier already has them on the host
    tokens: list[int] | None = field(default=None, compare=False)
    # greedy with a reduced-precision target only (see :func:`verify_greedy`): at each path node, in
    # path order, the gap between the target's two best logits in ulps of the target's dtype, and the
    # second-best token. Entry j belongs to the decision that committed token j (accepted or bonus).
    margin_ulps: list[float] | None = field(default=None, compare=False)
    runner_up: list[int] | None = field(default=None, compare=False)


def target_probs(logits: Tensor, sampling: Sampling) -> Tensor:
    """The distribution the target samples from: softmax(logits / T) after top-k and top-p filters.

    ``logits`` is [..., V]. top-k keeps the k largest logits; top-p keeps the smallest set of most
    likely tokens whose mass reaches p (the token crossing p included), as transformers does.
    """
    scaled = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.softmax(scaled, dim=-1)


# mantissa bits of the dtypes whose rounding can reorder two nearly equal logits
_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}


def margins_recorded(dtype: torch.dtype) -> bool:
    """Whether greedy verification records top-2 margins for a target of ``dtype`` (bf16, fp16)."""
    return dtype in _MANTISSA_BITS


def verify(tree: DraftTree, logits: Tensor, sampling: Sampling, margin_dtype: torch.dtype | None = None) -> VerifyResult:
    """Accepted path and bonus token for ``tree`` given the target ``logits`` [N, V] at its nodes.

    ``margin_dtype`` (greedy only): the target's dtype when it is bf16 or fp16; the result then also
    carries each decision's top-2 margin in that dtype's ulps and its runner-up token.
    """
    if sampling.greedy:
        return verify_greedy(tree, logits, margin_dtype)
    return verify_sampling(tree, logits, sampling)


def top2_margins(logits: Tensor, choice: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Per row of ``logits`` [N, V]: the gap between the two best logits in ulps of ``dtype`` at the best
    one's magnitude, and the second-best token (the best of the rest when ``choice`` is tied)."""
    top = logits.float().topk(2, dim=-1)
    best, second = top.values.unbind(-1)
    runner_up = torch.where(top.indices[:, 0] == choice, top.indices[:, 1], top.indices[:, 0])
    ulp = torch.exp2(torch.floor(torch.log2(best.abs().clamp(min=1e-30))) - _MANTISSA_BITS[dtype])
    return (best - second) / ulp, runner_up


def verify_greedy(tree: DraftTree, logits: Tensor, margin_dtype: torch.dtype | None = None) -> VerifyResult:
    """The greedy walk, vectorised: no per-node Python loop and one device-to-host transfer.

    Node i (not the root) *matches* when its token is the target's argmax at its parent and no
    earlier sibling holds the same token (the walk takes the first such child). Then at most one
    child of any node matches, and the accepted path is exactly the set of nodes whose every
    ancestor-or-self matches (the root always does); the bonus is the argmax at its deepest node.

    With ``margin_dtype`` (bf16 or fp16) it also returns, for each path node, the top-2 margin in
    that dtype's ulps and the runner-up token (:func:`top2_margins`), in the same one transfer. A
    reduced-precision forward over a different batch shape can round a near-tie either way, and
    these let ``specbench compare`` tell such a divergence from a real one.
    """
    choice = logits.argmax(dim=-1)  # [N] the target's token after each node
    tokens = tree.tokens
    parents, choice = tree.parents.to(tokens.device), choice.to(tokens.device)
    n = tokens.numel()
    idx = torch.arange(n, device=tokens.device)
    match = tokens == choice[parents.clamp(min=0)]
    if n > 1:
        earlier_twin = ((parents[:, None] == parents[None, :]) & (tokens[:, None] == tokens[None, :])
                        & (idx[None, :] < idx[:, None])).any(dim=1)
        match &= ~earlier_twin
    match[0] = True
    on_path = ~(tree.ancestors.to(tokens.device) & ~match[None, :]).any(dim=1)
    order = torch.where(on_path, idx, idx + n).argsort()  # the path's nodes first, root first
    length = on_path.sum().view(1)
    parts = [length, order, tokens[order], choice[order]]
    margins = None
    if margin_dtype is None:
        host = torch.cat(parts).tolist()  # the one transfer
    else:
        # a second pass over the logits: topk's order among equal logits is unspecified, and bf16 ties
        # exactly often enough (the GPU check saw a 0.0 gap), so the choice stays argmax's first index,
        # the rule every other path (AR included) decides by; the runner-up is the best of the rest
        margin, runner = (t.to(tokens.device) for t in top2_margins(logits, choice.to(logits.device), margin_dtype))
        # still one transfer: token ids are exact in float64
        flat = torch.cat([torch.cat([*parts, runner[order]]).double(), margin[order].double()]).tolist()
        host, margins = [int(v) for v in flat[: 1 + 4 * n]], flat[1 + 4 * n :]
    k = host[0]
    return VerifyResult(path=host[1 : 1 + k], bonus=host[1 + 2 * n + k - 1], tokens=host[1 + n + 1 : 1 + n + k],
                        margin_ulps=None if margins is None else margins[:k],
                        runner_up=None if margins is None else host[1 + 3 * n : 1 + 3 * n + k])


def verify_greedy_walk(tree: DraftTree, logits: Tensor) -> VerifyResult:
    """The plain walk from the root (the reference the vectorised :func:`verify_greedy` is tested against)."""
    target_choice = logits.argmax(dim=-1).tolist()  # [N] the target's token after each node
    tokens = tree.tokens.tolist()
    kids = children_lists(tree.parents)
    path = [0]
    node = 0
    while True:
        want = target_choice[node]
        nxt = next((c for c in kids[node] if tokens[c] == want), None)
        if nxt is None:
            return VerifyResult(path=path, bonus=want)
        path.append(nxt)
        node = nxt


def _draw(probs: Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    return float(torch.rand((), generator=generator, device=device))


def verify_sampling(tree: DraftTree, logits: Tensor, sampling: Sampling) -> VerifyResult:
    gen = sampling.generator
    tokens = tree.tokens.tolist()
    kids = children_lists(tree.parents)
    path = [0]
    node = 0
    while True:
        residual = target_probs(logits[node], sampling)
        accepted_child = None
        for child in kids[node]:
            tok = tokens[child]
            if tree.draft_probs is None:
                accept_prob = float(residual[tok])  # the draft is a point mass on tok
            else:
                draft_q = tree.draft_probs[node].to(residual)
                accept_prob = min(1.0, float(residual[tok]) / max(float(draft_q[tok]), 1e-30))
            if _uniform(gen, residual.device) < accept_prob:
                accepted_child = child
                break
            if tree.draft_probs is None:
                residual = residual.clone()
                residual[tok] = 0.0
            else:
                residual = torch.clamp(residual - tree.draft_probs[node].to(residual), min=0.0)
            total = float(residual.sum())
            if total <= 0.0:  # only reachable through rounding; the target itself is then the residual
                residual = target_probs(logits[node], sampling)
            else:
                residual = residual / total
        if accepted_child is None:
            return VerifyResult(path=path, bonus=_draw(residual, gen))
        path.append(accepted_child)
        node = accepted_child
