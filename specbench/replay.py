"""Greedy decoding replayed against reference outputs: tau of any drafter setting without the target's verify forward, and the training-free drafters' defaults tuned by measurement (``python -m specbench.replay``).

Greedy decoding is deterministic, so a drafter's acceptance does not depend on timing: the target's
greedy output of each prompt is generated ONCE (``ar``, cached under ``$SPECBENCH_CACHE/replay``) and
every setting is replayed against it, step by step, with the drafter's own code:

* ``ngram``: the real :class:`~drafters.ngram.NGramDrafter` proposes, the proposal is walked against
  the reference output (exactly what greedy verification accepts), and the committed tokens are fed
  back. Its own proposal time is measured.
* ``draft-model`` (chain): the draft LM is run teacher-forced over prompt + reference output once,
  giving its greedy token and top probability at every position; wherever its token is wrong the
  chain it would keep drafting is run too (up to ``--off-path`` tokens, from a cropped cache), so
  every schedule (constant / heuristic) and confidence threshold is replayed exactly; a chain still
  drafting after ``--off-path`` wrong tokens is assumed to run to its length (a cost upper bound).

Any other drafter, and these two with ``--set``/``--vary``/``--refs``, is replayed one setting at a time
(:func:`replay_drafter`): its own ``propose`` runs on the contexts decoding would give it, the feature
rows taken from one teacher-forced forward over prompt + reference, and a draft counts as accepted
exactly when it is the reference token. That is greedy verification whenever the reference is the
target's greedy output, so tau comes out as decoding measures it without the target's verify forward
(the conformance suite checks step-for-step equality for every registered drafter). Against a
run's own result files (``--refs``) it also says how many rows it retraced step for step, and
``--hardware PROFILE`` prices the replayed steps on a cost profile as ``compare --hardware`` prices a run:

    python -m specbench.replay jetspec --refs results/jetspec-64-math500.parquet \
        --set path=drafters/checkpoints/jetspec-smollm2-135m-r200k-g1-e7-v8k --vary budget=16,32,64 --vary width=4,7 \
        --hardware h100-sxm:engine

Time per step of the tuning modes comes from a cost profile measured in the same process, interleaved: the target's
forward of n tokens (``T_t(n)``, the verify of an n-node chain) and, for draft-model, the draft LM's
forward of 1 and 2 tokens. Predicted decode speedup over ``ar`` = ``N * T_t(1) / sum(step costs)``.
The machine may be shared: the profile is a median of interleaved rounds, and the chosen defaults
are then checked end to end against transformers by ``python -m specbench.bench``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import shlex
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from specbench.decode import generate
from specbench.drafter import DraftContext, Sampling, drafter_class, parse_config
from specbench.errors import UserError
from specbench.outputs import check_out_file, write_report
from specbench.targets import Target, load_target
from specbench.tasks import load_task, render_chat, select
from specbench.tree import chain

DEFAULT_TASKS = ("humaneval", "mbpp", "gsm8k", "mt-bench")
DEFAULT_TARGET = "smollm2-135m"
METRICS = {"tau", "drafts_per_step", "draft_ms_per_step", "draft_share", "speedup", "speedup_geomean"}


# --------------------------------------------------------------------------- reference outputs


@dataclass(frozen=True)
class Ref:
    task: str
    id: str
    prompt: list[int]
    output: list[int]


def greedy_outputs(target: Target, prompts: list[list[int]], max_new: int, batch: int) -> list[list[int]]:
    """Greedy continuations, up to and including the first stop token. ``batch`` > 1 runs that many
    prompts at once through transformers' ``generate`` (left-padded; far faster on a busy CPU, and
    any greedy text serves for tuning); 1 runs specbench's own ``ar`` loop prompt by prompt."""
    stop = set(target.stop_token_ids)
    if batch <= 1:
        ar = drafter_class("ar")(target)
        return [generate(target, ar, torch.tensor(ids), max_new, Sampling()).output_ids for ids in prompts]
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else next(iter(stop))
    outs = []
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        with torch.inference_mode():
            gen = target.model.generate(ids.to(target.device), attention_mask=mask.to(target.device), do_sample=False,
                                        max_new_tokens=max_new, eos_token_id=list(stop), pad_token_id=pad)
        for row in gen[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
            outs.append(row[:cut])
    return outs


def references(target: Target, tasks: list[str], limit: int, seed: int, max_new: int, cache: Path | None,
               batch: int = 1) -> list[Ref]:
    """The target's greedy output of the first turn of each selected prompt (cached as JSON per task)."""
    refs = []
    for task in tasks:
        key = hashlib.sha256(json.dumps([target.name, task, limit, seed, max_new, batch > 1]).encode()).hexdigest()[:12]
        path = None if cache is None else cache / f"refs-{target.name.replace('/', '_')}-{task}-{key}.json"
        if path is not None and path.exists():
            refs += [Ref(**r) for r in json.loads(path.read_text())]
            continue
        chosen = select(load_task(task), limit, seed)
        prompts = [render_chat(target.tokenizer, [{"role": "user", "content": p.turns[0]}]) for p in chosen]
        mine = [Ref(task, p.id, list(ids), out) for p, ids, out in zip(chosen, prompts, greedy_outputs(target, prompts, max_new, batch))]
        print(f"references {task}: {len(chosen)} prompts", flush=True)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps([r.__dict__ for r in mine]))
        refs += mine
    return refs


# --------------------------------------------------------------------------- cost profile


def forward_costs(model: Target, context: list[int], sizes: list[int], rounds: int) -> dict[int, float]:
    """Median seconds of one forward of n tokens after ``context`` (interleaved over sizes)."""
    model.prefill(torch.tensor(context))
    pos = len(context)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    filler = (context * (1 + max(sizes) // max(1, len(context))))[: max(sizes)]
    for r in range(rounds + 1):
        for n in sizes:
            t0 = time.perf_counter()
            model.forward_tree(chain(filler[:n]), pos, last_logits_only=False)
            dt = time.perf_counter() - t0
            model.truncate(pos)
            if r:  # round 0 warms up
                times[n].append(dt)
    return monotone({n: statistics.median(v) for n, v in times.items()})


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """The least-squares non-decreasing fit of the medians over n (pool adjacent violators): on a
    busy machine single medians can invert (a 4-token forward timed below a 3-token one)."""
    blocks: list[list[float]] = []  # [sum, count]
    for n in sorted(costs):
        blocks.append([costs[n], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
    return dict(zip(sorted(costs), fitted))


def _cost(costs: dict[int, float], n: int) -> float:
    if n in costs:
        return costs[n]
    lo = max(k for k in costs if k <= n)  # beyond the profile: linear from the two largest sizes
    hi_sizes = sorted(costs)[-2:]
    slope = (costs[hi_sizes[1]] - costs[hi_sizes[0]]) / max(1, hi_sizes[1] - hi_sizes[0])
    return costs[lo] + slope * (n - lo)


# --------------------------------------------------------------------------- ngram replay


def replay_ngram(drafter, ref: Ref) -> tuple[int, list[int], float]:
    """(steps, tree sizes, proposal seconds) of ``drafter`` on ``ref`` under greedy verification."""
    steps = replay_drafter(drafter, ref, None)
    return len(steps), [s.tree_size for s in steps], sum(s.draft_s for s in steps)


def sweep_ngram(target: Target, refs: list[Ref], costs: dict[int, float], grid: list[dict]) -> list[dict]:
    cls = drafter_class("ngram")
    rows = []
    for opts in grid:
        cfg = parse_config(cls.Config, [f"{k}={v}" for k, v in opts.items()])
        drafter = cls(target, cfg)
        per_task: dict[str, dict[str, float]] = {}
        for ref in refs:
            steps, sizes, draft_s = replay_ngram(drafter, ref)
            t = per_task.setdefault(ref.task, dict(tokens=0, steps=0, time=0.0, ar_time=0.0, draft_s=0.0, nodes=0))
            t["tokens"] += len(ref.output)
            t["steps"] += steps
            t["nodes"] += sum(sizes) - steps
            t["draft_s"] += draft_s
            t["time"] += sum(_cost(costs, s) for s in sizes) + draft_s
            t["ar_time"] += len(ref.output) * costs[1]
        row = dict(opts)
        speedups = []
        for task, t in per_task.items():
            row[f"tau_{task}"] = t["tokens"] / t["steps"]
            row[f"speedup_{task}"] = t["ar_time"] / t["time"]
            speedups.append(row[f"speedup_{task}"])
        tot = {k: sum(t[k] for t in per_task.values()) for k in ("tokens", "steps", "time", "ar_time", "draft_s", "nodes")}
        row["tau"] = tot["tokens"] / tot["steps"]
        row["drafts_per_step"] = tot["nodes"] / tot["steps"]
        row["draft_ms_per_step"] = 1e3 * tot["draft_s"] / tot["steps"]
        row["speedup"] = tot["ar_time"] / tot["time"]
        row["speedup_geomean"] = statistics.geometric_mean(speedups)
        rows.append(row)
    return rows


def ngram_grid(quick: bool) -> list[dict]:
    if quick:
        return [dict(match=m, max_n=3, num_draft=4) for m in ("first", "recent", "longest")]
    grid = []
    for match, min_n, max_n, num_draft in itertools.product(("first", "recent", "longest"), (1, 2, 3), (1, 2, 3, 4, 5),
                                                             (2, 3, 4, 5, 7, 10)):
        if max_n >= min_n:
            grid.append(dict(match=match, min_n=min_n, max_n=max_n, num_draft=num_draft))
    for match, branches in itertools.product(("recent", "longest"), (2, 3)):
        for min_n, num_draft in ((1, 4), (2, 4), (2, 7)):
            grid.append(dict(match=match, min_n=min_n, max_n=3, num_draft=num_draft, branches=branches))
    return grid


# --------------------------------------------------------------------------- draft-model replay


@dataclass
class DraftTrace:
    """The draft LM's greedy token and top probability at every output position of one reference,
    and, where that token is wrong, the top probabilities of the chain it keeps drafting."""

    token: list[int]
    prob: list[float]
    off: dict[int, list[float]]  # output index j (token[j] != output[j]) -> probs of the following drafts


@torch.inference_mode()
def trace_draft(draft: Target, ref: Ref, off_path: int, min_threshold: float) -> DraftTrace:
    seq = ref.prompt + ref.output
    p0 = len(ref.prompt)
    draft.prefill(torch.tensor(seq[: p0 - 1]))
    logits = draft.forward_tree(chain(seq[p0 - 1 : -1]), p0 - 1).logits  # row k predicts seq[p0 + k]
    probs = torch.softmax(logits.float(), -1)
    top = probs.max(-1)
    token, prob = top.indices.tolist(), top.values.tolist()
    off: dict[int, list[float]] = {}
    have = len(seq) - 1  # the cache holds the true sequence up to here
    for j, (d, p) in enumerate(zip(token, prob)):
        if d == ref.output[j] or p < min_threshold or off_path == 0:
            continue
        base = p0 + j  # the wrong draft sits at this position, after the true seq[:base]
        if have > base:
            draft.truncate(base)
        elif have < base:  # an earlier off-path run cropped the cache: bring the true tokens back
            draft.forward_tree(chain(seq[have:base]), have, last_logits_only=True)
        have = base
        tok, chain_probs = d, []
        for k in range(off_path):
            lg = draft.forward_tree(chain([tok]), base + k, last_logits_only=True).logits[-1]
            q = torch.softmax(lg.float(), -1)
            pk, tok = (float(x) for x in q.max(-1))
            tok = int(tok)
            chain_probs.append(pk)
            if pk < min_threshold:
                break
        draft.truncate(base)
        off[j] = chain_probs
    return DraftTrace(token, prob, off)


def replay_chain(trace: DraftTrace, out: list[int], num_draft: int, schedule: str, threshold: float,
                 ) -> list[tuple[int, int, int]]:
    """Steps of a draft chain against the reference: (drafted, accepted, catch-up tokens) each."""
    i, length, steps = 0, num_draft, []
    catch_up = 1
    while i < len(out):
        drafted, acc, wrong = 0, 0, False
        while drafted < length:
            j = i + drafted
            if j >= len(out) - 1 and not wrong:  # nothing left to verify against: the chain stops here
                break
            if not wrong:
                p = trace.prob[j]
                wrong = trace.token[j] != out[j]
                if not wrong:
                    acc += 1
                drafted += 1
                if p < threshold:
                    break
                if wrong:
                    off = trace.off.get(j)
                    off_iter = iter(off) if off is not None else iter(())
            else:
                q = next(off_iter, None)
                drafted += 1
                if q is not None and q < threshold:
                    break
        steps.append((drafted, acc, catch_up))
        catch_up = 2 if drafted and acc == drafted else 1
        if schedule == "heuristic" and drafted:
            length = length + 2 if acc == drafted else max(1, length - 1)
        i += acc + 1
    return steps


def sweep_draft_model(refs: list[Ref], traces: list[DraftTrace], t_costs: dict[int, float], d_costs: dict[int, float],
                      grid: list[dict]) -> list[dict]:
    rows = []
    for opts in grid:
        tokens = steps_n = drafted_n = 0
        time_s = ar_s = draft_s = 0.0
        for ref, tr in zip(refs, traces):
            for drafted, acc, catch_up in replay_chain(tr, ref.output, opts["num_draft"], opts["schedule"], opts["threshold"]):
                d = (_cost(d_costs, catch_up) + (drafted - 1) * d_costs[1]) if drafted else 0.0
                draft_s += d
                time_s += d + _cost(t_costs, drafted + 1)
                steps_n += 1
                drafted_n += drafted
            tokens += len(ref.output)
            ar_s += len(ref.output) * t_costs[1]
        rows.append(dict(opts, tau=tokens / steps_n, drafts_per_step=drafted_n / steps_n, draft_share=draft_s / time_s,
                         speedup=ar_s / time_s))
    return rows


def draft_model_grid() -> list[dict]:
    grid = []
    for schedule, num_draft, threshold in itertools.product(("constant", "heuristic"), (2, 3, 4, 5, 7, 10, 20),
                                                            (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)):
        grid.append(dict(schedule=schedule, num_draft=num_draft, threshold=threshold))
    return grid


# --------------------------------------------------------------------------- any drafter, one setting at a time


@dataclass(frozen=True)
class ReplayStep:
    tree_size: int  # nodes including the root
    accepted: int  # drafts on the path the reference output takes through the tree
    draft_s: float  # the drafter's propose() call
    forwards: int = 0  # drafter forwards the tree took (``DraftTree.n_forwards``), as a run logs them


def teacher_features(target: Target, seq: list[int], layers: tuple[int, ...]) -> torch.Tensor | None:
    """[len(seq) - 1, F]: the target's tapped state at every position but the last, from one forward over
    ``seq[:-1]`` (row j pairs with token j + 1, as in decoding); None for a drafter that taps nothing."""
    if not layers:
        return None
    return target.prefill(torch.tensor(seq[:-1]), layers)


def replay_drafter(drafter, ref: Ref, features: torch.Tensor | None, device: torch.device | str = "cpu") -> list[ReplayStep]:
    """The steps greedy decoding of ``ref.prompt`` takes with ``drafter``, the target's verify forward
    replaced by ``ref.output`` (its greedy output, so a draft is accepted exactly when it is the
    reference token) and its feature rows by ``features`` (:func:`teacher_features` of prompt + output).

    The drafter gets the contexts :func:`specbench.decode.generate` gives it: the prompt with its rows
    first, then each step's accepted drafts and bonus token with the rows of the root and the accepted
    nodes, and the accepted node ids. The last step may accept fewer than decoding does: the replay
    keeps the last reference token as a bonus (nothing is known past it). ``device``: the target's, where
    decoding keeps the committed tokens."""
    out = ref.output
    p0 = len(ref.prompt)
    rows = (lambda a, b: None) if features is None else (lambda a, b: features[a:b])
    drafter.reset(Sampling())
    ctx = DraftContext(tokens=torch.tensor(ref.prompt, device=device), features=rows(0, p0 - 1), pos=p0 - 1,
                       accepted_nodes=None)
    steps: list[ReplayStep] = []
    i = 0  # output tokens committed
    while i < len(out):
        t0 = time.perf_counter()
        tree = drafter.propose(ctx)
        draft_s = time.perf_counter() - t0
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        children: dict[int, dict[int, int]] = {}
        for node in range(len(tokens) - 1, 0, -1):  # the first of equal siblings wins, as in verify
            children.setdefault(parents[node], {})[tokens[node]] = node
        path = [0]
        while i + len(path) - 1 < len(out) - 1 and out[i + len(path) - 1] in children.get(path[-1], {}):
            path.append(children[path[-1]][out[i + len(path) - 1]])
        acc = len(path) - 1
        pos = ctx.pos
        ctx = DraftContext(tokens=torch.tensor(out[i : i + acc + 1], device=device), features=rows(pos, pos + acc + 1),
                           pos=pos + acc + 1, accepted_nodes=torch.tensor(path, device=device))
        steps.append(ReplayStep(len(tokens), acc, draft_s, int(tree.n_forwards)))
        i += acc + 1
    return steps


def result_refs(files: list[Path]) -> tuple[list[Ref], pd.DataFrame]:
    """Every row of specbench result ``files`` as a reference (its prompt and output; greedy rows only),
    with the rows themselves (for their own steps)."""
    from specbench import results

    df = results.read_results(files).reset_index(drop=True)
    sampled = df[df["temperature"] > 0]
    if len(sampled):
        raise UserError(f"{len(sampled)} row(s) of the --refs files were sampled (temperature > 0); a replay needs "
                        "greedy outputs: give the result files of a temperature-0 run (e.g. a sweep's AR baseline)")
    refs = [Ref(task, f"{pid}#{turn}", [int(x) for x in prompt], [int(x) for x in output])
            for task, pid, turn, prompt, output in zip(df["task"], df["prompt_id"], df["turn"], df["prompt_ids"], df["output_ids"])]
    return refs, df


def grid_of(vary: list[str]) -> list[dict[str, str]]:
    """``["budget=16,64", "width=4,7"]`` -> every combination, in order: [{budget: 16, width: 4}, ...]."""
    axes = []
    for item in vary:
        key, sep, values = item.partition("=")
        parts = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not parts:
            raise UserError(f"--vary expects key=v1,v2,..., got '{item}'")
        axes.append([(key.strip(), v) for v in parts])
    return [dict(combo) for combo in itertools.product(*axes)]


def sweep_drafter(target: Target, name: str, fixed: list[str], grid: list[dict[str, str]], refs: list[Ref],
                  live: pd.DataFrame | None = None, progress=None, hardware: tuple[str, ...] = (),
                  as_target: str | None = None) -> list[dict]:
    """One row per setting of ``grid`` (each on top of ``fixed``): tau per task and pooled, the mean tree
    size, the drafter's mean propose time; with ``live`` (the references' own result rows), how many rows
    of a run with this very drafter, weights and options the replay retraced step for step. ``progress(done,
    total, label)`` is called after each reference of each setting.

    With ``hardware`` (profile names, see ``specbench hardware``), each row also gets
    ``speedup_<profile>``: the decode speedup :func:`specbench.hardware.project.project_rows` projects
    for the replayed steps, exactly as ``compare --hardware`` prices a run's logged steps (ratio of sums;
    NaN where the drafter's shape is unknown), and with several tasks ``speedup_<profile>_<task>`` for
    each. ``as_target``: price them as if the target had that shape."""
    from specbench.drafter import config_json
    from specbench.report import accept_at_least

    cls = drafter_class(name)
    features: dict[tuple[int, ...], list[torch.Tensor | None]] = {}
    rows = []
    for opts in grid:
        config = parse_config(cls.Config, fixed + [f"{k}={v}" for k, v in opts.items()])
        drafter = cls(target, config)
        layers = tuple(drafter.feature_layers)
        if layers not in features:  # one teacher-forced forward per reference, shared by the settings
            features[layers] = [teacher_features(target, r.prompt + r.output, layers) for r in refs]
        per_task: dict[str, list] = {}
        accepted: list[int] = []
        same = compared = 0
        mine = json.loads(config_json(config))
        logged = []  # result-row fields of each replayed reference, for the projection
        for k, ref in enumerate(refs):
            steps = replay_drafter(drafter, ref, features[layers][k], target.device)
            if hardware:
                logged.append(_as_result_row(target, name, config_json(config), drafter, ref, steps))
            t = per_task.setdefault(ref.task, [0, 0, 0, 0.0])
            t[0] += len(ref.output)
            t[1] += len(steps)
            t[2] += sum(s.tree_size for s in steps)
            t[3] += sum(s.draft_s for s in steps)
            accepted += [s.accepted for s in steps]
            if progress is not None:
                progress(len(rows) * len(refs) + k + 1, len(grid) * len(refs), ", ".join(f"{a}={b}" for a, b in opts.items()))
            if live is not None and _same_run(live.iloc[k], name, drafter, mine):
                compared += 1
                same += [s.accepted for s in steps][:-1] == [int(a) for a in live.iloc[k]["accepted_per_step"]][:-1]
        row: dict = dict(opts)
        for task, (tokens, n, _, _) in per_task.items():
            row[f"tau_{task}"] = tokens / n
        tokens, n, nodes, draft_s = (sum(t[j] for t in per_task.values()) for j in range(4))
        row.update(tau=tokens / n, steps=n, tree_size=nodes / n, draft_ms_per_step=1e3 * draft_s / n)
        # P(acc >= d) in %, d = 1 up to the deepest accepted depth (at most 8), as `compare` shows it
        at_least = accept_at_least(pd.DataFrame({"accepted_per_step": [accepted]}), min(8, max([1, *accepted])))
        row["p_acc_ge_d"] = "/".join(f"{100 * x:.0f}" for x in at_least)
        if compared:
            row["live_rows_retraced"] = f"{same}/{compared}"
        if hardware:
            from specbench.hardware.project import project_rows

            frame = pd.DataFrame.from_records(logged).assign(task=[r.task for r in refs])
            for profile in hardware:
                row[f"speedup_{profile}"] = project_rows(frame, profile, as_target).speedup_sum
                if len(per_task) > 1:  # per task too (the .json; the table shows the pooled one)
                    for task, sub in frame.groupby("task", sort=False):
                        row[f"speedup_{profile}_{task}"] = project_rows(sub, profile, as_target).speedup_sum
        rows.append(row)
    return rows


def _as_result_row(target: Target, name: str, config: str, drafter, ref: Ref, steps: list[ReplayStep]) -> dict:
    """The fields of a result row (:mod:`specbench.results`) the hardware projection reads, for replayed ``steps``."""
    ckpt = drafter.checkpoint
    return {"target": target.name, "drafter": name, "drafter_config": config,
            "checkpoint_path": None if ckpt is None else ckpt.path, "prompt_ids": ref.prompt,
            "n_new_tokens": len(ref.output), "n_steps": len(steps),
            "tree_size_per_step": [s.tree_size for s in steps], "accepted_per_step": [s.accepted for s in steps],
            "drafter_forwards_per_step": [s.forwards for s in steps]}


def _same_run(live_row, name: str, drafter, mine: dict) -> bool:
    """Whether a result row was decoded by drafter ``name`` with these weights and options (path aside)."""
    if live_row["drafter"] != name:
        return False
    sha = None if drafter.checkpoint is None else drafter.checkpoint.sha256
    if (live_row["checkpoint_hash"] or None) != sha:
        return False
    theirs = json.loads(live_row["drafter_config"])
    return {k: v for k, v in theirs.items() if k != "path"} == {k: v for k, v in mine.items() if k != "path"}


def live_taus(df: pd.DataFrame) -> dict[str, float]:
    """tau per task of the reference rows' own decoding (tokens over steps, as :func:`replay_drafter` counts)."""
    g = df.groupby("task")[["n_new_tokens", "n_steps"]].sum()
    return {task: float(r["n_new_tokens"] / r["n_steps"]) for task, r in g.iterrows()}


# --------------------------------------------------------------------------- output


def _markdown(rows: list[dict], keys: list[str], sort: str, top: int | None = None) -> list[str]:
    rows = sorted(rows, key=lambda r: (r[sort] != r[sort], -r[sort] if r[sort] == r[sort] else 0))[:top]  # NaN last
    out = ["| " + " | ".join(keys) + " |", "|" + "|".join("---:" for _ in keys) + "|"]
    for r in rows:
        out.append("| " + " | ".join(f"{r.get(k, ''):.3f}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys) + " |")
    return out


def main(argv: list[str] | None = None, prog: str = "python -m specbench.replay") -> None:
    from specbench.fetch import cache_root
    from specbench.results import env_fingerprint

    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("drafter", help="any drafter, replayed at --set/--vary settings; ngram or draft-model alone tunes its defaults")
    ap.add_argument("--target", default=None, help="default smollm2-135m, or the one the --refs files name")
    ap.add_argument("--draft", default="", help="draft-model: the draft LM (alias or directory)")
    ap.add_argument("--tasks", default=None, help=f"comma-separated (default {','.join(DEFAULT_TASKS)}); with --refs, "
                    "only those files' rows of these tasks")
    ap.add_argument("--limit", type=int, default=10, help="prompts per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the cost profile")
    ap.add_argument("--off-path", type=int, default=8, help="draft-model: wrong-chain tokens run per miss")
    ap.add_argument("--batch", type=int, default=None, help="reference outputs: prompts per batched transformers generate "
                    "(1 = specbench's own ar loop, prompt by prompt; default 10 when tuning, else 1)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a drafter option every setting shares (repeatable)")
    ap.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                    help="a drafter option to replay at each value; several --vary make a grid")
    ap.add_argument("--refs", nargs="+", type=Path, default=[], metavar="FILE",
                    help="replay against these result files' prompts and greedy outputs instead of generating references")
    ap.add_argument("--hardware", action="append", default=[], metavar="PROFILE",
                    help="replay: also project each setting's decode speedup onto this profile, as compare --hardware "
                    "does (repeatable; see `specbench hardware`)")
    ap.add_argument("--as-target", default=None, metavar="CONFIG",
                    help="with --hardware: price the steps as if the target had this shape (bundled name or config.json)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default); 1 is steadier on a busy machine")
    ap.add_argument("--quick", action="store_true", help="a 3-setting ngram grid (tests)")
    ap.add_argument("--refs-only", action="store_true", help="only generate (and cache) the reference outputs")
    ap.add_argument("--no-cache", action="store_true", help="do not read or write cached reference outputs")
    ap.add_argument("--out", type=Path, default=None, help="markdown report, and its .json (tuning: default "
                    "reports/replay_<drafter>_<target>.md; a replay writes one only when given)")
    args = ap.parse_args(argv)
    args.argv = argv if argv is not None else __import__("sys").argv[1:]
    args.prog = prog

    tasks = [t.strip() for t in (args.tasks or ",".join(DEFAULT_TASKS)).split(",") if t.strip()]
    if args.threads:
        torch.set_num_threads(args.threads)
    tuning = args.drafter in ("ngram", "draft-model") and not (args.set or args.vary or args.refs or args.hardware)
    if not tuning:
        return replay_main(args, tasks)
    args.target = args.target or DEFAULT_TARGET
    args.batch = 10 if args.batch is None else args.batch
    out = args.out or Path(f"reports/replay_{args.drafter.replace('-', '_')}_{args.target}.md")
    if not args.refs_only:
        check_out_file(out)  # before the model loads, not after the tuning
    target = load_target(args.target)
    refs = references(target, tasks, args.limit, args.seed, args.max_new_tokens, None if args.no_cache else cache_root() / "replay",
                      args.batch)
    if not refs:
        raise UserError("no prompts selected")
    if args.refs_only:
        return
    plen = sorted(len(r.prompt) for r in refs)[len(refs) // 2]
    context = (refs[0].prompt + refs[0].output) * (1 + (plen + args.max_new_tokens // 2) // max(1, len(refs[0].prompt) + len(refs[0].output)))
    context = context[: plen + args.max_new_tokens // 2]
    env = env_fingerprint(target.device.type, str(target.dtype).removeprefix("torch."))
    cmd = f"{prog} " + " ".join(shlex.quote(a) for a in args.argv)
    head = [f"# Tuning `{args.drafter}` on {args.target}", "", f"`{cmd}`", "",
            f"Machine: {env['cpu_model']}, {env['threads']} threads, {env['device']} {env['dtype']}, torch {env['torch_version']}, "
            f"transformers {env['transformers_version']}, specbench {env['specbench_sha']}. The CPU was shared with other "
            "processes: the cost profile is the median of interleaved rounds; speedups are predicted from it (see specbench/replay.py).",
            "", f"Prompts: {len(refs)} ({', '.join(f'{t} {sum(r.task == t for r in refs)}' for t in tasks)}), first turn, "
            f"greedy ({'batched transformers generate' if args.batch > 1 else 'specbench ar'}), up to {args.max_new_tokens} new tokens ({sum(len(r.output) for r in refs)} tokens in all).", ""]
    if args.drafter == "ngram":
        sizes = list(range(1, 12)) + [13, 16, 22, 31]
        costs = forward_costs(target, context, sizes, args.rounds)
        rows = sweep_ngram(target, refs, costs, ngram_grid(args.quick))
        keys = ["match", "max_n", "min_n", "num_draft", "branches", "tau", "drafts_per_step", "draft_ms_per_step",
                "speedup", "speedup_geomean"] + [f"speedup_{t}" for t in tasks] + [f"tau_{t}" for t in tasks]
        profile = costs
    else:
        if not args.draft:
            raise UserError("draft-model tuning needs --draft (the draft LM)")
        draft = load_target(args.draft)
        grid = draft_model_grid()
        min_thr = min(g["threshold"] for g in grid if g["threshold"] > 0)
        traces = []
        for ref in refs:
            traces.append(trace_draft(draft, ref, args.off_path, min_thr))
            print(f"traced {ref.task}/{ref.id}", flush=True)
        sizes = list(range(1, 12)) + [13, 16, 22]
        t_costs, d_costs = {}, {}
        for _ in range(2):  # two interleaved halves of target and draft profiles
            half = max(1, args.rounds // 2)
            for store, model, sz in ((t_costs, target, sizes), (d_costs, draft, [1, 2])):
                for n, v in forward_costs(model, context, sz, half).items():
                    store.setdefault(n, []).append(v)
        t_costs = {n: statistics.mean(v) for n, v in t_costs.items()}
        d_costs = {n: statistics.mean(v) for n, v in d_costs.items()}
        rows = sweep_draft_model(refs, traces, t_costs, d_costs, grid)
        keys = ["schedule", "num_draft", "threshold", "tau", "drafts_per_step", "draft_share", "speedup"]
        profile = {**{f"target_{n}": v for n, v in t_costs.items()}, **{f"draft_{n}": v for n, v in d_costs.items()}}
    best = max(rows, key=lambda r: r["speedup"])
    lines = head + ["Cost profile (ms per forward of n tokens): " + ", ".join(f"{k}: {1e3 * v:.1f}" for k, v in profile.items()), "",
                    f"Best by predicted decode speedup: {json.dumps({k: best[k] for k in keys if k in best and k not in METRICS and not k.startswith(('tau_', 'speedup_'))})} "
                    f"(tau {best['tau']:.2f}, predicted speedup {best['speedup']:.3f}).", "",
                    f"## All {len(rows)} settings, best first", ""]
    lines += _markdown(rows, [k for k in keys if any(k in r for r in rows)], "speedup")
    write_report(out, "\n".join(lines) + "\n", dict(command=cmd, env=env, profile_s=profile, rows=rows))
    print("\n".join(lines[: len(head) + 12]))


def replay_main(args, tasks: list[str]) -> None:
    """Replay one drafter at every setting of ``--vary`` (over ``--set``) and print a table of tau."""
    from specbench.fetch import cache_root
    from specbench.results import env_fingerprint

    cls = drafter_class(args.drafter)  # an unknown name: one line, before any model loads
    grid = grid_of(args.vary) or [{}]
    if args.out is not None:
        check_out_file(args.out)
    if args.as_target is not None and not args.hardware:
        raise UserError("--as-target needs --hardware PROFILE to price the what-if on (e.g. --hardware h100-sxm:engine)")
    if args.hardware:
        from specbench.hardware.project import check_projection

        check_projection(args.hardware, args.as_target)  # an unknown profile or shape: one line, before any model loads
    for opts in grid:  # every setting parses before the first replay
        parse_config(cls.Config, args.set + [f"{k}={v}" for k, v in opts.items()])
    live = None
    if args.refs:
        refs, live = result_refs(args.refs)
        if args.tasks:  # only the rows of the tasks asked for
            keep = [k for k, r in enumerate(refs) if r.task in tasks]
            if not keep:
                raise UserError(f"the --refs files hold no row of --tasks {args.tasks} (they hold "
                                f"{', '.join(sorted({r.task for r in refs}))})")
            refs, live = [refs[k] for k in keep], live.iloc[keep].reset_index(drop=True)
        names = set(live["target"])
        if args.target is None and len(names) == 1:  # the target that decoded them
            args.target = next(iter(names))
        if names != {args.target}:
            raise UserError(f"the --refs files were decoded by {', '.join(sorted(names))}, not --target {args.target}; "
                            "give the target they name")
    args.target = args.target or DEFAULT_TARGET
    target = load_target(args.target)
    if not args.refs:
        batch = 1 if args.batch is None else args.batch
        refs = references(target, tasks, args.limit, args.seed, args.max_new_tokens,
                          None if args.no_cache else cache_root() / "replay", batch)
    if not refs:
        raise UserError("no prompts selected")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from specbench.progress import LoggedProgress

    with LoggedProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[label]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                        console=Console(stderr=True), transient=True) as bar:
        job = bar.add_task(f"replay {args.drafter}", total=len(grid) * len(refs), label="")
        rows = sweep_drafter(target, args.drafter, list(args.set), grid, refs, live,
                             lambda done, total, label: bar.update(job, completed=done, total=total, label=label),
                             tuple(args.hardware), args.as_target)
    env = env_fingerprint(target.device.type, str(target.dtype).removeprefix("torch."))
    cmd = f"{args.prog} " + " ".join(shlex.quote(a) for a in args.argv)
    seen = list(dict.fromkeys(r.task for r in refs))
    keys = [*grid[0], "tau", *(f"tau_{t}" for t in seen), "p_acc_ge_d", "tree_size", "draft_ms_per_step", "steps"]
    keys += [f"speedup_{h}" for h in args.hardware]
    if any("live_rows_retraced" in r for r in rows):
        keys.append("live_rows_retraced")
    lines = [f"# Replaying `{args.drafter}` on {args.target}", "", f"`{cmd}`", "",
             f"Fixed options: {', '.join(args.set) or '(defaults)'}. References: {len(refs)} "
             f"({', '.join(f'{t} {sum(r.task == t for r in refs)}' for t in seen)}; {sum(len(r.output) for r in refs)} "
             f"output tokens), {'from ' + ', '.join(map(str, args.refs)) if args.refs else 'generated greedily'}. "
             "tau is replayed (greedy: a draft counts when it is the reference token), not timed; draft ms is the "
             f"drafter's own propose() on {env['cpu_model']}, {env['threads']} thread{'s' * (env['threads'] != 1)}, "
             f"{env['device']} {env['dtype']}.", ""]
    if args.hardware:
        shape = f", as if the target had {args.as_target}'s shape" if args.as_target else ""
        lines += ["speedup_<profile>: decode speedup over AR projected from the replayed steps by the cost model of that "
                  f"hardware profile (`specbench hardware`){shape}, as `compare --hardware` prices a run; projected, "
                  "not measured.", ""]
        if any(r[f"speedup_{h}"] != r[f"speedup_{h}"] for r in rows for h in args.hardware):  # NaN
            lines += ["nan: the drafter's shape is unknown (random weights, or a checkpoint folder without config.json), "
                      "so its forwards cannot be priced.", ""]
    if live is not None and (live["drafter"] != "ar").any():
        lines += ["The reference files' own decoding: " + ", ".join(
            f"{d} on {t}: tau {v:.3f}" for d, sub in live.groupby("drafter") for t, v in live_taus(sub).items()) + ".", ""]
    sort = f"speedup_{args.hardware[0]}" if args.hardware else "tau"  # the fastest on the GPU asked about first
    lines += [f"Settings best first by {sort}.", ""] if len(rows) > 1 else []
    lines += _markdown(rows, keys, sort)
    print("\n".join(lines))
    if args.out:
        write_report(args.out, "\n".join(lines) + "\n", dict(command=cmd, env=env, rows=rows))


if __name__ == "__main__":
    import sys

    try:
        main()
    except UserError as exc:  # one line, exit 2, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted; no report was written", file=sys.stderr)
        sys.exit(130)
