"""Draft-model speculative sampling (SpS): an independent small LM with the target's tokenizer.

The drafter owns a second :class:`~specbench.targets.Target` (the draft LM) and its KV cache. Each
round it first brings its cache up to the committed sequence (it keeps the slots of tokens it had
already run that were accepted, crops the rest, and runs the new committed tokens in one forward),
then drafts:

* ``top_k = 1`` (default): a chain of up to ``num_draft`` tokens, one draft forward each. At
  temperature > 0 the chain is sampled from the draft's own distribution (same temperature / top-p
  / top-k as the target) and those distributions go to the verifier (classic speculative sampling).
  Two options shorten or lengthen the chain the way transformers' ``AssistedCandidateGenerator``
  does: ``schedule=heuristic`` starts at ``num_draft`` and adds 2 after a step whose drafts were all
  accepted, else takes 1 away (at least 1; reset every generation, i.e. upstream's
  ``heuristic_transient``); ``threshold=p`` stops the chain after the first draft token whose
  probability under the drafter is below p (that token is kept, as upstream's ``ConfidenceCriteria``;
  greedy: the top probability). Both depend on the drafter's own state only, so the output stays
  the target's (greedy equality, exact sampling). They apply to the chain only (a tree ignores them).
  The defaults (20 tokens, constant, threshold 0.7) were chosen by ``python -m specbench.replay
  draft-model`` on the Qwen2.5-Coder 1.5B / 0.5B pair (reports/training-free.md).
* ``top_k > 1``: a tree; at each depth every frontier node gets its ``top_k`` most likely children
  and the ``top_k`` best new nodes by cumulative log-prob become the next frontier. Each depth is
  one draft forward over the whole tree so far (simple and exact; it recomputes ancestors, which
  is our choice for clarity over a tree-shaped draft cache). Children are deterministic here, so
  the verifier uses its point-mass rule at temperature > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.drafter import CheckpointId, DraftContext, Drafter, Sampling, UserError
from specbench.tree import DraftTree, TreeBuilder, chain
from specbench.verify import target_probs


@dataclass(frozen=True)
class DraftModelConfig:
    model: str = ""  # alias, tiny-*, or local directory of the draft LM (same tokenizer as the target)
    num_draft: int = 20  # chain length (the start value with schedule=heuristic), or tree depth
    top_k: int = 1  # 1 = chain; > 1 = top-k tree
    schedule: str = "constant"  # chain length: constant | heuristic (+2 when all accepted, else -1)
    threshold: float = 0.7  # stop the chain after a draft token with probability below this (0 = off)

    def __post_init__(self) -> None:
        if self.num_draft < 1 or self.top_k < 1:
            raise ValueError("num_draft and top_k must be at least 1")
        if self.schedule not in ("constant", "heuristic"):
            raise ValueError(f"schedule must be constant or heuristic, got '{self.schedule}'")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must lie in [0, 1), got {self.threshold}")


class DraftModelDrafter(Drafter):
    description = "draft model (SpS): a small LM with the same tokenizer drafts a chain or a top-k tree (--set model=...)"
    Config = DraftModelConfig
    test_options = (("model=tiny-llama",), ("model=tiny-llama", "top_k=3", "num_draft=3"),
                    ("model=tiny-llama", "schedule=heuristic", "num_draft=2", "threshold=0.3"))
    feature_layers: tuple[int, ...] = ()

    def __init__(self, target, config: DraftModelConfig | None = None):
        from specbench.targets import load_target

        self.config = config or DraftModelConfig()
        if not self.config.model:
            raise UserError("the draft-model drafter needs a draft LM: pass --set model=ALIAS_OR_DIR (e.g. qwen2.5-coder-0.5b)")
        dtype = str(target.dtype).removeprefix("torch.")
        self.draft = load_target(self.config.model, device=str(target.device), dtype=dtype)
        if self.draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
            raise UserError(
                f"draft model '{self.config.model}' uses a different tokenizer from target '{target.name}'; "
                "pick a draft LM of the same family"
            )
        if self.draft.vocab_size > target.vocab_size:
            raise UserError(f"draft model vocabulary ({self.draft.vocab_size}) is larger than the target's ({target.vocab_size})")
        self.target_vocab = target.vocab_size
        # the draft LM's weights are this drafter's checkpoint
        self.checkpoint = CheckpointId.of_tensors(self.config.model, self.draft.model.state_dict())
        self.reset(Sampling())

    def reset(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.seq: list[int] = []  # committed tokens
        self.cached: list[int] = []  # tokens whose K/V the draft cache holds, in order
        self.length = self.config.num_draft  # the chain length for the next step (heuristic schedule)
        self.drafted = 0  # chain length proposed in the previous step
        self.draft.reset()

    def _sync(self) -> torch.Tensor:
        """Make the draft cache hold seq[:-1] plus the root's logits; return those logits [V]."""
        keep = 0
        limit = min(len(self.cached), len(self.seq) - 1)
        while keep < limit and self.cached[keep] == self.seq[keep]:
            keep += 1
        self.draft.truncate(keep)
        new = self.seq[keep:]
        out = self.draft.forward_tree(chain(new), keep, last_logits_only=True)
        self.cached = list(self.seq)
        return out.logits[-1]

    def propose(self, ctx: DraftContext) -> DraftTree:
        if self.config.schedule == "heuristic" and ctx.accepted_nodes is not None and self.drafted:
            accepted = ctx.accepted_nodes.numel() - 1
            self.length = self.length + 2 if accepted == self.drafted else max(1, self.length - 1)
        self.seq.extend(ctx.tokens.tolist())
        logits = self._sync()
        if self.config.top_k == 1:
            return self._chain(logits, ctx.tokens.device)
        return self._tree(ctx.tokens.device)

    def _pad(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft distributions live on the target's vocabulary (a smaller draft vocab pads with 0)."""
        if probs.shape[-1] == self.target_vocab:
            return probs
        return torch.nn.functional.pad(probs, (0, self.target_vocab - probs.shape[-1]))

    def _chain(self, logits: torch.Tensor, device) -> DraftTree:
        s = self.sampling
        tokens = [self.seq[-1]]
        probs_rows = []
        length, threshold = self.length, self.config.threshold
        for i in range(length):
            if s.greedy:
                tok = int(logits.argmax())
                low = threshold > 0 and float(torch.softmax(logits.float(), -1)[tok]) < threshold
            else:
                q = self._pad(target_probs(logits, s))
                probs_rows.append(q)
                tok = int(torch.multinomial(q, 1, generator=s.generator))
                low = threshold > 0 and float(q[tok]) < threshold
            tokens.append(tok)
            if low:  # the drafter is unsure: this token is the last of the chain
                break
            if i + 1 < length:
                logits = self.draft.forward_tree(chain([tok]), len(self.cached), last_logits_only=True).logits[-1]
                self.cached.append(tok)
        tree = chain(torch.tensor(tokens, dtype=torch.long, device=device))
        draft_probs = None
        if probs_rows:  # row i = distribution node i's child was drawn from; the leaf has none
            probs_rows.append(torch.zeros_like(probs_rows[0]))
            draft_probs = torch.stack(probs_rows).to(device)
        self.drafted = len(tokens) - 1
        return DraftTree(tokens=tree.tokens, parents=tree.parents, draft_probs=draft_probs, n_forwards=self.drafted)

    def _tree(self, device) -> DraftTree:
        k = self.config.top_k
        pos = len(self.seq) - 1
        self.draft.truncate(pos)  # the root is re-run as node 0 of each tree forward
        self.cached = self.seq[:-1]
        tree = TreeBuilder(self.seq[-1])
        frontier = [0]
        for _ in range(self.config.num_draft):
            logprobs = torch.log_softmax(self.draft.forward_tree(tree.build(), pos).logits.float(), dim=-1)
            self.draft.truncate(pos)
            candidates = []  # (cumulative log-prob, parent, token), frontier order then rank order
            for node in frontier:
                top = torch.topk(logprobs[node], k)
                for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
                    candidates.append((tree.scores[node] + lp, node, tok))
            candidates.sort(key=lambda c: -c[0])  # stable: ties keep that order
            frontier = [tree.add(node, tok, total) for total, node, tok in candidates[:k]]
        return tree.build(n_forwards=self.config.num_draft, device=device)
