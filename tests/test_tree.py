"""DraftTree and the pure tree helpers: validation, hand examples, and property tests against
slow references that walk the parent pointers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specbench.tree import (
    BestFirst,
    DraftTree,
    TreeBuilder,
    ancestor_mask,
    best_closed,
    chain,
    check_tree,
    children_lists,
    depths,
    from_paths,
    path_to,
    root_only,
)


def T(xs):
    return torch.tensor(xs, dtype=torch.long)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "tokens, parents, message",
    [
        ([], [], "at least the root"),
        ([1, 2], [-1], "equal length"),
        ([[1, 2]], [[-1, 0]], "1-D"),
        ([1, 2], [0, 0], "parents\\[0\\] must be -1"),
        ([1, 2], [-1, -1], "smaller index"),  # a second root
        ([1, 2], [-1, 1], "smaller index"),  # self-parent
        ([1, 2, 3], [-1, 2, 0], "smaller index"),  # parent after the child
        ([1, 2, 3], [-1, 0, 5], "smaller index"),  # parent out of range
    ],
)
def test_check_tree_rejects(tokens, parents, message):
    with pytest.raises(ValueError, match=message):
        DraftTree(tokens=T(tokens), parents=T(parents))
    with pytest.raises(ValueError, match=message):
        check_tree(T(tokens), T(parents))


def test_draft_probs_needs_one_row_per_node():
    with pytest.raises(ValueError, match="one row per node"):
        DraftTree(tokens=T([1, 2, 3]), parents=T([-1, 0, 0]), draft_probs=torch.full((2, 5), 0.2))
    tree = DraftTree(tokens=T([1, 2, 3]), parents=T([-1, 0, 0]), draft_probs=torch.full((3, 5), 0.2))
    assert tree.size == 3


def test_valid_trees_accepted():
    assert DraftTree(tokens=T([7]), parents=T([-1])).size == 1
    assert DraftTree(tokens=T([7, 8, 9, 9]), parents=T([-1, 0, 0, 1])).size == 4


# --------------------------------------------------------------------------- hand examples


def test_root_only_and_chain():
    r = root_only(42)
    assert r.tokens.tolist() == [42] and r.parents.tolist() == [-1]
    c = chain([5, 6, 7, 8])
    assert c.tokens.tolist() == [5, 6, 7, 8]
    assert c.parents.tolist() == [-1, 0, 1, 2]
    assert depths(c.parents).tolist() == [0, 1, 2, 3]
    assert torch.equal(ancestor_mask(c.parents), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert path_to(c.parents, 3) == [0, 1, 2, 3]
    assert children_lists(c.parents) == [[1], [2], [3], []]
    assert chain(torch.tensor([3])).parents.tolist() == [-1]


# A hand tree:            0 (root 10)
#                        /     |     \
#                   1 (11)  2 (12)  3 (13)
#                    |   \      \
#                4 (14) 5 (15)  6 (16)
#                                 |
#                               7 (17)
HAND_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 6]


def test_hand_tree_helpers():
    p = T(HAND_PARENTS)
    assert depths(p).tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    assert children_lists(p) == [[1, 2, 3], [4, 5], [6], [], [], [], [7], []]
    assert path_to(p, 0) == [0]
    assert path_to(p, 5) == [0, 1, 5]
    assert path_to(p, 7) == [0, 2, 6, 7]
    expected_rows = {
        0: {0},
        1: {0, 1},
        2: {0, 2},
        3: {0, 3},
        4: {0, 1, 4},
        5: {0, 1, 5},
        6: {0, 2, 6},
        7: {0, 2, 6, 7},
    }
    mask = ancestor_mask(p)
    assert mask.dtype == torch.bool and mask.shape == (8, 8)
    for i, row in expected_rows.items():
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == row


def test_from_paths_hand_example():
    tree = from_paths(9, [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]])
    # breadth-first by insertion: 1, 2, 3 for the first path; 4 under 2; 5 under 1; 6 under root
    assert tree.tokens.tolist() == [9, 1, 2, 3, 4, 5, 6]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2, 1, 0]
    assert from_paths(9, []).tokens.tolist() == [9]
    # the same token under different parents is two nodes
    t2 = from_paths(0, [[1, 1], [1]])
    assert t2.tokens.tolist() == [0, 1, 1] and t2.parents.tolist() == [-1, 0, 1]


# --------------------------------------------------------------------------- property tests


@st.composite
def random_parents(draw, max_nodes: int = 24):
    n = draw(st.integers(min_value=1, max_value=max_nodes))
    parents = [-1]
    for i in range(1, n):
        parents.append(draw(st.integers(min_value=0, max_value=i - 1)))
    return parents


def slow_ancestors(parents: list[int], i: int) -> set[int]:
    out = set()
    while i != -1:
        out.add(i)
        i = parents[i]
    return out


def slow_depth(parents: list[int], i: int) -> int:
    d = 0
    while parents[i] != -1:
        i = parents[i]
        d += 1
    return d


@settings(max_examples=200, deadline=None)
@given(random_parents())
def test_ancestor_mask_matches_parent_walk(parents):
    p = T(parents)
    mask = ancestor_mask(p)
    n = len(parents)
    for i in range(n):
        for j in range(n):
            assert bool(mask[i, j]) == (j in slow_ancestors(parents, i))


@settings(max_examples=200, deadline=None)
@given(random_parents())
def test_depths_paths_children_consistent(parents):
    p = T(parents)
    d = depths(p).tolist()
    kids = children_lists(p)
    mask = ancestor_mask(p)
    for i in range(len(parents)):
        assert d[i] == slow_depth(parents, i)
        if i > 0:
            assert d[i] == d[parents[i]] + 1
        path = path_to(p, i)
        assert path[0] == 0 and path[-1] == i and len(path) == d[i] + 1
        assert all(parents[b] == a for a, b in zip(path, path[1:]))
        assert set(path) == set(torch.nonzero(mask[i]).flatten().tolist())
        assert kids[i] == [j for j in range(len(parents)) if parents[j] == i]
    assert sum(len(k) for k in kids) == len(parents) - 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=5), min_size=0, max_size=8))
def test_from_paths_merges_shared_prefixes(paths):
    tree = from_paths(99, paths)
    prefixes = {tuple(path[:k]) for path in paths for k in range(1, len(path) + 1)}
    assert tree.size == 1 + len(prefixes)
    # every node's root-to-node token sequence is a distinct prefix, and every prefix is a node
    seqs = set()
    for i in range(1, tree.size):
        toks = tuple(tree.tokens[path_to(tree.parents, i)[1:]].tolist())
        seqs.add(toks)
    assert seqs == prefixes
    assert int(tree.tokens[0]) == 99
    # siblings never share a token
    for kids in children_lists(tree.parents):
        toks = [int(tree.tokens[k]) for k in kids]
        assert len(toks) == len(set(toks))


# --------------------------------------------------------------------------- building and pruning


def test_deep_and_wide_trees_vectorised_helpers_match_walks():
    """Binary lifting on trees deeper than any test above: a 300-node chain and a random 300-node tree."""
    g = torch.Generator().manual_seed(0)
    for parents in ([-1] + list(range(299)),
                    [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, 300)]):
        p = T(parents)
        tree = DraftTree(tokens=torch.zeros(300, dtype=torch.long), parents=p)
        assert tree.depth.tolist() == [slow_depth(parents, i) for i in range(300)]
        for i in (0, 7, 150, 299):
            assert set(torch.nonzero(tree.ancestors[i]).flatten().tolist()) == slow_ancestors(parents, i)


def closed(parents: list[int], keep: list[int]) -> bool:
    return all(parents[i] in keep for i in keep if i > 0)


@settings(max_examples=200, deadline=None)
@given(random_parents(), st.integers(1, 12), st.integers(0, 2**31 - 1), st.booleans())
def test_best_closed_keeps_the_best_ancestor_closed_set(parents, budget, seed, monotone):
    g = torch.Generator().manual_seed(seed)
    n = len(parents)
    step = -torch.rand(n, generator=g, dtype=torch.float64).round(decimals=1)  # ties happen
    if monotone:  # cumulative log-probs: a child never scores above its parent
        scores = [0.0] * n
        for i in range(1, n):
            scores[i] = scores[parents[i]] + float(step[i])
    else:
        scores = [0.0] + [float(x) for x in step[1:]]
    keep = best_closed(torch.tensor(scores, dtype=torch.float64), T(parents), budget).tolist()
    assert keep[0] == 0 and keep == sorted(keep) and len(keep) == min(budget, n) and closed(parents, keep)
    path_min = [min(scores[j] for j in slow_ancestors(parents, i) if j > 0) if i else float("inf") for i in range(n)]
    worst_kept = min(path_min[i] for i in keep)
    assert all(path_min[i] <= worst_kept for i in range(n) if i not in keep)
    if monotone:  # then simply the best scores, ties to the smaller id
        ranked = sorted(range(1, n), key=lambda i: (-scores[i], i))
        assert keep == sorted([0] + ranked[: min(budget, n) - 1])


def test_tree_builder_build_prune_and_merge():
    b = TreeBuilder(7)
    a = b.add(0, 1, -0.1)
    c = b.add(a, 2, -0.5)
    d = b.add(0, 3, -0.3)
    assert b.child(0, 1) == a and b.child(a, 4, -0.9) == 4  # an existing child is reused
    full = b.build()
    assert full.tokens.tolist() == [7, 1, 2, 3, 4] and full.parents.tolist() == [-1, 0, 1, 0, 1]
    small = b.build(budget=3)  # root, 1 (-0.1), 3 (-0.3)
    assert small.tokens.tolist() == [7, 1, 3] and small.parents.tolist() == [-1, 0, 0]
    assert b.depth == [0, 1, 2, 1, 2] and c == 2 and d == 3
    with pytest.raises(ValueError):
        b.add(9, 1)


def test_best_first_pops_best_then_oldest():
    q = BestFirst()
    for score, item in [(-1.0, "a"), (-0.5, "b"), (-1.0, "c"), (0.0, "d")]:
        q.push(score, item)
    assert [q.pop()[1] for _ in range(4)] == ["d", "b", "a", "c"] and not q
