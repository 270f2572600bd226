"""Verification: greedy walks on hand-made trees, target_probs against slow references, and the
statistical heart of the harness: sampling verification (and sampled generation end to end)
reproduces the target distribution, with adversarial drafts and negative controls.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy import stats

from specbench.drafter import Sampling
from specbench.tree import DraftTree, children_lists
from specbench.verify import VerifyResult, target_probs, top2_margins, verify, verify_greedy, verify_sampling

P_MIN = 1e-3  # a correct sampler fails a chi-square test at this level once in a thousand seeds


def T(xs):
    return torch.tensor(xs, dtype=torch.long)


def onehot_logits(n_nodes: int, vocab: int, choice: list[int]) -> torch.Tensor:
    """[n, V] random logits whose argmax at node i is choice[i]."""
    g = torch.Generator().manual_seed(n_nodes * 31 + vocab)
    logits = torch.randn(n_nodes, vocab, generator=g)
    logits[torch.arange(n_nodes), torch.tensor(choice)] = 10.0
    return logits


# --------------------------------------------------------------------------- greedy


def test_greedy_follows_non_first_children_and_takes_bonus_at_leaf():
    #            0 (tok 5)
    #        /      |      \
    #     1 (2)   2 (3)   3 (4)        target picks 4 -> node 3 (third child)
    #              |      /    \
    #            4 (1)  5 (1)  6 (0)   target picks 0 at node 3 -> node 6 (second child)
    #                           |
    #                          7 (7)   target picks 7 at node 6 -> node 7; bonus = choice at 7
    tree = DraftTree(tokens=T([5, 2, 3, 4, 1, 1, 0, 7]), parents=T([-1, 0, 0, 0, 2, 3, 3, 6]))
    choice = [4, 0, 0, 0, 0, 0, 7, 6]
    res = verify(tree, onehot_logits(8, 9, choice), Sampling())
    assert res == VerifyResult(path=[0, 3, 6, 7], bonus=6)


def test_greedy_rejects_at_root_and_mid_path():
    tree = DraftTree(tokens=T([5, 2, 3, 4, 8]), parents=T([-1, 0, 0, 1, 1]))
    # nothing matches at the root: path is the root alone, bonus is the target's choice there
    assert verify_greedy(tree, onehot_logits(5, 9, [6, 0, 0, 0, 0])) == VerifyResult(path=[0], bonus=6)
    # node 1 accepted, then the target wants 7 which no child of 1 holds
    assert verify_greedy(tree, onehot_logits(5, 9, [2, 7, 0, 0, 0])) == VerifyResult(path=[0, 1], bonus=7)
    # node 1 accepted, then the second child of node 1 (token 8)
    assert verify_greedy(tree, onehot_logits(5, 9, [2, 8, 0, 0, 3])) == VerifyResult(path=[0, 1, 4], bonus=3)


def test_greedy_duplicate_siblings_take_the_first():
    tree = DraftTree(tokens=T([0, 3, 3, 1]), parents=T([-1, 0, 0, 2]))
    # both node 1 and node 2 hold token 3; the walk takes node 1 (a leaf), so node 3 is unreachable
    assert verify_greedy(tree, onehot_logits(4, 5, [3, 2, 1, 4])) == VerifyResult(path=[0, 1], bonus=2)


def test_greedy_root_only():
    tree = DraftTree(tokens=T([4]), parents=T([-1]))
    assert verify(tree, onehot_logits(1, 7, [5]), Sampling(temperature=0.0)) == VerifyResult(path=[0], bonus=5)


def test_greedy_margins_in_ulps_of_the_target_dtype():
    # root (tok 5) -> node 1 (tok 2); the target picks 2 at the root and 4 at node 1
    tree = DraftTree(tokens=T([5, 2]), parents=T([-1, 0]))
    logits = torch.full((2, 9), -3.0)
    logits[0, 2], logits[0, 7] = 8.0, 7.875  # bf16 ulp at 8 is 2**(3 - 7) = 1/16: a 2-ulp gap, runner-up 7
    logits[1, 4], logits[1, 1] = 3.0, 2.0  # ulp at 3 is 2**(1 - 7) = 1/64: a 64-ulp gap, runner-up 1
    res = verify_greedy(tree, logits, torch.bfloat16)
    assert res == VerifyResult(path=[0, 1], bonus=4)  # the walk itself is unchanged
    assert res.margin_ulps == pytest.approx([2.0, 64.0]) and res.runner_up == [7, 1]
    # fp16 has 10 mantissa bits: the same gaps are 8x as many ulps
    assert verify_greedy(tree, logits, torch.float16).margin_ulps == pytest.approx([16.0, 512.0])
    plain = verify(tree, logits, Sampling())
    assert plain == res and plain.margin_ulps is None and plain.runner_up is None
    # an exact tie: zero ulps, and the runner-up is the tied token the argmax did not take
    tied = logits.clone()
    tied[0, 7] = 8.0
    margins, runners = top2_margins(tied, tied.argmax(dim=-1), torch.bfloat16)
    assert float(margins[0]) == 0.0 and int(runners[0]) == 7 and int(tied[0].argmax()) == 2


def test_greedy_with_margins_walks_like_the_plain_verifier():
    g = torch.Generator().manual_seed(3)
    for n in (1, 5, 17):
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
        tree = DraftTree(tokens=torch.randint(0, 6, (n,), generator=g), parents=parents)
        logits = torch.randn(n, 6, generator=g)
        a, b = verify_greedy(tree, logits), verify_greedy(tree, logits, torch.bfloat16)
        assert (a.path, a.bonus, a.tokens) == (b.path, b.bonus, b.tokens)
        assert len(b.margin_ulps) == len(b.runner_up) == len(b.path)
        choice = logits.argmax(-1)
        assert all(r != int(choice[i]) for r, i in zip(b.runner_up, b.path))


# --------------------------------------------------------------------------- target_probs


def slow_target_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """One row at a time, with Python lists: temperature, then top-k, then top-p (token crossing p kept)."""
    out = []
    for row in logits.double().tolist():
        scaled = [x / temperature for x in row]
        allowed = set(range(len(row)))
        if top_k:
            allowed = set(sorted(allowed, key=lambda t: -scaled[t])[:top_k])
        m = max(scaled[t] for t in allowed)
        weights = {t: pow(2.718281828459045, scaled[t] - m) for t in allowed}
        z = sum(weights.values())
        probs = {t: w / z for t, w in weights.items()}
        if top_p < 1.0:
            kept, mass = set(), 0.0
            for t in sorted(probs, key=lambda t: -probs[t]):
                if mass >= top_p:
                    break
                kept.add(t)
                mass += probs[t]
            z = sum(probs[t] for t in kept)
            probs = {t: probs[t] / z for t in kept}
        out.append([probs.get(t, 0.0) for t in range(len(row))])
    return torch.tensor(out, dtype=torch.float32)


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 1, 1.0), (1.0, 50, 1.0), (0.8, 0, 0.9), (1.0, 0, 0.3),
     (1.5, 8, 0.7), (1.0, 0, 1e-6)],
)
def test_target_probs_matches_slow_reference(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(top_k * 7 + int(top_p * 100))
    logits = torch.randn(16, 40, generator=g) * 3
    fast = target_probs(logits, Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    slow = slow_target_probs(logits, temperature, top_k, top_p)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)
    assert torch.equal(fast > 0, slow > 0)  # the same support, exactly
    torch.testing.assert_close(fast.sum(-1), torch.ones(16))


def test_target_probs_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 50, generator=g) * 2
    for temperature, top_k, top_p in [(0.9, 10, 0.8), (1.2, 0, 0.5), (0.6, 4, 1.0)]:
        scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(None, scores)
        ref = torch.softmax(scores, dim=-1)
        ours = target_probs(logits, Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------- sampling verification
#
# The target is a Markov chain over V = 6 tokens: the logits at a node depend only on the node's
# token, LOGITS[token]. So the exact distribution of the first two committed tokens after a root r
# is p(a | r) p(b | a), whatever the drafter did. A "step" is what decode.generate does: propose a
# tree at the current root, verify, commit path + bonus, repeat until two tokens are committed.

V = 6
ROOT = 2
LOGITS = torch.tensor(
    [
        [2.0, 1.0, 0.5, 0.0, -0.5, -1.0],
        [0.0, 2.5, -1.0, 1.0, 0.3, -0.2],
        [1.2, 1.1, 1.0, 0.2, -0.3, 0.4],  # the root's row: no clear favourite
        [-1.0, 0.0, 1.0, 2.0, 0.5, 0.1],
        [0.6, -0.6, 0.3, -0.3, 1.8, 0.0],
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
    ]
)


def exact_pair_probs(sampling: Sampling) -> dict[tuple[int, int], float]:
    p = target_probs(LOGITS, sampling).double()
    return {(a, b): float(p[ROOT, a] * p[a, b]) for a in range(V) for b in range(V)}


def simulate(verify_fn, propose, sampling: Sampling, n: int) -> Counter:
    """Counts of the first two committed tokens over n independent generations from ROOT."""
    counts: Counter = Counter()
    for _ in range(n):
        root, out = ROOT, []
        while len(out) < 2:
            tree = propose(root, sampling.generator)
            res = verify_fn(tree, LOGITS[tree.tokens], sampling)
            out += tree.tokens[res.path[1:]].tolist() + [res.bonus]
            root = out[-1]
        counts[(out[0], out[1])] += 1
    return counts


def chi2_pvalue(counts: Counter, probs: dict, n: int) -> float:
    """Chi-square goodness of fit; cells of probability 0 must be empty (else p = 0); cells with
    expected count under 5 are pooled."""
    if any(counts[c] > 0 for c, p in probs.items() if p == 0.0) or set(counts) - set(probs):
        return 0.0
    cells = sorted((c for c, p in probs.items() if p > 0), key=lambda c: probs[c])
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for c in cells:
        if n * probs[c] < 5:
            pool_o += counts[c]
            pool_e += n * probs[c]
        else:
            obs.append(counts[c])
            exp.append(n * probs[c])
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp = [e * n / sum(exp) for e in exp]  # exact normalisation for scipy
    return float(stats.chisquare(obs, exp).pvalue)


def first_token(counts: Counter) -> Counter:
    out: Counter = Counter()
    for (a, _b), k in counts.items():
        out[a] += k
    return out


def first_token_probs(pair_probs: dict) -> dict:
    out: dict = {}
    for (a, _b), p in pair_probs.items():
        out[a] = out.get(a, 0.0) + p
    return out


def assert_matches_target(counts: Counter, sampling: Sampling, n: int) -> None:
    pair = exact_pair_probs(sampling)
    p1 = chi2_pvalue(first_token(counts), first_token_probs(pair), n)
    p2 = chi2_pvalue(counts, pair, n)
    assert p1 > P_MIN and p2 > P_MIN, (p1, p2, sorted(counts.items()))


# ---- drafters for the simulation


def deterministic_adversarial(root: int, sampling: Sampling) -> DraftTree:
    """Point-mass drafts that fight the target: least likely tokens first, duplicates, and tokens
    the target can never emit (cut by top-k / top-p), with the most likely token last."""
    p = target_probs(LOGITS, sampling)

    def picks(tok):
        row = p[tok]
        order = torch.argsort(row).tolist()  # ascending
        zero = [t for t in order if row[t] == 0]
        nonzero = [t for t in order if row[t] > 0]
        return zero or nonzero, nonzero  # (a token it cannot emit if there is one, emittable ones)

    tokens, parents = [root], [-1]

    def add(tok, parent):
        tokens.append(int(tok))
        parents.append(parent)
        return len(tokens) - 1

    zero, nz = picks(root)
    least = add(nz[0], 0)  # the least likely token first
    add(zero[0], 0)  # a token of probability 0
    dup = add(nz[0], 0)  # a duplicate of the first child
    add(nz[min(1, len(nz) - 1)], 0)
    most = add(nz[-1], 0)  # the favourite last
    z1, n1 = picks(nz[0])
    add(z1[0], least)
    add(n1[0], least)
    add(n1[-1], least)
    add(n1[-1], dup)
    z3, n3 = picks(nz[-1])
    add(n3[0], most)
    add(n3[0], most)
    add(z3[-1], most)
    return DraftTree(tokens=T(tokens), parents=T(parents))


def adversarial_q(sampling: Sampling) -> torch.Tensor:
    """[V, V] draft distributions far from the target: mass on the tokens the target likes least
    (including those it cannot emit at all), none on its favourite."""
    p = target_probs(LOGITS, sampling)
    q = 1.0 / (p + 0.02) ** 2
    q[torch.arange(V), p.argmax(-1)] = 0.0
    return q / q.sum(-1, keepdim=True)


def sampled_tree(root: int, gen, q: torch.Tensor, widths=(3, 2)) -> DraftTree:
    """Children drawn i.i.d. from q[parent token] (duplicates happen), widths[d] per node at depth d."""
    tokens, parents, frontier = [root], [-1], [0]
    for width in widths:
        rows = q[torch.tensor([tokens[node] for node in frontier])]
        draws = torch.multinomial(rows, width, replacement=True, generator=gen).tolist()
        nxt = []
        for node, kids in zip(frontier, draws):
            for tok in kids:
                nxt.append(len(tokens))
                tokens.append(tok)
                parents.append(node)
        frontier = nxt
    tokens_t = T(tokens)
    return DraftTree(tokens=tokens_t, parents=T(parents), draft_probs=q[tokens_t])


# One verify call costs ~0.3-1 ms here (per-node torch calls on tiny tensors), so 5000 two-token
# generations per scenario keep each test to a few seconds. The negative controls below show that
# even fewer draws expose a wrong rule.
N_DRAWS = 5000

SCENARIOS = {
    # (sampling kwargs, drafter, widths of the sampled tree) -- the generator is attached per test
    "deterministic, top-k": (dict(temperature=1.0, top_k=4), "det", None),
    "deterministic, T=0.6, top-p": (dict(temperature=0.6, top_p=0.85), "det", None),
    "sampled adversarial q": (dict(temperature=1.0), "q", (3, 2)),
    "sampled adversarial q, top-k + top-p": (dict(temperature=0.8, top_k=5, top_p=0.9), "q", (2, 2)),
}


def make_proposer(kind: str, sampling: Sampling, widths=(3, 2)):
    if kind == "det":
        trees = {root: deterministic_adversarial(root, sampling) for root in range(V)}
        return lambda root, gen: trees[root]
    q = adversarial_q(sampling) if kind == "q" else target_probs(LOGITS, sampling)
    return lambda root, gen: sampled_tree(root, gen, q, widths)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sampling_verifier_reproduces_target(scenario):
    kwargs, kind, widths = SCENARIOS[scenario]
    g = torch.Generator().manual_seed(1234)
    sampling = Sampling(generator=g, **kwargs)
    counts = simulate(verify, make_proposer(kind, sampling, widths), sampling, N_DRAWS)
    assert_matches_target(counts, sampling, N_DRAWS)


def test_sampling_verifier_accepts_drafts():
    """Not vacuous: the adversarial trees still get drafts accepted, often to depth 2; with q == p
    every first child is accepted."""
    g = torch.Generator().manual_seed(5)
    for kind, kwargs in [("det", dict(temperature=1.0, top_k=4)), ("q", dict(temperature=1.0)), ("p", dict(temperature=1.2))]:
        sampling = Sampling(generator=g, **kwargs)
        propose = make_proposer(kind, sampling)
        lengths = Counter(len(verify(t, LOGITS[t.tokens], sampling).path) - 1 for t in (propose(ROOT, g) for _ in range(500)))
        if kind == "p":  # q == p: every first child is accepted, always to full depth
            assert lengths == Counter({2: 500})
        else:
            assert lengths[0] > 0 and lengths[1] > 0 and lengths[2] > 0, (kind, lengths)


# ---- negative controls: the same statistics catch deliberately wrong rules


def accept_everything(tree: DraftTree, logits: torch.Tensor, sampling: Sampling) -> VerifyResult:
    """WRONG: walk down the first child to a leaf, then sample the bonus from the target."""
    kids = children_lists(tree.parents)
    path = [0]
    while kids[path[-1]]:
        path.append(kids[path[-1]][0])
    probs = target_probs(logits[path[-1]], sampling)
    return VerifyResult(path=path, bonus=int(torch.multinomial(probs, 1, generator=sampling.generator)))


def recover_from_target(tree: DraftTree, logits: torch.Tensor, sampling: Sampling) -> VerifyResult:
    """WRONG: the right acceptance test, but after rejections the bonus comes from the target
    itself instead of the residual (a classic bug)."""
    res = verify_sampling(tree, logits, sampling)
    kids = children_lists(tree.parents)
    last = res.path[-1]
    if kids[last]:  # the walk stopped on a rejection: redraw the recovered token from the target
        probs = target_probs(logits[last], sampling)
        return VerifyResult(path=res.path, bonus=int(torch.multinomial(probs, 1, generator=sampling.generator)))
    return res


@pytest.mark.parametrize(
    "wrong, kwargs, kind",
    [
        (accept_everything, dict(temperature=1.0, top_k=4), "det"),
        (accept_everything, dict(temperature=1.0), "q"),
        (recover_from_target, dict(temperature=1.0), "q"),
        (recover_from_target, dict(temperature=1.0, top_k=4), "det"),
    ],
    ids=["accept-all/det", "accept-all/q", "no-residual/q", "no-residual/det"],
)
def test_negative_controls_are_detected(wrong, kwargs, kind):
    n = 1500  # a quarter of the real test's draws, and still detected
    g = torch.Generator().manual_seed(99)
    sampling = Sampling(generator=g, **kwargs)
    counts = simulate(wrong, make_proposer(kind, sampling), sampling, n)
    pair = exact_pair_probs(sampling)
    p1 = chi2_pvalue(first_token(counts), first_token_probs(pair), n)
    p2 = chi2_pvalue(counts, pair, n)
    assert p2 < P_MIN, (p1, p2)


# --------------------------------------------------------------------------- end to end (sampled generation)
#
# decode.generate with a drafter at temperature > 0 must sample the first two tokens from exactly
# the target's distribution. Sampling with top-k = 4 keeps the outcome space small (<= 16 pairs),
# so a few hundred generations give a test with real power. The prompts are picked (by a seeded
# search) so that drafts do get accepted: for ngram the token after the earlier occurrence of the
# last prompt token is one the target likes; for the draft model the two models' distributions
# overlap a lot.

E2E_SAMPLING = dict(temperature=1.0, top_k=4)


@pytest.fixture(scope="module")
def llama():
    from specbench.targets import load_target

    return load_target("tiny-llama", device="cpu", dtype="float32")


@torch.inference_mode()
def last_probs(target, ids: torch.Tensor, sampling: dict = E2E_SAMPLING) -> torch.Tensor:
    """[B, V] sampling distribution after each row of ids [B, L] (plain forward, no cache)."""
    return target_probs(target.model(input_ids=ids, use_cache=False).logits[:, -1], Sampling(**sampling))


@pytest.fixture(scope="module")
def e2e_prompts(llama):
    from specbench.targets import load_target

    qwen = load_target("tiny-qwen3", device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(0)
    cand = torch.randint(0, 256, (256, 12), generator=g)
    # draft model: the prompt where tiny-qwen3's next-token distribution overlaps tiny-llama's most
    overlap = torch.minimum(last_probs(llama, cand), last_probs(qwen, cand)).sum(-1)
    draft_prompt = cand[int(overlap.argmax())]
    # ngram: the last token z also sits at index 3 (and nowhere else), so prompt lookup proposes
    # cand[4:]; pick the prompt where the target gives cand[4] the most probability
    cand = cand.clone()
    cand[:, -1] = cand[:, 3]
    unique = torch.tensor([int((row[:-1] == row[3]).sum()) == 1 for row in cand])
    p_first_draft = last_probs(llama, cand)[torch.arange(cand.shape[0]), cand[:, 4]] * unique
    ngram_prompt = cand[int(p_first_draft.argmax())]
    assert float(overlap.max()) > 0.3 and float(p_first_draft.max()) > 0.1
    return {"draft": draft_prompt, "ngram": ngram_prompt}


def exact_two_token_probs(target, prompt: torch.Tensor, sampling: dict = E2E_SAMPLING) -> dict:
    """P(first two generated tokens) from the model's own logits; (a, None) if a is a stop token."""
    p1 = last_probs(target, prompt[None], sampling)[0]
    support = torch.nonzero(p1).flatten()
    p2 = last_probs(target, torch.cat([prompt.expand(len(support), -1), support[:, None]], dim=1), sampling)
    probs = {}
    for a, row in zip(support.tolist(), p2):
        if a in target.stop_token_ids:
            probs[(a, None)] = float(p1[a])
            continue
        for b in torch.nonzero(row).flatten().tolist():
            probs[(a, b)] = float(p1[a] * row[b])
    return probs


def make_drafter(kind: str, target):
    from drafters.ar import ARDrafter
    from drafters.draft_model import DraftModelConfig, DraftModelDrafter
    from drafters.ngram import NGramDrafter

    if kind == "ar":
        return ARDrafter(target)
    if kind == "ngram":
        return NGramDrafter(target)
    model = {"draft-model/llama": "tiny-llama", "draft-model/qwen3": "tiny-qwen3"}[kind]
    return DraftModelDrafter(target, DraftModelConfig(model=model, num_draft=2))


@pytest.mark.parametrize(
    "kind, prompt_name, n",
    # ngram and a same-weights draft model are in the conformance suite; the other-family draft LM
    # here exercises the residual (rejection) branch with real draft probabilities end to end
    [("ar", "draft", 150), ("draft-model/qwen3", "draft", 300)],
)
def test_sampled_generation_matches_target(llama, e2e_prompts, kind, prompt_name, n):
    from specbench.decode import generate

    prompt = e2e_prompts[prompt_name]
    drafter = make_drafter(kind, llama)
    sampling = Sampling(generator=torch.Generator().manual_seed(7), **E2E_SAMPLING)
    counts: Counter = Counter()
    accepted = 0
    for _ in range(n):
        gen = generate(llama, drafter, prompt, max_new_tokens=2, sampling=sampling)
        ids = gen.output_ids
        counts[(ids[0], ids[1] if len(ids) > 1 else None)] += 1
        accepted += sum(step.accepted for step in gen.steps)
    probs = exact_two_token_probs(llama, prompt)
    assert chi2_pvalue(counts, probs, n) > P_MIN, sorted(counts.items())
    first = first_token(counts)
    assert chi2_pvalue(first, first_token_probs(probs), n) > P_MIN
    if kind != "ar":
        assert accepted > n // 10, accepted  # drafts were accepted: the accept branch was exercised
