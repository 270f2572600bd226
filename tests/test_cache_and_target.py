"""Target.forward_tree and the KV-cache commit on the tiny random-init targets (fp32, CPU).

* a chain in one tree forward == decoding it token by token (logits and features);
* every node of a bushy tree == running its root-to-node path as a chain (so the tree mask is right);
* after forward_tree + commit(pos, path) the cache == a fresh prefill of prefix + path tokens;
  the fast commit (crop) == its slow twin (gather) on contiguous paths;
* the AR baseline through decode.generate == transformers' own greedy generate.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from drafters.ar import ARDrafter
from specbench.cache import commit_path, commit_path_gather
from specbench.decode import generate
from specbench.drafter import Sampling
from stopsearch import early_stop_prompt
from specbench.targets import load_target
from specbench.tree import DraftTree, chain, path_to, root_only

TARGETS = ["tiny-llama", "tiny-qwen3"]
FEATURE_LAYERS = (0, 2, 4)  # embeddings, a middle layer, the last layer (HF hidden_states indices)
ATOL = 1e-4


@pytest.fixture(scope="module")
def targets():
    return {name: load_target(name, device="cpu", dtype="float32") for name in TARGETS}


def prefix_ids(n: int, seed: int, vocab: int = 384) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g)


@torch.inference_mode()
def plain_last_logits(target, ids: list[int] | torch.Tensor) -> torch.Tensor:
    """Logits after the last of ``ids``: one plain causal forward, no cache, no custom mask."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    return target.model(input_ids=ids[None], use_cache=False).logits[0, -1].float()


def cache_tensors(target) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in target.cache.layers]


def assert_caches_close(a, b, atol=ATOL, exact=False):
    assert len(a) == len(b)
    for (ka, va), (kb, vb) in zip(a, b):
        assert ka.shape == kb.shape and va.shape == vb.shape
        if exact:
            assert torch.equal(ka, kb) and torch.equal(va, vb)
        else:
            torch.testing.assert_close(ka, kb, atol=atol, rtol=1e-4)
            torch.testing.assert_close(va, vb, atol=atol, rtol=1e-4)


# --------------------------------------------------------------------------- forward_tree


@pytest.mark.parametrize("name", TARGETS)
def test_chain_forward_equals_token_by_token(targets, name):
    target = targets[name]
    ids = prefix_ids(20, seed=1)
    pos = 12
    prefix, drafts = ids[:pos], ids[pos:]  # drafts[0] is the root at position pos

    target.prefill(prefix)
    out = target.forward_tree(chain(drafts), pos, FEATURE_LAYERS)
    assert target.kv_length == pos + drafts.numel()
    assert out.logits.shape == (drafts.numel(), target.vocab_size)
    assert out.features.shape == (drafts.numel(), len(FEATURE_LAYERS) * target.hidden_size)

    # the same tokens one at a time, each a 1-node tree at the next position
    target.prefill(prefix)
    step_logits, step_feats = [], []
    for i, tok in enumerate(drafts.tolist()):
        o = target.forward_tree(root_only(tok), pos + i, FEATURE_LAYERS)
        step_logits.append(o.logits[0])
        step_feats.append(o.features[0])
    torch.testing.assert_close(out.logits, torch.stack(step_logits), atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(out.features, torch.stack(step_feats), atol=ATOL, rtol=1e-4)

    # and against a plain forward over the whole sequence (no cache, no 4-D mask)
    with torch.inference_mode():
        plain = target.model(input_ids=ids[None], use_cache=False, output_hidden_states=True)
    torch.testing.assert_close(out.logits, plain.logits[0, pos:].float(), atol=ATOL, rtol=1e-4)
    plain_feats = torch.cat([plain.hidden_states[i][0, pos:] for i in FEATURE_LAYERS], dim=-1)
    torch.testing.assert_close(out.features, plain_feats, atol=ATOL, rtol=1e-4)

    # prefill's features: row j is the hidden state at position j
    feats = target.prefill(prefix, FEATURE_LAYERS)
    plain_prefix_feats = torch.cat([plain.hidden_states[i][0, :pos] for i in FEATURE_LAYERS], dim=-1)
    torch.testing.assert_close(feats, plain_prefix_feats, atol=ATOL, rtol=1e-4)


#                   0
#         /         |          \
#        1          2           3          (3 duplicates 1's token)
#      /   \        |         /   \
#     4     5       6        7     8
#     |             |              |
#     9            10             11
BUSHY_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 3, 3, 4, 6, 8]


@pytest.mark.parametrize("name", TARGETS)
def test_bushy_tree_nodes_equal_their_paths(targets, name):
    target = targets[name]
    prefix = prefix_ids(9, seed=2)
    tokens = prefix_ids(len(BUSHY_PARENTS), seed=3)
    tokens[3] = tokens[1]  # a duplicate sibling: must still see only its own ancestors
    tokens[7] = tokens[4]
    tree = DraftTree(tokens=tokens, parents=torch.tensor(BUSHY_PARENTS))
    pos = prefix.numel()
    target.prefill(prefix)
    out = target.forward_tree(tree, pos, FEATURE_LAYERS)
    for node in range(tree.size):
        path = path_to(tree.parents, node)
        ref = plain_last_logits(target, torch.cat([prefix, tokens[path]]))
        torch.testing.assert_close(out.logits[node], ref, atol=ATOL, rtol=1e-4)
        # and through the library's own chain forward
        target.prefill(prefix)
        chain_out = target.forward_tree(chain(tokens[path]), pos, FEATURE_LAYERS)
        torch.testing.assert_close(out.logits[node], chain_out.logits[-1], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(out.features[node], chain_out.features[-1], atol=ATOL, rtol=1e-4)


def test_forward_tree_checks_cache_length(targets):
    target = targets["tiny-llama"]
    target.prefill(prefix_ids(5, seed=4))
    with pytest.raises(RuntimeError, match="5 slots"):
        target.forward_tree(chain([1, 2]), 4)


# --------------------------------------------------------------------------- commit


@st.composite
def tree_and_node(draw, max_nodes: int = 10):
    n = draw(st.integers(min_value=1, max_value=max_nodes))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = draw(st.lists(st.integers(0, 383), min_size=n, max_size=n))
    node = draw(st.integers(0, n - 1))
    return tokens, parents, node


@settings(max_examples=15, deadline=None)
@given(tree_and_node(), st.sampled_from(TARGETS), st.integers(1, 12))
def test_commit_equals_prefill_of_path(targets, case, name, pos):
    tokens, parents, node = case
    target = targets[name]
    prefix = prefix_ids(pos, seed=pos)
    tree = DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents))
    path = path_to(tree.parents, node)

    target.prefill(prefix)
    target.forward_tree(tree, pos)
    target.commit(pos, path)
    assert target.kv_length == pos + len(path)
    committed = cache_tensors(target)

    path_tokens = tree.tokens[path]
    target.prefill(torch.cat([prefix, path_tokens]))
    assert_caches_close(committed, cache_tensors(target))

    # the committed cache is usable: the next token's logits equal a plain forward
    target.prefill(prefix)
    target.forward_tree(tree, pos)
    target.commit(pos, path)
    nxt = int(tokens[0]) ^ 1
    out = target.forward_tree(root_only(nxt), pos + len(path))
    ref = plain_last_logits(target, torch.cat([prefix, path_tokens, torch.tensor([nxt])]))
    torch.testing.assert_close(out.logits[0], ref, atol=ATOL, rtol=1e-4)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(1, 10).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.integers(1, n),  # length of the contiguous path 0..a
            st.lists(st.integers(0, 10**6), min_size=n, max_size=n),
        )
    ),
    st.sampled_from(TARGETS),
)
def test_commit_fast_path_equals_gather(targets, case, name):
    n, path_len, rnd = case
    # nodes 0..path_len-1 form a chain (so the path is contiguous); later nodes hang anywhere
    parents = [-1] + [i - 1 if i < path_len else rnd[i] % i for i in range(1, n)]
    tokens = [r % 384 for r in rnd]
    tree = DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents))
    path = list(range(path_len))
    assert path_to(tree.parents, path_len - 1) == path
    pos = 7
    target = targets[name]
    target.prefill(prefix_ids(pos, seed=5))
    target.forward_tree(tree, pos)
    fast_cache = target.cache
    slow_cache = copy.deepcopy(fast_cache)
    commit_path(fast_cache, pos, path)
    commit_path_gather(slow_cache, pos, path)
    assert fast_cache.get_seq_length() == slow_cache.get_seq_length() == pos + path_len
    a = [(layer.keys, layer.values) for layer in fast_cache.layers]
    b = [(layer.keys, layer.values) for layer in slow_cache.layers]
    assert_caches_close(a, b, exact=True)


def test_commit_rejects_too_long_path(targets):
    target = targets["tiny-llama"]
    target.prefill(prefix_ids(4, seed=6))
    target.forward_tree(chain([1, 2]), 4)
    with pytest.raises(ValueError, match="fewer than"):
        target.commit(4, [0, 1, 2])


# --------------------------------------------------------------------------- AR == transformers generate


def first_stop(ids: list[int], stop: set[int]) -> list[int]:
    """ids up to and including the first stop token."""
    for i, tok in enumerate(ids):
        if tok in stop:
            return ids[: i + 1]
    return ids


@pytest.mark.parametrize("name", TARGETS)
def test_ar_generate_equals_transformers_generate(targets, name):
    target = targets[name]
    stop = set(target.stop_token_ids)
    n_new = 40
    prompts = [prefix_ids(n, seed=10 + n) for n in (1, 2, 17, 33)]
    prompts.append(torch.tensor(target.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")))
    prompts.append(early_stop_prompt(target))  # transformers' output must be cut at the stop token
    for prompt in prompts:
        ours = generate(target, ARDrafter(target), prompt, n_new, Sampling()).output_ids
        with torch.inference_mode():
            hf = target.model.generate(
                prompt[None], attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long),
                do_sample=False, max_new_tokens=n_new,
            )[0, prompt.numel():].tolist()
        hf = first_stop(hf, stop)
        assert ours == hf
        assert len(ours) == n_new or ours[-1] in stop
    assert ours[-1] in stop and len(ours) >= 3  # the last prompt did exercise the stop


@pytest.mark.parametrize("name", TARGETS)
def test_last_logits_only_and_forced_tree_mask_match_the_plain_forward(targets, name):
    """Both fast paths of forward_tree (lm_head on the last row only; the model's own causal mask
    for a chain) against the general path (explicit tree mask, every row)."""
    target = targets[name]
    prefix = prefix_ids(7, seed=5)
    tokens = prefix_ids(6, seed=6)
    pos = prefix.numel()
    target.prefill(prefix)
    full = target.forward_tree(chain(tokens), pos, force_tree_mask=True)
    target.prefill(prefix)
    fast = target.forward_tree(chain(tokens), pos)
    target.prefill(prefix)
    last = target.forward_tree(chain(tokens), pos, last_logits_only=True)
    assert last.logits.shape == (1, full.logits.shape[1])
    torch.testing.assert_close(fast.logits, full.logits, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(last.logits[0], full.logits[-1], atol=ATOL, rtol=1e-4)
