"""Block drafters (DFlash, JetSpec, TreeFlash): backbone, masks, trees, tables, checkpoints, losslessness.

* greedy losslessness and the sampled distribution for all three live in the conformance suite
  (tests/test_conformance.py, random-init and briefly fitted); here: loaded checkpoints stay lossless;
* the training forward (many anchors at once) equals the inference forward (context cache grown
  in pieces), and the causal mask holds in EVERY layer (perturbation), bidirectional otherwise;
* each tree builder against a brute-force reference (same node set for the same scores/budget);
* TreeFlash's batched transition tables against a slow loop;
* checkpoint round trips in the three layouts and loads of hand-written upstream-layout files.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from drafters.ar import ARDrafter
from drafters.block.checkpoint import load_block, save_block
from drafters.block.drafter import (
    DFlashConfig, DFlashDrafter, JetSpecConfig, JetSpecDrafter, TreeFlashConfig, TreeFlashDrafter, TreeFlashStage2, transition_tables,
)
from drafters.block.model import BlockModel, ContextCache, build_target_layer_ids, random_block_model
from drafters.block.train import select_anchors
from drafters.block.tree import accum_logp_tree, chain_tree, gap_caps, kbest_rows, kbest_tree, marginal_tables
from specbench.decode import generate
from specbench.drafter import Sampling, available_drafters, parse_config
from specbench.errors import UserError
from specbench.targets import load_target
from specbench.train.trainer import Batch
from specbench.tree import depths, path_to

TARGETS = ["tiny-llama", "tiny-qwen3"]
MAX_NEW = 32
FAMILIES = {"dflash": DFlashDrafter, "jetspec": JetSpecDrafter, "treeflash": TreeFlashDrafter}

class Setup:
    def __init__(self, name: str):
        self.target = load_target(name, device="cpu", dtype="float32")
        tok = self.target.tokenizer
        texts = ["the cat sat on the mat. the cat", "abc abc abc abc abc abc", "def add(a, b):\n    return",
                 "Once upon a time", "1, 2, 3, 4, 5,"]
        self.prompts = [torch.tensor(tok.encode(t)) for t in texts]
        self.reference = [generate(self.target, ARDrafter(self.target), p, MAX_NEW, Sampling()).output_ids
                          for p in self.prompts]


@pytest.fixture(scope="module")
def setups():
    return {name: Setup(name) for name in TARGETS}


def make(family: str, target, options: list[str]):
    cls = FAMILIES[family]
    return cls(target, parse_config(cls.Config, options))


def assert_lossless(setup: Setup, drafter) -> int:
    """Every prompt's output equals AR's; returns the drafts accepted over all prompts."""
    accepted = 0
    for prompt, ref in zip(setup.prompts, setup.reference):
        gen = generate(setup.target, drafter, prompt, MAX_NEW, Sampling())
        assert gen.output_ids == ref
        accepted += sum(s.accepted for s in gen.steps)
    return accepted


def test_context_cache_holds_committed_rows_only(setups):
    """After a generation the drafter's context rows equal one teacher-forced pass over the final
    sequence: rejected drafts never enter the cache and every committed position is there once."""
    setup = setups["tiny-qwen3"]
    drafter = make("jetspec", setup.target, ["path=random", "block_size=8", "budget=20", "width=4"])
    prompt = setup.prompts[0]
    gen = generate(setup.target, drafter, prompt, MAX_NEW, Sampling())
    seq = torch.cat([prompt, torch.tensor(gen.output_ids)])
    n = drafter.n_context
    # every committed token handed over (all but the last step's, which the output may cut) but the
    # root and token 0 (no row); the last step commits at most block_size tokens
    assert seq.numel() - 2 - 8 <= n <= seq.numel() - 2
    with torch.no_grad():
        out = setup.target.model(input_ids=seq[None], use_cache=False, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i][0] for i in drafter.feature_layers], dim=-1)[:n]
        ref = ContextCache(drafter.model.config.num_hidden_layers)
        block = drafter.model.block_embeds(drafter.embed[0], drafter.embed)
        drafter.model.forward_block(block, torch.arange(n, n + block.shape[0]), drafter.model.context(feats),
                                    torch.arange(n), ref)
    for layer in range(drafter.model.config.num_hidden_layers):
        for ours, theirs in zip(drafter.cache[layer].view(), ref[layer].view()):
            torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- backbone and masks


@pytest.mark.parametrize("causal", [False, True])
def test_training_forward_equals_inference(setups, causal):
    target = setups["tiny-qwen3"].target
    model = random_block_model(target, seed=1, causal=causal, block_size=8)
    g = torch.Generator().manual_seed(0)
    t = 20
    feats = torch.randn(2, t, len(model.config.target_layer_ids) * target.hidden_size, generator=g)
    tokens = torch.randint(0, target.vocab_size, (2, t), generator=g)
    embed = target.model.get_input_embeddings().weight
    anchors = torch.tensor([[0, 3, 12], [5, 7, 19]])
    with torch.no_grad():
        ctx = model.context(feats)
        block = model.block_embeds(embed[tokens.gather(1, anchors)], embed)
        batched = model.forward_anchors(block, anchors, ctx)
        for s, j in itertools.product(range(2), range(3)):
            a = int(anchors[s, j])
            cache = ContextCache(model.config.num_hidden_layers)
            half = a // 2  # the context arrives in two pieces, as over two decoding rounds
            model.forward_block(block[s, j], torch.arange(a, a + 8), ctx[s, :half], torch.arange(half), cache)
            one = model.forward_block(block[s, j], torch.arange(a, a + 8), ctx[s, half:a], torch.arange(half, a), cache)
            torch.testing.assert_close(one, batched[s, j], atol=1e-4, rtol=1e-4)


def layer_outputs(model: BlockModel, block: torch.Tensor, ctx: torch.Tensor) -> list[torch.Tensor]:
    outs: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda mod, inp, out: outs.append(out.detach())) for layer in model.layers]
    try:
        cache = ContextCache(model.config.num_hidden_layers)
        n = ctx.shape[0]
        model.forward_block(block, torch.arange(n, n + block.shape[0]), ctx, torch.arange(n), cache)
    finally:
        for h in hooks:
            h.remove()
    return outs


@pytest.mark.parametrize("name", TARGETS)
def test_causal_mask_in_every_layer(setups, name):
    """JetSpec: changing block input j leaves every layer's outputs at positions < j unchanged (and
    changes position j); DFlash: it changes earlier positions too (the test can tell them apart)."""
    target = setups[name].target
    g = torch.Generator().manual_seed(0)
    for causal in (True, False):
        model = random_block_model(target, seed=2, causal=causal, block_size=8, num_hidden_layers=3)
        ctx = torch.randn(6, target.hidden_size, generator=g)
        block = torch.randn(8, target.hidden_size, generator=g)
        base = layer_outputs(model, block, ctx)
        for j in (1, 4, 7):
            changed = block.clone()
            changed[j] += 1.0
            outs = layer_outputs(model, changed, ctx)
            for layer, (a, b) in enumerate(zip(base, outs)):
                earlier_same = torch.allclose(a[:j], b[:j], atol=1e-6)
                assert earlier_same == causal, (causal, layer, j)
                assert not torch.allclose(a[j], b[j], atol=1e-6)


def test_mask_token_or_learned_embedding(setups):
    target = setups["tiny-llama"].target
    embed = target.model.get_input_embeddings().weight
    learned = random_block_model(target, seed=0)
    assert learned.mask_embedding is not None
    reserved = random_block_model(target, seed=0, mask_token_id=5)
    assert reserved.mask_embedding is None
    block = reserved.block_embeds(embed[7], embed)
    assert torch.equal(block[0], embed[7]) and torch.equal(block[1:], embed[5].expand(block.shape[0] - 1, -1))
    block = learned.block_embeds(embed[7], embed)
    assert torch.equal(block[1:], learned.mask_embedding.detach().expand(block.shape[0] - 1, -1))


def test_target_layer_ids_follow_upstream():
    assert build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B DFlash
    assert build_target_layer_ids(30, 2) == (1, 27)
    assert build_target_layer_ids(30, 1) == (15,)


def test_anchor_draw():
    tokens = torch.arange(24).view(2, 12)
    loss = torch.zeros(2, 12, dtype=torch.bool)
    loss[0, 4:10] = True
    loss[1, 2:12] = True
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 11] = False
    batch = Batch(tokens, loss, valid, torch.zeros(2, 12, 1, 1), torch.zeros(2, 12, dtype=torch.long))
    for cap in (0, 1000):  # every valid anchor
        anchors, ok = select_anchors(batch, cap, seed=0)
        got = {(s, int(anchors[s, a])) for s, a in ok.nonzero().tolist()}
        assert got == {(0, p) for p in range(4, 9)} | {(1, p) for p in range(2, 10)}
    anchors, ok = select_anchors(batch, 3, seed=1)
    assert ok.sum(1).tolist() == [3, 3]
    assert all(bool(loss[s, anchors[s, a]] & loss[s, anchors[s, a] + 1]) for s, a in ok.nonzero().tolist())


# --------------------------------------------------------------------------- tree builders


def node_paths(tree) -> set[tuple[int, ...]]:
    toks = tree.tokens.tolist()
    return {tuple(toks[n] for n in path_to(tree.parents, i)[1:]) for i in range(1, tree.size)}


def brute_force_tables(tokens, logp, nxt, budget: int) -> set[tuple[int, ...]]:
    """Every path reachable through the tables, with its score; keep the ``budget - 1`` best."""
    d_max, _, k = tokens.shape
    scored = []

    def walk(d: int, row: int, path: tuple, score: float):
        for j in range(k):
            s = score + float(logp[d, row, j])
            p = path + (int(tokens[d, row, j]),)
            scored.append((s, p))
            if d + 1 < d_max and int(nxt[d, row, j]) >= 0:
                walk(d + 1, int(nxt[d, row, j]), p, s)

    walk(0, 0, (), 0.0)
    scored.sort(key=lambda x: -x[0])
    return {p for _, p in scored[: budget - 1]}


def random_tables(rng: random.Random, d_max: int, m: int, k: int, vocab: int):
    tokens = torch.zeros(d_max, m, k, dtype=torch.long)
    logp = torch.zeros(d_max, m, k)
    nxt = torch.full((d_max, m, k), -1, dtype=torch.long)
    for d, i in itertools.product(range(d_max), range(m)):
        tokens[d, i] = torch.tensor(rng.sample(range(vocab), k))
        logp[d, i] = torch.tensor(sorted((-rng.expovariate(1.0) for _ in range(k)), reverse=True))
        if d + 1 < d_max:
            nxt[d, i] = torch.tensor([rng.randrange(-1, m) for _ in range(k)])
    return tokens, logp, nxt


@pytest.mark.parametrize("trial", range(10))
def test_kbest_tree_matches_brute_force(trial):
    rng = random.Random(trial)
    d_max, m, k = rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, 4)
    tables = random_tables(rng, d_max, m, k, vocab=50)
    budget = rng.randint(1, 40)
    tree = kbest_tree(99, *tables, budget)
    assert tree.size <= budget and int(tree.tokens[0]) == 99
    assert node_paths(tree) == brute_force_tables(*tables, budget)


@pytest.mark.parametrize("trial", range(10))
def test_kbest_rows_reads_only_the_rows_it_needs(trial):
    """The row-at-a-time search builds kbest_tree's tree and asks for at most ``budget`` rows, each once
    per need (what TreeFlash's lazy stage 2 relies on to skip the rest)."""
    rng = random.Random(300 + trial)
    d_max, m, k = rng.randint(2, 6), rng.randint(2, 5), rng.randint(1, 4)
    tokens, logp, nxt = random_tables(rng, d_max, m, k, vocab=60)
    budget = rng.randint(1, 30)
    asked = set()

    def row(d, i):
        asked.add((d, i))
        return tokens[d, i].tolist(), logp[d, i].tolist(), nxt[d, i].tolist()

    lazy = kbest_rows(7, row, d_max, budget)
    eager = kbest_tree(7, tokens, logp, nxt, budget)
    assert lazy.tokens.tolist() == eager.tokens.tolist() and lazy.parents.tolist() == eager.parents.tolist()
    assert len(asked) <= max(budget - 1, 1) and (budget == 1 or (0, 0) in asked)


@pytest.mark.parametrize("trial", range(6))
def test_marginal_tree_is_best_paths_of_marginals(trial):
    """DDTree: the budget-1 best paths when every parent at depth d shares depth d's marginals."""
    rng = random.Random(100 + trial)
    d_max, k, budget = rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 50)
    logp = torch.log_softmax(torch.randn(d_max, 30, generator=torch.Generator().manual_seed(trial)), -1)
    top = logp.topk(k, dim=-1)
    tree = kbest_tree(0, *marginal_tables(top.indices, top.values), budget)
    every = []
    for depth in range(1, d_max + 1):
        for combo in itertools.product(range(k), repeat=depth):
            every.append((sum(float(top.values[d, j]) for d, j in enumerate(combo)),
                          tuple(int(top.indices[d, j]) for d, j in enumerate(combo))))
    every.sort(key=lambda x: -x[0])
    assert node_paths(tree) == {p for _, p in every[: budget - 1]}


def slow_accum_logp(top_tokens, top_logp, budget: int, caps=None) -> set[tuple[int, ...]]:
    """JetSpec's rule written without a heap: repeatedly expand the best unexpanded node (older
    first on ties) with all its children, cut to the budget."""
    d_max, w = top_tokens.shape
    nodes = [((), 0.0, 0)]  # (path, score, depth)
    expanded = set()
    while len(nodes) < budget:
        open_ = [i for i, n in enumerate(nodes) if i not in expanded and n[2] < d_max]
        if not open_:
            break
        best = max(open_, key=lambda i: (nodes[i][1], -i))
        expanded.add(best)
        path, score, d = nodes[best]
        fan = min(w, caps[d] if caps else w, budget - len(nodes))
        for j in range(fan):
            nodes.append((path + (int(top_tokens[d, j]),), score + float(top_logp[d, j]), d + 1))
    return {n[0] for n in nodes[1:]}


@pytest.mark.parametrize("trial", range(10))
def test_accum_logp_tree_matches_slow_rule(trial):
    rng = random.Random(200 + trial)
    d_max, w, budget = rng.randint(1, 6), rng.randint(1, 7), rng.randint(1, 70)
    logp = torch.log_softmax(torch.randn(d_max, 40, generator=torch.Generator().manual_seed(trial)) * 2, -1)
    top = logp.topk(w, dim=-1)
    caps = gap_caps(top.values, 1.0, w) if trial % 2 else None
    tree = accum_logp_tree(0, top.indices, top.values, budget, caps)
    assert tree.size == min(budget, tree.size) and tree.size <= budget
    assert node_paths(tree) == slow_accum_logp(top.indices, top.values, budget, caps)
    if budget > 1 and caps is None:
        # shared children: every node at depth d has the same first child token
        kids = depths(tree.parents)
        assert set(tree.tokens[kids == 1].tolist()) <= set(top.indices[0].tolist())


def expected_accepted(tree, top_tokens, top_logp) -> float:
    """Expected accepted drafts of ``tree`` when depth d's true token is drawn from the per-depth
    distribution ``top_logp[d]`` independently of the other depths (the model both trees are built
    from): the sum over non-root nodes of the probability that every token on the node's path is right."""
    lp = {(d, int(t)): float(v) for d in range(top_tokens.shape[0]) for t, v in zip(top_tokens[d], top_logp[d])}
    return sum(math.exp(sum(lp[(d, t)] for d, t in enumerate(path))) for path in node_paths(tree))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), d_max=st.integers(1, 7), w=st.integers(1, 7), budget=st.integers(1, 64),
       sharpness=st.floats(0.2, 4.0))
def test_marginal_tree_never_expects_fewer_accepted_than_accum_logp(seed, d_max, w, budget, sharpness):
    """On the same per-depth top-W tables (one head), the marginal best-first tree holds the budget - 1 best
    paths, so its expected accepted length under those probabilities is at least JetSpec's cumulative-log-prob
    tree's, for every table and budget: accum_logp adds ALL children of a popped node, spending nodes on
    low-scoring siblings. The claims tables' "causal tree > marginal tree on the same head" can therefore only
    come from the head's per-depth probabilities misjudging acceptance, never from the tree rule itself."""
    logp = torch.log_softmax(torch.randn(d_max, 40, generator=torch.Generator().manual_seed(seed)) * sharpness, -1)
    top = logp.topk(w, dim=-1)
    marginal = kbest_tree(0, *marginal_tables(top.indices, top.values), budget)
    accum = accum_logp_tree(0, top.indices, top.values, budget)
    assert marginal.size == accum.size  # both spend the whole budget (or run out of paths together)
    assert expected_accepted(marginal, top.indices, top.values) >= expected_accepted(accum, top.indices, top.values) - 1e-9


def test_accum_logp_spends_budget_on_siblings_the_marginal_tree_skips():
    """A concrete gap: depth 1 is confident (0.9 on its top token), so the marginal tree goes deep along it
    while accum_logp's first pop adds all W depth-1 siblings at once."""
    probs = torch.tensor([[0.9, 0.05, 0.03, 0.02], [0.8, 0.1, 0.06, 0.04], [0.8, 0.1, 0.06, 0.04]])
    top = torch.log(probs).topk(4, dim=-1)
    marginal = kbest_tree(0, *marginal_tables(top.indices, top.values), 4)
    accum = accum_logp_tree(0, top.indices, top.values, 4)
    assert node_paths(marginal) == {(0,), (0, 0), (0, 0, 0)}  # the chain of top tokens: 0.9 + 0.72 + 0.576
    assert node_paths(accum) == {(0,), (1,), (2,)}  # all of depth 1's best three: 0.9 + 0.05 + 0.03
    assert expected_accepted(marginal, top.indices, top.values) == pytest.approx(0.9 + 0.72 + 0.576)
    assert expected_accepted(accum, top.indices, top.values) == pytest.approx(0.98)


def test_gap_caps():
    vals = torch.tensor([[-0.01, -5.0, -6.0], [-1.0, -1.2, -3.0]])
    assert gap_caps(vals, 2.0, 3) == [1, 3]
    assert gap_caps(vals, 0.0, 3) == [3, 3]


def test_chain_tree():
    tokens = torch.randint(0, 20, (7,), generator=torch.Generator().manual_seed(0))
    tree = chain_tree(5, tokens, budget=16)
    assert tree.tokens.tolist() == [5] + tokens.tolist() and tree.parents.tolist() == list(range(-1, 7))
    assert chain_tree(5, tokens, budget=3).size == 3


# --------------------------------------------------------------------------- transition tables


def test_transition_tables_match_slow_loop(setups):
    target = setups["tiny-llama"].target
    model = random_block_model(target, seed=4, block_size=6, ar_approximation="swiglu")
    with torch.no_grad():
        for p in model.ar_approximation.parameters():  # a non-zero correction (d starts at zero)
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
        embed = target.model.get_input_embeddings().weight
        lm = target.model.get_output_embeddings().weight
        hidden = torch.randn(6, target.hidden_size, generator=torch.Generator().manual_seed(1))
        root = 11
        m, k = 3, 4
        tokens, logp, nxt = transition_tables(model, hidden, embed[root], embed, lm, m, k)
        assert tokens.shape == logp.shape == nxt.shape == (5, m, k)
        cands = [None] + [model.logits(hidden[p], lm).topk(m).indices.tolist() for p in range(1, 5)]
        for d in range(5):  # depth d + 1 = block position d + 1
            for i in range(m):
                prev = root if d == 0 else cands[d][i]
                h = hidden[d + 1]
                lp = torch.log_softmax(model.logits(model.corrected(h, embed[prev]), lm).float(), -1)
                top = lp.topk(k)
                assert tokens[d, i].tolist() == top.indices.tolist()
                torch.testing.assert_close(logp[d, i], top.values, atol=1e-5, rtol=1e-5)
                for j, tok in enumerate(top.indices.tolist()):
                    want = -1 if d == 4 or tok not in cands[d + 1] else cands[d + 1].index(tok)
                    assert int(nxt[d, i, j]) == want


def test_lazy_stage2_builds_the_batched_tree(setups):
    """TreeFlash's lazy stage 2 computes only the rows the search reaches and builds the same tree as
    the batched tables, step for step (same drafts, same acceptance), on a non-zero correction."""
    setup = setups["tiny-llama"]
    opts = ["path=random", "block_size=8", "budget=12", "top_m=4", "top_k=4", "seed=3"]
    batched, lazy = make("treeflash", setup.target, opts), make("treeflash", setup.target, opts + ["stage2=lazy"])
    with torch.no_grad():
        for drafter in (batched, lazy):  # the same non-zero correction in both (d starts at zero)
            for p in drafter.model.ar_approximation.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    for prompt in setup.prompts[:2]:
        a, b = (generate(setup.target, d, prompt, 12, Sampling()).steps for d in (batched, lazy))
        assert [(x.tree_size, x.accepted) for x in a] == [(x.tree_size, x.accepted) for x in b]
    hidden = torch.randn(8, setup.target.hidden_size, generator=torch.Generator().manual_seed(5))
    embed, root = lazy.embed, 9
    for budget in (1, 5, 12, 40):
        stage2 = TreeFlashStage2(lazy.model, hidden, embed[root], embed, lazy.lm_head, 4, 4)
        want = kbest_tree(root, *stage2.tables(), budget)
        got = kbest_rows(root, stage2.row, stage2.n_depths, budget)
        assert node_paths(got) == node_paths(want) and got.parents.tolist() == want.parents.tolist()
        assert len(stage2.computed) <= max(budget - 1, 1)  # at most one row per node that can have children
        if budget == 12:
            assert len(stage2.computed) < stage2.n_depths * stage2.m  # fewer than the batched tables' 28



@pytest.mark.parametrize("budget", [16, 64, 128])
def test_committed_stage2_runs_built_the_same_trees(budget):
    """The block notes' batched-or-lazy table (reports/data/treeflash-stage2) rests on the two building the
    same trees on the real head: every prompt's output, tree sizes, depths and accepted lengths match."""
    from specbench import results

    d = Path(__file__).parent.parent / "reports" / "data" / "treeflash-stage2"
    batched, lazy = (results.read_results([d / f"treeflash-{budget}-{s}-humaneval.parquet"]) for s in ("batched", "lazy"))
    assert len(batched) == len(lazy) == 10
    assert set(lazy["drafter_config"].astype(str).map(lambda c: "lazy" in c)) == {True}
    for col in ("prompt_id", "output_ids", "accepted_per_step", "tree_size_per_step", "tree_depth_per_step"):
        assert batched[col].astype(str).tolist() == lazy[col].astype(str).tolist(), col

def test_zero_correction_equals_marginal_tree(setups):
    """An untrained correction (d = 0) changes nothing: with top_m == top_k every table row is its
    depth's marginal top-k and every child is expandable, so the tree is the marginal tree."""
    setup = setups["tiny-qwen3"]
    on = make("treeflash", setup.target, ["path=random", "block_size=6", "budget=30", "top_m=5", "top_k=5"])
    off = make("treeflash", setup.target, ["path=random", "block_size=6", "budget=30", "top_k=5", "ar_approximation=false"])
    for a, b in zip(generate(setup.target, on, setup.prompts[0], 8, Sampling()).steps,
                    generate(setup.target, off, setup.prompts[0], 8, Sampling()).steps):
        assert (a.tree_size, a.accepted) == (b.tree_size, b.accepted)


# --------------------------------------------------------------------------- checkpoints


def dflash_keys(n_layers: int) -> set[str]:
    per = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
           "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
           "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    return {"fc.weight", "hidden_norm.weight", "norm.weight"} | {f"layers.{i}.{k}" for i in range(n_layers) for k in per}


@pytest.mark.parametrize("family,layout", [("dflash", "dflash"), ("jetspec", "jetspec"), ("treeflash", "treeflash")])
def test_round_trip(setups, tmp_path, family, layout):
    setup = setups["tiny-llama"]
    drafter = make(family, setup.target, ["path=random", "block_size=8", "seed=3"])
    save_block(drafter.model, tmp_path, layout)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == list(drafter.model.config.target_layer_ids)
    assert bool(config["dflash_config"].get("causal_head", False)) == (family == "jetspec")
    if layout == "treeflash":
        assert config["treeflash_config"]["ar_approximation"] == "swiglu"
    again = make(family, setup.target, [f"path={tmp_path}", "block_size=8"])
    for a, b in zip(drafter.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)
    prompt = setup.prompts[1]
    assert [s.tree_size for s in generate(setup.target, drafter, prompt, 12, Sampling()).steps] == \
           [s.tree_size for s in generate(setup.target, again, prompt, 12, Sampling()).steps]


def upstream_layout(path, target, n_layers: int, causal: bool = False, treeflash: bool = False, mask_id: int = 3):
    """A checkpoint written by hand in the released layout (not through save_block)."""
    h = target.hidden_size
    tc = target.model.config
    heads, kv = tc.num_attention_heads, tc.num_key_value_heads
    hd = getattr(tc, "head_dim", None) or h // heads
    inter = 48
    g = torch.Generator().manual_seed(0)
    shapes = {"input_layernorm.weight": [h], "post_attention_layernorm.weight": [h], "self_attn.q_proj.weight": [heads * hd, h],
              "self_attn.k_proj.weight": [kv * hd, h], "self_attn.v_proj.weight": [kv * hd, h],
              "self_attn.o_proj.weight": [h, heads * hd], "self_attn.q_norm.weight": [hd], "self_attn.k_norm.weight": [hd],
              "mlp.gate_proj.weight": [inter, h], "mlp.up_proj.weight": [inter, h], "mlp.down_proj.weight": [h, inter]}
    ids = list(build_target_layer_ids(target.num_layers, n_layers))
    tensors = {"fc.weight": [h, len(ids) * h], "hidden_norm.weight": [h], "norm.weight": [h]}
    tensors |= {f"layers.{i}.{k}": s for i in range(n_layers) for k, s in shapes.items()}
    state = {k: torch.randn(s, generator=g) * 0.02 for k, s in tensors.items()}
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": h, "intermediate_size": inter,
              "num_hidden_layers": n_layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
              "vocab_size": target.vocab_size, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "block_size": 8,
              "num_target_layers": target.num_layers, "layer_types": ["full_attention"] * n_layers,
              "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": ids}, "torch_dtype": "bfloat16"}
    if causal:
        config["dflash_config"]["causal_head"] = True
    if treeflash:
        state = {f"model.{k}": v for k, v in state.items()}
        state |= {"ar_approximation.ug.weight": torch.randn(2 * inter, 2 * h, generator=g) * 0.02,
                  "ar_approximation.ug.bias": torch.zeros(2 * inter), "ar_approximation.d.weight": torch.zeros(h, inter),
                  "ar_approximation.norm.weight": torch.ones(h)}
        config["architectures"] = ["TreeFlashDraftModel"]
        config["treeflash_config"] = {"ar_approximation": "swiglu", "candidate_tokens": 64}
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return state


@pytest.mark.parametrize("family,causal,treeflash", [("dflash", False, False), ("jetspec", True, False),
                                                     ("treeflash", False, True), ("treeflash", False, False)])
def test_loads_upstream_layouts(setups, tmp_path, family, causal, treeflash):
    setup = setups["tiny-qwen3"]
    state = upstream_layout(tmp_path, setup.target, n_layers=2, causal=causal, treeflash=treeflash)
    drafter = make(family, setup.target, [f"path={tmp_path}", "budget=12"])
    model = drafter.model
    assert model.config.mask_token_id == 3 and model.mask_embedding is None
    assert model.config.causal == causal and (model.ar_approximation is not None) == treeflash
    assert set(model.state_dict()) == {k.removeprefix("model.") for k in state}
    assert set(k for k in state if not k.startswith("ar_")) == (dflash_keys(2) if not treeflash else {f"model.{k}" for k in dflash_keys(2)})
    torch.testing.assert_close(model.state_dict()["fc.weight"], state["model.fc.weight" if treeflash else "fc.weight"].float().to(torch.bfloat16).float())
    assert_lossless(setup, drafter)


def test_wrong_family_and_target_refused(setups, tmp_path):
    qwen, llama = setups["tiny-qwen3"].target, setups["tiny-llama"].target
    upstream_layout(tmp_path / "causal", qwen, n_layers=2, causal=True)
    upstream_layout(tmp_path / "plain", qwen, n_layers=2)
    with pytest.raises(UserError, match="--drafter jetspec"):
        make("dflash", qwen, [f"path={tmp_path / 'causal'}"])
    with pytest.raises(UserError, match="--drafter dflash"):
        make("jetspec", qwen, [f"path={tmp_path / 'plain'}"])
    if qwen.vocab_size != llama.vocab_size or qwen.hidden_size != llama.hidden_size:
        with pytest.raises(UserError, match="different target"):
            make("dflash", llama, [f"path={tmp_path / 'plain'}"])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        make("dflash", qwen, [f"path={tmp_path / 'broken'}"])
    with pytest.raises(UserError, match="not a directory"):
        make("dflash", qwen, [f"path={tmp_path / 'missing'}"])


def vllm_names(key: str) -> str:
    """The parameter vLLM's DFlash model (``DFlashQwen3ForCausalLM.load_weights``) loads a checkpoint key into."""
    name = "model." + key
    for old, new in ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
                     (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj")):
        name = name.replace(old, new)
    return name


def vllm_params(n_layers: int) -> set[str]:
    """The parameters of vLLM's DFlash draft model (no own embedding / lm_head, no d2t when full-vocabulary)."""
    per = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.qkv_proj.weight",
           "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_up_proj.weight",
           "mlp.down_proj.weight"]
    return ({"model.fc.weight", "model.hidden_norm.weight", "model.norm.weight", "model.mask_embedding"}
            | {f"model.layers.{i}.{k}" for i in range(n_layers) for k in per})


@pytest.mark.parametrize("family,layout", [("dflash", "dflash"), ("jetspec", "jetspec"), ("treeflash", "treeflash")])
def test_learned_mask_embedding_export_is_vllms_layout(setups, tmp_path, family, layout):
    """A model with a learned mask embedding (a target with no spare id) is written as vLLM's DFlash
    loader reads one: mask_embedding.pt (a plain tensor, torch.load(weights_only=True)) beside a non-null
    dflash_config.mask_token_id, and model.safetensors with only the upstream keys. vLLM's embedding of
    [root, mask id x (B-1)] with that file equals our block input, and our loader reads it back exactly."""
    from safetensors import safe_open

    setup = setups["tiny-llama"]
    target = setup.target
    drafter = make(family, target, ["path=random", "block_size=8", "seed=3"])
    model = drafter.model
    assert model.mask_embedding is not None and model.config.mask_token_id is None
    with torch.no_grad():
        model.mask_embedding.copy_(torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(1)))
    save_block(model, tmp_path, layout)

    cfg = json.loads((tmp_path / "config.json").read_text())
    mask_id = cfg["dflash_config"]["mask_token_id"]
    assert isinstance(mask_id, int) and 0 <= mask_id < target.vocab_size and mask_id == target.vocab_size - 1
    assert cfg["specbench"]["learned_mask_embedding"] and "auto_map" not in cfg
    assert cfg["dflash_config"]["target_layer_ids"] == list(model.config.target_layer_ids)
    assert cfg["is_causal"] == (family == "jetspec") and cfg["layer_types"] == ["full_attention"] * cfg["num_hidden_layers"]
    vector = torch.load(tmp_path / "mask_embedding.pt", weights_only=True)
    assert isinstance(vector, torch.Tensor) and vector.shape == (model.config.hidden_size,)
    assert torch.equal(vector, model.mask_embedding.detach())
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    backbone = {k.removeprefix("model.") for k in keys if not k.startswith("ar_approximation.")}
    assert backbone == dflash_keys(cfg["num_hidden_layers"])  # no mask_embedding key: z-lab's loader sees no stray key
    if layout != "treeflash":
        assert {vllm_names(k) for k in keys} | {"model.mask_embedding"} == vllm_params(cfg["num_hidden_layers"])

    # vLLM: the query is [root, mask_id x (B-1)] embedded with the target's table, masked slots replaced
    embed = target.model.get_input_embeddings().weight.detach()
    again = make(family, target, [f"path={tmp_path}", "block_size=8"])
    root = 7
    ids = torch.tensor([root] + [mask_id] * (model.config.block_size - 1))
    vllm_embeds = torch.where((ids == mask_id)[:, None], vector.reshape(-1).to(embed.dtype), embed[ids])
    assert torch.equal(again.model.block_embeds(embed[root], embed), vllm_embeds)
    for a, b in zip(model.state_dict().items(), again.model.state_dict().items()):
        assert a[0] == b[0] and torch.equal(a[1], b[1])
    assert_lossless(setup, again)
    save_block(again.model, tmp_path / "resaved", layout)  # a loaded model keeps its id and file
    assert json.loads((tmp_path / "resaved" / "config.json").read_text())["dflash_config"]["mask_token_id"] == mask_id
    assert torch.equal(torch.load(tmp_path / "resaved" / "mask_embedding.pt", weights_only=True), vector)


def test_spare_id_keeps_plain_layout_and_mask_files_checked(setups, tmp_path):
    """A model using a spare id of the target writes the plain upstream layout (no file, even over a
    stale one); specbench's older layout (mask_embedding in model.safetensors, id null) still loads;
    vLLM's dict form of the file loads; a mismatched, mis-sized or missing mask is one line."""
    setup = setups["tiny-qwen3"]
    target = setup.target
    learned = random_block_model(target, seed=0, block_size=8)
    save_block(learned, tmp_path / "plain", "dflash")
    assert (tmp_path / "plain" / "mask_embedding.pt").exists()
    spare = random_block_model(target, seed=0, block_size=8, mask_token_id=300)  # tiny-qwen3 tokenizes 259 ids of 384
    save_block(spare, tmp_path / "plain", "dflash")
    cfg = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert cfg["dflash_config"]["mask_token_id"] == 300 and "specbench" not in cfg
    assert not (tmp_path / "plain" / "mask_embedding.pt").exists()
    assert load_block(tmp_path / "plain", target, "dflash").mask_embedding is None

    # the older layout: the vector inside model.safetensors, mask_token_id null
    vector = torch.randn(target.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        learned.mask_embedding.copy_(vector)
    save_block(learned, tmp_path / "old", "dflash")
    (tmp_path / "old" / "mask_embedding.pt").unlink()
    cfg = json.loads((tmp_path / "old" / "config.json").read_text())
    cfg["dflash_config"]["mask_token_id"] = None
    (tmp_path / "old" / "config.json").write_text(json.dumps(cfg))
    state = {k: v.contiguous() for k, v in learned.state_dict().items()}
    save_file(state, str(tmp_path / "old" / "model.safetensors"))
    assert torch.equal(load_block(tmp_path / "old", target, "dflash").mask_embedding.detach(), vector)

    # vLLM's dict form; then broken files
    save_block(learned, tmp_path / "dict", "dflash")
    mask_id = json.loads((tmp_path / "dict" / "config.json").read_text())["dflash_config"]["mask_token_id"]
    pt = tmp_path / "dict" / "mask_embedding.pt"
    torch.save({"mask_token_id": mask_id, "embedding": vector[None]}, pt)
    assert torch.equal(load_block(tmp_path / "dict", target, "dflash").mask_embedding.detach(), vector)
    bad = [({"mask_token_id": mask_id - 1, "embedding": vector}, "is for mask_token_id"),
           (torch.zeros(target.hidden_size + 1), "hidden_size"), ({"mask_token_id": mask_id}, "no floating-point tensor")]
    for content, words in bad:
        torch.save(content, pt)
        with pytest.raises(UserError, match=words) as info:
            load_block(tmp_path / "dict", target, "dflash")
        assert "\n" not in str(info.value)
    pt.write_bytes(b"not a torch file")
    with pytest.raises(UserError, match="could not read mask_embedding.pt"):
        load_block(tmp_path / "dict", target, "dflash")
    pt.unlink()
    cfg = json.loads((tmp_path / "dict" / "config.json").read_text())
    cfg["dflash_config"]["mask_token_id"] = None
    (tmp_path / "dict" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="mask_token_id null but no mask_embedding.pt"):
        load_block(tmp_path / "dict", target, "dflash")


def test_registered_and_configurable():
    eps = available_drafters()
    assert {"dflash", "jetspec", "treeflash"} <= set(eps)
    with pytest.raises(UserError, match="tree must be"):
        parse_config(DFlashConfig, ["tree=beam"])
    with pytest.raises(UserError, match="unknown --set key"):
        parse_config(JetSpecConfig, ["depth=3"])
    assert parse_config(TreeFlashConfig, ["ar_approximation=false"]).ar_approximation is False


# --------------------------------------------------------------------------- `specbench train` and what ships


def test_cli_train_all_three_families(setups, tmp_path, monkeypatch, wide_console):
    """`specbench train` end to end for dflash, then treeflash on that backbone, then jetspec; the
    outputs load as drafters and stay lossless; treeflash's backbone is unchanged (frozen)."""
    from typer.testing import CliRunner

    from specbench.cli import app

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    common = ["--target", "tiny-llama", "--data", "mbpp-train", "--budget-tokens", "600", "--heldout-tokens", "150",
              "--no-regenerate", "--set", "epochs=1", "--set", "batch_tokens=512", "--set", "block_size=8",
              "--set", "anchors_per_sequence=64"]
    outs = {}
    for family, extra in (("dflash", []), ("treeflash", ["--set", f"backbone={tmp_path / 'dflash'}"]), ("jetspec", [])):
        outs[family] = tmp_path / family
        res = CliRunner().invoke(app, ["train", "--drafter", family, *common, *extra, "--out", str(outs[family])])
        assert res.exit_code == 0, res.output
        summary = json.loads((outs[family] / "training.json").read_text())
        assert summary["finished"] and {"acc_0", "acc_6", "chain_tau"} <= set(summary["heldout"])
        card = (outs[family] / "TRAINING.md").read_text()
        assert "## Final held-out metrics" in card and "## Root sensitivity" in card
        probe = summary["root_probe"]
        assert probe["acc_true_roots"] == summary["heldout"]["acc_0"] and isinstance(probe["ignores_root"], bool)
    setup = setups["tiny-llama"]
    models = {}
    for family in outs:
        drafter = make(family, setup.target, [f"path={outs[family]}", "budget=12"])
        models[family] = drafter.model
        assert_lossless(setup, drafter)
    assert json.loads((outs["jetspec"] / "config.json").read_text())["dflash_config"]["causal_head"] is True
    from test_train import assert_snapshot_is_the_checkpoint

    assert_snapshot_is_the_checkpoint(outs["jetspec"], tmp_path / "snap-jetspec", setup.target)
    tf, base = models["treeflash"].state_dict(), models["dflash"].state_dict()
    assert all(torch.equal(tf[k], v) for k, v in base.items())
    assert float(tf["ar_approximation.d.weight"].abs().sum()) > 0  # the correction trained


SHIPPED = {"dflash": (False, False, 16), "jetspec": (True, False, 16), "treeflash": (False, True, 26)}


CHECKPOINTS = Path(__file__).parent.parent / "drafters" / "checkpoints"


@pytest.mark.parametrize("family,folder", [(f, d.name) for f in SHIPPED
                                           for d in sorted(CHECKPOINTS.glob(f"{f}-smollm2-135m*"))])
def test_shipped_smollm2_checkpoints_are_package_data(family, folder):
    """Every block head that ships for the default target (the defaults and the other named heads) is in
    its released layout, fp16, with a card; a reduced-vocabulary head (folder `-v<N>k`) adds its d2t / t2d."""
    from safetensors import safe_open

    causal, treeflash, max_mb = SHIPPED[family]
    path = CHECKPOINTS / folder
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_target_layers"]) == (49152, 576, 30)
    assert bool(cfg["dflash_config"].get("causal_head", False)) == causal
    # SmolLM2 has no spare id: vLLM's layout for a learned mask (a chosen id + mask_embedding.pt)
    assert cfg["dflash_config"]["mask_token_id"] == 49151 and cfg["specbench"]["learned_mask_embedding"]
    mask = torch.load(path / "mask_embedding.pt", weights_only=True)
    assert isinstance(mask, torch.Tensor) and mask.shape == (576,) and mask.dtype == torch.float16
    assert (path / "model.safetensors").stat().st_size <= max_mb * 2**20
    reduced = "draft_vocab_size" in cfg  # the named reduced-vocabulary variant (d2t / t2d maps)
    assert reduced == bool(cfg["specbench"].get("reduced_draft_vocabulary", False)) == folder.endswith(f"-v{cfg.get('draft_vocab_size', 0) // 1024}k")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys()) - ({"d2t", "t2d"} if reduced else set())
        assert all(f.get_tensor(k).dtype == torch.float16 for k in keys)
        if reduced:
            from drafters.common.vocab import target_ids_of

            d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
            ids = target_ids_of(d2t)
            assert d2t.shape == (cfg["draft_vocab_size"],) and t2d.shape == (49152,) and t2d.dtype == torch.bool
            assert int(t2d.sum()) == len(set(ids.tolist())) == cfg["draft_vocab_size"] and bool(t2d[ids].all())
    backbone = {k.removeprefix("model.") for k in keys if not k.startswith("ar_approximation.")}
    assert backbone == dflash_keys(cfg["num_hidden_layers"])
    assert all(k.startswith(("model.", "ar_approximation.")) for k in keys) == treeflash
    if treeflash:
        assert cfg["treeflash_config"]["ar_approximation"] == "swiglu"
    card = (path / "TRAINING.md").read_text()
    assert "specbench train" in card and "## Final held-out metrics" in card


@pytest.mark.parametrize("options,words", [
    (["--set", "backbone=/no/such/dir"], "is not a DFlash checkpoint directory"),
    ([], "--set backbone=DIR"),
])
def test_cli_train_treeflash_needs_a_backbone(tmp_path, wide_console, options, words):
    """A missing backbone is one line and exit 2 before anything is written to --out."""
    from typer.testing import CliRunner

    from specbench.cli import app

    res = CliRunner().invoke(app, ["train", "--drafter", "treeflash", "--target", "tiny-llama", *options,
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
