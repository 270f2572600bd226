"""Cost-aware online adaptation of SpecBlock's rank head (``--set adapt=always|bandit``).

Unreleased upstream; this is specbench's own design.

Free labels. Verification tells the drafter, at its next ``propose``, the target's token after every
node on the accepted path, the last one (where the tree was rejected, or ran out) included: the
committed tokens. For each such node the drafter kept the block output that predicted its children
(the rank head's input and the draft logits), so every step yields up to ``accepted + 1`` labelled
examples: (rank-head input, bucketed rank of the target's token in the draft logits). Tokens outside
the draft vocabulary are skipped (training's position mask). The newest ``adapt_buffer`` examples are
kept.

What changes. Only the rank head (``rank_head.*``, 70k parameters on smollm2-135m), with Adam at
``adapt_lr`` and the training loss (ordinal smoothing, distance weight, class-frequency reweighting).
The rank head only shapes the tree (how many candidates each slot gets, whether the chain end is
expanded), never which tokens are accepted: verification decides that, so outputs stay lossless by
construction (and the conformance-style tests check it with adaptation on).

Decisions. Every ``adapt_every`` steps one of three arms is chosen: ``skip``, ``small`` (1 Adam step on
the newest 64 examples) or ``large`` (8 Adam steps on minibatches of 64 from the whole buffer).
``always`` takes ``large`` every time; ``bandit`` chooses by an upper confidence bound on the arm's
estimated NET gain in seconds:

    gain_s(arm) = horizon_tokens * step_s * (1 / tau - 1 / (tau + dtau_ucb(arm)))
    net(arm)    = gain_s(arm) - cost_s(arm)

where tau is the mean tokens per step over the last window, step_s the mean wall time of a step,
``horizon_tokens`` = ``adapt_horizon`` (a sliding horizon: the tokens still to come are unknown to a
drafter), dtau_ucb the arm's mean observed change of tau (next window's tau minus the previous
window's, after the decision) minus the mean change after ``skip`` decisions (tau's drift without an
update, the baseline), plus ``c * sd * sqrt(log(decisions) / n)`` (an arm never tried counts as
infinitely promising once: each update arm is tried at least once when there are labels), and cost_s
the arm's mean measured wall time of the update. ``skip`` is worth 0 (no gain, no cost); an update
arm is taken only when its net gain is positive, the larger of the two when both are.

Log. Every decision is logged when it is made (``event: "decision"``: decision id, generation index,
step, arm, measured cost, estimated gain, tau before, buffer size, rank loss on the buffer before and
after) and again when its after-window closes (``event: "outcome"``: decision id, tau after). The
drafter hands the records out through ``take_log`` and the runner stores them per prompt in the
result row's ``drafter_log`` column (JSON). The adapted state lives in the drafter object, which a run
builds once: it persists over the run's prompts, in their deterministic order, and starts afresh in the
next run. Decisions depend on measured times, so two runs need not make the same ones (their outputs
are the same: lossless).
"""

from __future__ import annotations

import math
import time
from collections import deque

import torch

from drafters.specblock.model import rank_class_of
from drafters.specblock.train import rank_loss_terms

ARMS = ("skip", "small", "large")
ARM_STEPS = {"skip": 0, "small": 1, "large": 8}
MINIBATCH = 64
UCB_C = 1.0


class Adapter:
    def __init__(self, model, options):
        self.model = model
        self.mode = options.adapt
        self.every = options.adapt_every
        self.horizon = options.adapt_horizon
        self.buffer: deque = deque(maxlen=options.adapt_buffer)
        self.params = list(model.rank_head.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=options.adapt_lr)
        self.generator = torch.Generator().manual_seed(options.seed)
        self.t2d = model.t2d
        self.taus: list[float] = []  # tokens per step (accepted + 1), every step of the run
        self.step_times: list[float] = []
        self.rewards: dict[str, list[float]] = {a: [] for a in ARMS}
        self.costs: dict[str, list[float]] = {a: [] for a in ARMS}
        self.pending: dict | None = None  # the last decision, waiting for its after-window
        self.log: list[dict] = []
        self.n_decisions = 0
        self.generation = 0

    # ------------------------------------------------------------ labels
    def observe(self, xs, logits, targets, accepted: int, step_s: float | None, generation: int) -> None:
        self.generation = generation
        self.taus.append(float(accepted + 1))
        if step_s is not None:
            self.step_times.append(step_s)
        if not xs:
            return
        x = torch.stack(xs).float().cpu()
        lg = torch.stack(logits).float()
        tok = torch.tensor(targets, dtype=torch.long, device=lg.device)
        in_vocab = self.t2d[tok]
        if not bool(in_vocab.any()):
            return
        top_target = self.model.to_target_ids(lg.topk(min(10, lg.shape[-1]), dim=-1).indices)  # [n, 10]
        match = top_target == tok[:, None]
        rank0 = torch.where(match.any(-1), match.float().argmax(-1), torch.full_like(tok, 10))
        labels = rank_class_of(rank0).cpu()
        for row, label, ok in zip(x, labels.tolist(), in_vocab.tolist()):
            if ok:
                self.buffer.append((row, label))

    # ------------------------------------------------------------ decisions
    def maybe_update(self) -> None:
        if len(self.taus) % self.every:
            return
        tau_now = sum(self.taus[-self.every:]) / self.every
        if self.pending is not None:  # the previous decision's after-window closes now
            d = self.pending
            self.rewards[d["arm"]].append(tau_now - d["tau_before"])
            self.log.append({"event": "outcome", "decision": d["decision"], "generation": self.generation,
                             "step": len(self.taus), "tau_after": tau_now})
            self.pending = None
        arm, est = self._choose(tau_now)
        loss_before = self._buffer_loss()
        start = time.perf_counter()
        self._update(ARM_STEPS[arm])
        if self.params[0].is_cuda:
            torch.cuda.synchronize(self.params[0].device)
        cost = time.perf_counter() - start if arm != "skip" else 0.0
        self.costs[arm].append(cost)
        record = {"event": "decision", "decision": self.n_decisions, "generation": self.generation,
                  "step": len(self.taus), "mode": self.mode, "arm": arm, "cost_s": cost, "est_net_gain_s": est,
                  "tau_before": tau_now, "buffer": len(self.buffer), "rank_loss_before": loss_before,
                  "rank_loss_after": self._buffer_loss() if arm != "skip" else loss_before}
        self.log.append(record)
        self.pending = {"decision": self.n_decisions, "arm": arm, "tau_before": tau_now}
        self.n_decisions += 1

    def _gain_s(self, tau: float, dtau: float, step_s: float) -> float:
        if dtau <= -tau + 1e-9:
            return -math.inf
        return self.horizon * step_s * (1.0 / tau - 1.0 / (tau + dtau))

    def _choose(self, tau: float) -> tuple[str, float | None]:
        if not self.buffer:
            return "skip", None
        if self.mode == "always":
            return "large", None
        step_s = sum(self.step_times[-self.every:]) / max(len(self.step_times[-self.every:]), 1)
        total = sum(len(v) for v in self.rewards.values()) + 1
        skip = self.rewards["skip"]
        drift = sum(skip) / len(skip) if skip else 0.0  # tau's change without an update: the baseline
        best, best_value = "skip", 0.0  # skipping gains nothing and costs nothing, by definition
        for arm in ARMS[1:]:
            r = self.rewards[arm]
            if not r:
                return arm, math.inf  # each update arm is tried once
            mean = sum(r) / len(r) - drift
            sd = math.sqrt(sum((x - sum(r) / len(r)) ** 2 for x in r) / (len(r) - 1)) if len(r) > 1 else 1.0
            bound = mean + UCB_C * sd * math.sqrt(math.log(total) / len(r))
            value = self._gain_s(tau, bound, step_s) - sum(self.costs[arm]) / len(self.costs[arm])
            if value > best_value:
                best, best_value = arm, value
        return best, best_value

    # ------------------------------------------------------------ the update
    def _tensors(self, items) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.params[0].device
        x = torch.stack([it[0] for it in items]).to(device=dev, dtype=self.params[0].dtype)
        y = torch.tensor([it[1] for it in items], dtype=torch.long, device=dev)
        return x, y

    def _buffer_loss(self) -> float | None:
        if not self.buffer:
            return None
        with torch.no_grad():
            x, y = self._tensors(list(self.buffer))
            num, den = rank_loss_terms(self.model.rank_head(x).float(), y, torch.ones(len(y), device=y.device), 10)
        return float(num / den) if float(den) > 0 else None

    def _update(self, steps: int) -> None:
        if steps == 0 or not self.buffer:
            return
        items = list(self.buffer)
        with torch.inference_mode(False), torch.enable_grad():
            for i in range(steps):
                if steps == 1:
                    batch = items[-MINIBATCH:]
                else:
                    idx = torch.randint(len(items), (min(MINIBATCH, len(items)),), generator=self.generator).tolist()
                    batch = [items[j] for j in idx]
                x, y = self._tensors(batch)
                num, den = rank_loss_terms(self.model.rank_head(x).float(), y, torch.ones(len(y), device=y.device), 10)
                if float(den) == 0:
                    return
                self.optimizer.zero_grad(set_to_none=True)
                (num / den).backward()
                self.optimizer.step()

    def take_log(self) -> list[dict]:
        out, self.log = self.log, []
        return out


__all__ = ["Adapter", "ARMS"]
