"""The conformance suite: every drafter registered in the ``specbench.drafters`` entry-point group.

A family gets these tests with no test code of its own; a drafter installed by a third-party
package is collected the same way. For each registered drafter, with each option list it declares
in ``test_options`` (learned drafters: with ``path=random`` and, when the family has
``training()``, with a checkpoint fitted here for a few seconds by its own training loss on the
target's greedy text, so that drafts are actually accepted):

* greedy losslessness: the output equals ``ar``'s token for token on 20 prompts, on tiny-llama,
  tiny-qwen3 and tiny-llama3 (Llama-3 RoPE scaling); the fitted variants must accept drafts;
* sampled distribution: at temperature 0.8 with top-p 0.9, the first two generated tokens follow
  the target's exact distribution (chi-square), with drafts accepted on the way; a negative
  control (samples at temperature 0.6 against the same expectation) must fail the same test;
* feature rows: for drafters that tap target features, every (token, feature, position) row the
  harness handed over equals a teacher-forced forward over the final sequence.

The first option list runs on every target; further lists run on tiny-llama.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from specbench.decode import generate
from specbench.drafter import (
    DraftContext, Drafter, Sampling, available_drafters, drafter_class, parse_config, takes_checkpoint,
)
from specbench.targets import load_target
from specbench.tasks import load_task, render_chat
from specbench.train.trainer import Batch
from stopsearch import early_stop_prompt
from test_verify import P_MIN, chi2_pvalue, exact_two_token_probs, first_token, first_token_probs

TARGETS = ["tiny-llama", "tiny-qwen3", "tiny-llama3"]
MAX_NEW = 16
N_PROMPTS = 20
FIT_STEPS = 100
SAMPLING = dict(temperature=0.8, top_p=0.9)
N_DRAWS = 240


# --------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    drafter: str
    options: tuple[str, ...]
    weights: str  # "" (no weights), "random" or "fitted"

    @property
    def id(self) -> str:
        return "-".join([self.drafter, self.weights, *self.options]).replace("=", "").strip("-")


def cases() -> list[tuple[Case, tuple[str, ...]]]:
    """(case, the targets it runs on) for every registered drafter, and the case the sampled test uses.

    The first option list runs on every target: a learned drafter that trains is fitted on
    tiny-llama (where drafts are then accepted) and runs with random weights on the other targets.
    Further option lists run on tiny-llama (fitted when the family trains, else random).
    """
    out = []
    for name in sorted(available_drafters()):
        cls = drafter_class(name)
        learned, trains = takes_checkpoint(cls), cls.training() is not None
        for i, opts in enumerate(cls.test_options):
            opts = tuple(opts)
            if not learned:
                out.append((Case(name, opts, ""), tuple(TARGETS) if i == 0 else ("tiny-llama",)))
                continue
            if i == 0:  # random weights on the targets it is not fitted on
                out.append((Case(name, opts, "random"), tuple(TARGETS[1:]) if trains else tuple(TARGETS)))
            out.append((Case(name, opts, "fitted" if trains else "random"), ("tiny-llama",)) if trains or i else None)
    return [c for c in out if c is not None]


def sampled_case(name: str) -> Case:
    cls = drafter_class(name)
    weights = ("fitted" if cls.training() is not None else "random") if takes_checkpoint(cls) else ""
    return Case(name, tuple(cls.test_options[0]), weights)


GREEDY = [pytest.param(c, t, id=f"{c.id}@{t}") for c, targets in cases() for t in targets]
SAMPLED = [pytest.param(sampled_case(n), id=sampled_case(n).id) for n in sorted(available_drafters())]
FIRST = [pytest.param(Case(n, tuple(drafter_class(n).test_options[0]), "random" if takes_checkpoint(drafter_class(n)) else ""),
                      id=n) for n in sorted(available_drafters())]


# --------------------------------------------------------------------------- targets, prompts, references


class Setup:
    def __init__(self, name: str):
        self.target = load_target(name, device="cpu", dtype="float32")
        tok = self.target.tokenizer
        # the ends of HumanEval prompts (their starts repeat) and the starts of MT-Bench questions
        texts = [p.turns[0][-40:] for p in load_task("humaneval")[:8]] + [p.turns[0][:40] for p in load_task("mt-bench")[:8]]
        self.sampled = sampled_prompt(self.target)
        self.prompts = [early_stop_prompt(self.target), self.sampled]
        self.prompts += [torch.tensor(tok.encode(t)) for t in ("the cat sat on the mat. the cat sat on", "abc abc abc abc abc")]
        self.prompts += [torch.tensor(render_chat(tok, [{"role": "user", "content": t}])) for t in texts]
        assert len(self.prompts) == N_PROMPTS
        self.reference = [self.run(drafter_class("ar")(self.target, None), p) for p in self.prompts]
        assert len(self.reference[0]) < MAX_NEW  # the early-stop prompt stops every drafter early

    def run(self, drafter: Drafter, prompt: torch.Tensor, sampling: Sampling | None = None, max_new: int = MAX_NEW):
        return generate(self.target, drafter, prompt, max_new, sampling or Sampling()).output_ids

    def sequences(self) -> list[torch.Tensor]:
        return [torch.cat([p, torch.tensor(r, dtype=torch.long)]) for p, r in zip(self.prompts, self.reference)]


@pytest.fixture(scope="session")
def setups():
    """Targets, prompts, references and fitted checkpoints, built on first use and kept for the
    session (xdist workers interleave modules, which would tear a module fixture down)."""
    return {}


def setup_for(setups: dict, name: str) -> Setup:
    if name not in setups:
        setups[name] = Setup(name)
    return setups[name]


# --------------------------------------------------------------------------- a brief fit through the family's own loss


def greedy_batch(target, sequences: list[torch.Tensor], layers: tuple[int, ...]) -> Batch:
    """A training batch over ``sequences`` with the target's own states (every token scored)."""
    width = max(s.numel() for s in sequences)
    n = len(sequences)
    tokens = torch.zeros(n, width, dtype=torch.long)
    valid = torch.zeros(n, width, dtype=torch.bool)
    hidden = torch.zeros(n, width, len(layers), target.hidden_size)
    argmax = torch.zeros(n, width, dtype=torch.long)
    with torch.no_grad():
        for i, seq in enumerate(sequences):
            out = target.model(input_ids=seq[None], use_cache=False, output_hidden_states=True)
            t = seq.numel()
            tokens[i, :t], valid[i, :t] = seq, True
            hidden[i, :t] = torch.stack([out.hidden_states[j][0] for j in layers], dim=1)
            argmax[i, :t] = out.logits[0].argmax(-1)
    return Batch(tokens, valid.clone(), valid, hidden, argmax)


def recipe_options(name: str, options: tuple[str, ...]) -> tuple[str, ...]:
    """The case's options that are also fields of the family's training recipe and not already in
    its ``test_recipe`` (e.g. a reduced ``draft_vocab_size``): a variant is fitted as itself."""
    import dataclasses

    training = drafter_class(name).training()
    fields = {f.name for f in dataclasses.fields(training.Recipe)}
    return tuple(o for o in options if o.split("=", 1)[0] in fields and o not in training.test_recipe)


def fitted_checkpoint(setup: Setup, name: str, tmp_root: Path, extra: tuple[str, ...] = ()) -> Path:
    """A checkpoint of drafter ``name`` trained FIT_STEPS Adam steps on the target's greedy text
    (``extra``: recipe options of the variant).

    Fitted once per test session: under pytest-xdist the workers share ``tmp_root`` and a file
    lock, so the second worker to ask loads what the first one wrote (the fit is seeded)."""
    from filelock import FileLock

    out = tmp_root / "-".join([name, setup.target.name, *(o.replace("=", "") for o in extra)])
    with FileLock(str(out) + ".lock"):
        if not (out / "done").exists():
            fit_and_save(setup, name, out, extra)
            (out / "done").write_text("ok\n")
    return out


def fit_and_save(setup: Setup, name: str, out: Path, extra: tuple[str, ...] = ()) -> None:
    training = drafter_class(name).training()
    recipe = parse_config(training.Recipe, [*training.test_recipe, *extra])
    seqs = setup.sequences()
    ids = [s.tolist() for s in seqs]
    trainable = training(setup.target, recipe, ids, [[1] * len(x) for x in ids])
    batch = greedy_batch(setup.target, seqs, trainable.cache_layers)
    params = [p for p in trainable.module.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=3e-3)
    trainable.module.train()
    losses = []
    for _ in range(FIT_STEPS):
        loss, _ = trainable.loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    trainable.module.eval()
    assert losses[-1] < losses[0], (name, losses[0], losses[-1])
    trainable.save(out, dtype=torch.float32)


def build(setup: Setup, case: Case, tmp_root: Path) -> Drafter:
    cls = drafter_class(case.drafter)
    opts = list(case.options)
    if case.weights == "random":
        opts.append("path=random")
    elif case.weights == "fitted":
        extra = recipe_options(case.drafter, case.options)
        opts.append(f"path={fitted_checkpoint(setup, case.drafter, tmp_root, extra)}")
    return cls(setup.target, parse_config(cls.Config, opts))


@pytest.fixture(scope="session")
def tmp_root(tmp_path_factory, worker_id) -> Path:
    """Shared by the xdist workers of a session (their base temp dirs have a common parent)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_id != "master" else base) / "conformance-fits"
    root.mkdir(exist_ok=True)
    return root


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("case,target", GREEDY)
def test_greedy_output_equals_ar(setups, tmp_root, case: Case, target: str):
    setup = setup_for(setups, target)
    drafter = build(setup, case, tmp_root)
    accepted = steps = 0
    for i, (prompt, ref) in enumerate(zip(setup.prompts, setup.reference)):
        gen = generate(setup.target, drafter, prompt, MAX_NEW, Sampling())
        assert gen.output_ids == ref, f"prompt {i}: {case.id} differs from ar"
        accepted += sum(s.accepted for s in gen.steps)
        steps += len(gen.steps)
    if case.weights == "fitted":
        # trained on these continuations: the equality above is meaningful because drafts were accepted
        assert accepted / steps > 0.1, f"{case.id} accepted {accepted} drafts in {steps} steps"


@torch.inference_mode()
def sampled_prompt(target) -> torch.Tensor:
    """The raw token prompt (of a seeded search) with the smallest two-token outcome space at
    SAMPLING, so a few hundred draws give a chi-square test with power."""
    from specbench.verify import target_probs

    cand = torch.randint(0, 256, (256, 10), generator=torch.Generator().manual_seed(0))
    p1 = target_probs(target.model(input_ids=cand, use_cache=False, logits_to_keep=1).logits[:, -1], Sampling(**SAMPLING))
    support = (p1 > 0).sum(-1)
    rows = cand[(support >= 2) & (support <= 10)]
    assert len(rows), "no prompt with a small first-token support; widen the search"
    return min(rows, key=lambda row: len(two_token_probs(target, row)))


def two_token_probs(target, prompt: torch.Tensor, sampling: dict = SAMPLING) -> dict:
    """P(first two generated tokens) under ``sampling``, from the target's own logits."""
    return exact_two_token_probs(target, prompt, sampling)


def draw(setup: Setup, drafter: Drafter, prompt: torch.Tensor, sampling: dict, seed: int) -> tuple[Counter, int]:
    s = Sampling(generator=torch.Generator().manual_seed(seed), **sampling)
    counts: Counter = Counter()
    accepted = 0
    for _ in range(N_DRAWS):
        gen = generate(setup.target, drafter, prompt, 2, s)
        ids = gen.output_ids
        counts[(ids[0], ids[1] if len(ids) > 1 else None)] += 1
        accepted += sum(step.accepted for step in gen.steps)
    return counts, accepted


@pytest.mark.parametrize("case", SAMPLED)
def test_sampled_distribution_equals_target(setups, tmp_root, case: Case):
    setup = setup_for(setups, "tiny-llama")
    prompt = setup.sampled
    drafter = build(setup, case, tmp_root)
    counts, accepted = draw(setup, drafter, prompt, SAMPLING, seed=11)
    probs = two_token_probs(setup.target, prompt)
    assert chi2_pvalue(counts, probs, N_DRAWS) > P_MIN, sorted(counts.items())
    assert chi2_pvalue(first_token(counts), first_token_probs(probs), N_DRAWS) > P_MIN
    if case.weights == "fitted":  # trained on this prompt's greedy continuation: drafts are accepted on the way
        assert accepted > 0, f"{case.id}: no draft accepted in {N_DRAWS} sampled generations"


def test_sampled_test_rejects_a_wrong_distribution(setups):
    """The negative control: the same statistic on samples drawn at temperature 0.6 fails."""
    setup = setup_for(setups, "tiny-llama")
    prompt = setup.sampled
    ar = drafter_class("ar")(setup.target, None)
    counts, _ = draw(setup, ar, prompt, dict(SAMPLING, temperature=0.6), seed=11)
    assert chi2_pvalue(counts, two_token_probs(setup.target, prompt), N_DRAWS) < P_MIN


class Recorder:
    """Wraps a drafter and keeps every new row the harness hands it."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.feature_layers = inner.feature_layers
        self.rows: list = []

    def reset(self, sampling: Sampling) -> None:
        self.rows = []
        self.inner.reset(sampling)

    def propose(self, ctx: DraftContext):
        self.rows.append(ctx.new_rows())
        return self.inner.propose(ctx)


@pytest.mark.parametrize("case", FIRST)
@pytest.mark.parametrize("target", TARGETS)
def test_feature_rows_equal_teacher_forced(setups, tmp_root, case: Case, target: str):
    setup = setup_for(setups, target)
    drafter = Recorder(build(setup, case, tmp_root))
    if not drafter.feature_layers:
        pytest.skip(f"{case.drafter} takes no target features")
    prompt = setup.prompts[4]
    out = generate(setup.target, drafter, prompt, MAX_NEW, Sampling()).output_ids
    seq = torch.cat([prompt, torch.tensor(out, dtype=torch.long)])
    with torch.no_grad():
        full = setup.target.model(input_ids=seq[None], use_cache=False, output_hidden_states=True)
    feats = torch.cat([full.hidden_states[i][0] for i in drafter.feature_layers], dim=-1)
    positions = torch.cat([r.positions for r in drafter.rows])
    # every committed position from 1 (0 has no predecessor) to the last root handed over, once, in order
    assert positions.tolist() == list(range(1, int(positions[-1]) + 1)) and int(positions[-1]) < seq.numel()
    assert torch.equal(torch.cat([r.tokens for r in drafter.rows]), seq[positions])
    torch.testing.assert_close(torch.cat([r.features for r in drafter.rows]), feats[positions - 1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", SAMPLED)
def test_replay_retraces_decoding(setups, tmp_root, case: Case):
    """``specbench.replay`` (the target's verify replaced by its greedy output, its feature rows by one
    teacher-forced forward) takes the steps real greedy decoding takes: the same tree sizes and the
    same accepted drafts, step for step (the last step aside: the replay keeps the reference's last
    token as a bonus). Fails when a context's tokens, rows or positions are off by one."""
    from specbench import replay

    setup = setup_for(setups, "tiny-llama")
    drafter = build(setup, case, tmp_root)
    accepted = 0
    for prompt in setup.prompts:
        gen = generate(setup.target, drafter, prompt, MAX_NEW, Sampling())
        ref = replay.Ref("t", "p", prompt.tolist(), gen.output_ids)
        feats = replay.teacher_features(setup.target, ref.prompt + ref.output, tuple(drafter.feature_layers))
        steps = replay.replay_drafter(drafter, ref, feats)
        assert len(steps) == len(gen.steps)
        assert [s.accepted for s in steps][:-1] == [s.accepted for s in gen.steps][:-1]
        assert [s.tree_size for s in steps][:-1] == [s.tree_size for s in gen.steps][:-1]
        accepted += sum(s.accepted for s in steps)
    if case.weights == "fitted":
        assert accepted > 0  # the comparison saw drafts accepted, not only roots
