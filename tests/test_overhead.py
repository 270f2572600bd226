"""The step's harness parts without per-node loops or per-step syncs: vectorised greedy acceptance
against the walk, host-known tree facts, the in-place K/V commit against a plain gather, the tree
depth logged per step, and `specbench hardware overhead` (tiny targets)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from typer.testing import CliRunner

from specbench import cli
from specbench.cache import commit_path_gather
from specbench.decode import generate
from specbench.drafter import Sampling, drafter_class, parse_config
from specbench.hardware.overhead import PARTS, layered_tree, measure_overhead
from specbench.targets import load_target
from specbench.tree import DraftTree, TreeBuilder, ancestor_mask, chain, is_chain, path_to, root_only
from specbench.verify import verify_greedy, verify_greedy_walk


def random_tree(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int]]:
    parents = [-1] + [rng.randrange(max(0, i - rng.choice([1, 3, i])), i) for i in range(1, n)]
    tokens = [rng.randrange(vocab) for _ in range(n)]
    return tokens, parents


def test_vectorised_greedy_acceptance_equals_the_walk():
    rng = random.Random(0)
    for trial in range(400):
        n, vocab = rng.randint(1, 40), rng.choice([2, 3, 5, 50])  # small vocabularies: many duplicate siblings
        tokens, parents = random_tree(rng, n, vocab)
        # logits whose argmax follows the tree often: each node's choice is a random child's token
        kids = {i: [j for j in range(n) if parents[j] == i] for i in range(n)}
        choice = [tokens[rng.choice(kids[i])] if kids[i] and rng.random() < 0.8 else rng.randrange(vocab) for i in range(n)]
        logits = torch.randn(n, vocab) * 0.1
        logits[torch.arange(n), torch.tensor(choice)] += 10.0
        tree = DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents))
        fast, walk = verify_greedy(tree, logits), verify_greedy_walk(tree, logits)
        assert (fast.path, fast.bonus) == (walk.path, walk.bonus), (trial, tokens, parents, choice)
        assert fast.tokens == [tokens[i] for i in walk.path[1:]]
        if len(walk.path) > 1:
            assert path_to(tree.parents, walk.path[-1]) == walk.path


def test_ancestor_mask_matches_the_parent_walk():
    rng = random.Random(1)
    for _ in range(50):
        _, parents = random_tree(rng, rng.randint(1, 300), 7)
        mask = ancestor_mask(torch.tensor(parents))
        for i in rng.sample(range(len(parents)), min(20, len(parents))):
            want = set(path_to(torch.tensor(parents), i))
            assert set(torch.nonzero(mask[i]).flatten().tolist()) == want


def test_tree_facts_known_on_the_host():
    rng = random.Random(2)
    for _ in range(30):
        tokens, parents = random_tree(rng, rng.randint(1, 20), 9)
        b = TreeBuilder(tokens[0])
        for i in range(1, len(tokens)):
            b.add(parents[i], tokens[i], -i)
        tree = b.build()
        assert tree.checked and tree.chain == is_chain(torch.tensor(parents)) == tree.is_chain
        pruned = b.build(budget=max(1, len(tokens) // 2))
        assert pruned.chain == is_chain(pruned.parents)
    assert chain([1, 2, 3]).is_chain and root_only(4).is_chain
    unchecked = DraftTree(tokens=torch.tensor([1, 2, 3]), parents=torch.tensor([-1, 0, 0]))
    assert unchecked.chain is False and not unchecked.is_chain
    with pytest.raises(ValueError, match="smaller index"):
        DraftTree(tokens=torch.tensor([1, 2]), parents=torch.tensor([-1, 1]))
    with pytest.raises(ValueError, match="parents\\[0\\]"):
        DraftTree(tokens=torch.tensor([1, 2]), parents=torch.tensor([0, 0]))


@pytest.fixture(scope="module")
def tiny():
    return load_target("tiny-qwen3", "cpu")


def test_in_place_commit_equals_a_plain_gather(tiny):
    rng = random.Random(3)
    for _ in range(10):
        tokens, parents = random_tree(rng, rng.randint(2, 30), 384)
        tree = DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents))
        path = path_to(tree.parents, rng.randrange(len(tokens)))
        pos = rng.randint(1, 20)
        tiny.prefill(torch.randint(0, 384, (pos,), generator=torch.Generator().manual_seed(pos)))
        tiny.forward_tree(tree, pos)
        want = [(layer.keys.clone(), layer.values.clone()) for layer in tiny.cache.layers]
        index = torch.tensor(list(range(pos)) + [pos + p for p in path])
        commit_path_gather(tiny.cache, pos, path)
        assert tiny.kv_length == pos + len(path)
        for layer, (k, v) in zip(tiny.cache.layers, want):
            assert torch.equal(layer.keys, k.index_select(-2, index))
            assert torch.equal(layer.values, v.index_select(-2, index))


def test_tree_depth_per_step_is_logged(tiny):
    cls = drafter_class("ngram")
    drafter = cls(tiny, parse_config(cls.Config, ["min_n=1", "num_draft=3"]))
    ids = torch.tensor(tiny.tokenizer("ab ab ab ab ab ab")["input_ids"])
    gen = generate(tiny, drafter, ids, 40, Sampling())
    assert gen.steps and all(s.tree_depth == s.tree_size - 1 for s in gen.steps)  # ngram drafts chains
    assert any(s.tree_size > 1 for s in gen.steps)


def test_layered_tree_plants_a_full_depth_path():
    parents, path = layered_tree(64, 5, random.Random(0))
    assert len(parents) == 64 and len(path) == 6
    assert path_to(torch.tensor(parents), path[-1]) == path


def test_overhead_parts_and_share(tiny):
    result = measure_overhead(tiny, "tiny-qwen3", nodes=48, depth=4, context=32, repeats=2)
    assert result.accepted == 4  # the planted path is accepted to its full depth
    assert set(result.ms) == set(PARTS) and all(v > 0 for v in result.ms.values())
    assert result.non_model_share == pytest.approx((result.step_ms - result.ms["forward"]) / result.step_ms)
    assert tiny.kv_length == 32  # every timed step was rolled back


def test_overhead_cli(wide_console):
    res = CliRunner().invoke(cli.app, ["hardware", "overhead", "--target", "tiny-llama", "--nodes", "32", "--depth", "3",
                                       "--context", "16", "--repeats", "1", "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["nodes"] == 32 and out["accepted"] == 3 and 0 < out["non_model_share"] < 1
    bad = CliRunner().invoke(cli.app, ["hardware", "overhead", "--target", "tiny-llama", "--nodes", "4", "--depth", "9"])
    assert bad.exit_code == 2 and "cannot have 9 layers" in bad.stderr and "Traceback" not in bad.output
