"""Tests of specbench.train.data: the vendored training sets, the held-out split, the assistant-only
loss mask of chat-template tokenization, and selection by token budget."""

from __future__ import annotations

import hashlib
import re
from importlib.resources import files

import pytest

from specbench.errors import UserError
from specbench.targets import tiny_tokenizer
from specbench.tasks import render_chat
from specbench.train.data import (
    TRAIN_SETS,
    TemplateNotPrefixStable,
    budget_select,
    load_conversations,
    render_messages,
    split_holdout,
    tokenize_conversation,
    tokenize_dataset,
)

EXPECTED_COUNTS = {
    "sharegpt": 1954,
    "gpteacher-codegen": 4535,
    "gpteacher-roleplay": 1923,
    "gsm8k-train": 7473,
    "mbpp-train": 374,
}
END = "<|im_end|>"


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep the datasets cache (Arrow files) out of the user's ~/.cache/specbench."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECBENCH_CACHE", str(tmp_path_factory.mktemp("specbench-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def all_sets(_private_cache):
    return load_conversations(list(EXPECTED_COUNTS))


def masked_runs(tc, tokenizer) -> list[str]:
    """The decoded text of every maximal run of loss-masked tokens."""
    runs, current = [], []
    for token, m in zip(tc.input_ids, tc.loss_mask):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(r) for r in runs]


# --------------------------------------------------------------------------- vendored sets


def test_registry_matches_files():
    assert list(TRAIN_SETS) == list(EXPECTED_COUNTS)
    for name, info in TRAIN_SETS.items():
        assert info.name == name and info.description and info.licence
        assert info.n_conversations == EXPECTED_COUNTS[name]
        folder = files("specbench.train").joinpath("data", name)
        source = folder.joinpath("SOURCE.md").read_text(encoding="utf-8")
        digest = hashlib.sha256(folder.joinpath("conversations.jsonl.gz").read_bytes()).hexdigest()
        assert digest in source, f"{name}: SOURCE.md does not record the packaged file's sha256"
        # the original's sha256 is recorded too
        assert len(set(re.findall(r"`([0-9a-f]{64})`", source))) >= 2


def test_every_set_loads_with_schema(all_sets):
    assert all_sets.column_names == ["id", "messages"]
    assert len(all_sets) == sum(EXPECTED_COUNTS.values())
    rows = all_sets.to_list()
    assert len({r["id"] for r in rows}) == len(rows)  # ids are unique across sets
    per_set = {name: 0 for name in EXPECTED_COUNTS}
    for r in rows:
        per_set[r["id"].split("/", 1)[0]] += 1
        messages = r["messages"]
        assert messages and len(messages) % 2 == 0
        for i, m in enumerate(messages):
            assert set(m) == {"role", "content"}
            assert m["role"] == ("user" if i % 2 == 0 else "assistant")
            assert m["content"] and m["content"] == m["content"].strip()
    assert per_set == EXPECTED_COUNTS
    sharegpt = [r for r in rows if r["id"].startswith("sharegpt/")]
    assert max(len(r["messages"]) for r in sharegpt) > 2  # multi-turn kept
    gsm8k = next(r for r in rows if r["id"] == "gsm8k-train/0")["messages"][1]["content"]
    assert "<<" not in gsm8k and gsm8k.endswith("#### 72")
    mbpp = [r for r in rows if r["id"].startswith("mbpp-train/")]
    assert {int(r["id"].split("/")[1]) for r in mbpp} == set(range(601, 975))
    assert all("\r" not in r["messages"][1]["content"] for r in mbpp)


def test_load_order_and_errors():
    ds = load_conversations(["mbpp-train", "gpteacher-roleplay"])
    assert ds[0]["id"] == "mbpp-train/601" and ds[len(ds) - 1]["id"] == "gpteacher-roleplay/1922"
    with pytest.raises(UserError, match="sharegpt, gpteacher-codegen"):
        load_conversations(["sharegpt", "nope"])
    with pytest.raises(UserError, match="more than once"):
        load_conversations(["mbpp-train", "mbpp-train"])
    with pytest.raises(UserError):
        load_conversations([])


# --------------------------------------------------------------------------- held-out split


def test_holdout_split(all_sets):
    split = split_holdout(all_sets, 0.02, seed=0)
    train, held = set(split.train["id"]), set(split.heldout["id"])
    assert not train & held and len(train) + len(held) == len(all_sets)
    assert 0.015 < len(held) / len(all_sets) < 0.025
    again = split_holdout(all_sets, 0.02, seed=0)
    assert list(again.heldout["id"]) == list(split.heldout["id"])  # deterministic, input order
    assert set(split_holdout(all_sets, 0.02, seed=1).heldout["id"]) != held
    assert len(split_holdout(all_sets, 0.0).heldout) == 0
    with pytest.raises(UserError):
        split_holdout(all_sets, 1.0)


def test_holdout_stable_when_sets_are_added():
    small = split_holdout(load_conversations(["mbpp-train"]), 0.1, seed=3)
    big = split_holdout(load_conversations(["gsm8k-train", "mbpp-train"]), 0.1, seed=3)
    big_held = {i for i in big.heldout["id"] if i.startswith("mbpp-train/")}
    assert big_held == set(small.heldout["id"]) and big_held


# --------------------------------------------------------------------------- tokenization

CONVERSATION = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help? \u00e9\u6f22"},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "2 + 3 = 5\n\nDone."},
]


def test_loss_mask_marks_exactly_assistant_text(tok):
    tc = tokenize_conversation(tok, CONVERSATION, max_length=4096)
    assert tc.input_ids == render_messages(tok, CONVERSATION, False)  # the whole template rendering
    assert len(tc.loss_mask) == len(tc.input_ids) and set(tc.loss_mask) <= {0, 1}
    assistant = [m["content"] + END for m in CONVERSATION if m["role"] == "assistant"]
    assert masked_runs(tc, tok) == assistant
    assert tc.n_loss_tokens == sum(len(tok.encode(a, add_special_tokens=False)) for a in assistant)
    unmasked = tok.decode([t for t, m in zip(tc.input_ids, tc.loss_mask) if not m])
    assert unmasked == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n\n" \
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n\n"
    # the prompt part is exactly what the target is prefilled with at evaluation
    first = render_chat(tok, CONVERSATION[:1])
    assert tc.input_ids[: len(first)] == first and not any(tc.loss_mask[: len(first)])


def test_loss_mask_on_a_real_multiturn_conversation(tok):
    ds = load_conversations(["sharegpt"])
    row = next(r for r in ds.select(range(200)) if len(r["messages"]) >= 4)
    tc = tokenize_conversation(tok, row["messages"], max_length=10**7)
    assert masked_runs(tc, tok) == [m["content"] + END for m in row["messages"] if m["role"] == "assistant"]


def test_plain_format_without_chat_template(tok):
    plain = tiny_tokenizer()
    plain.chat_template = None
    assert render_messages(plain, CONVERSATION[:3], True) == render_chat(plain, CONVERSATION[:3])
    assert render_messages(tok, CONVERSATION[:3], True) == render_chat(tok, CONVERSATION[:3])
    tc = tokenize_conversation(plain, CONVERSATION, max_length=4096)
    # no end-of-turn token in the plain format: the text after "Assistant:" is the output
    assert masked_runs(tc, plain) == [" " + m["content"] for m in CONVERSATION if m["role"] == "assistant"]


def test_truncation(tok):
    full = tokenize_conversation(tok, CONVERSATION, max_length=4096)
    for n in (1, 30, 45, len(full.input_ids) - 1, len(full.input_ids), len(full.input_ids) + 5):
        cut = tokenize_conversation(tok, CONVERSATION, max_length=n)
        assert len(cut.input_ids) == min(n, len(full.input_ids))
        assert cut.input_ids == full.input_ids[:n] and cut.loss_mask == full.loss_mask[:n]


def test_template_that_rewrites_history_is_refused(tok):
    bad = tiny_tokenizer()
    # like Qwen3's template: only the last assistant turn carries a (thinking) prefix, so a later
    # user message rewrites the turn before it
    bad.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and loop.last %}[think]{% endif %}{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n[think]{% endif %}"
    )
    single = tokenize_conversation(bad, CONVERSATION[:2], max_length=4096)  # single turn: fine
    assert masked_runs(single, bad) == [CONVERSATION[1]["content"] + END]
    with pytest.raises(TemplateNotPrefixStable, match="not prefix-stable"):
        tokenize_conversation(bad, CONVERSATION, max_length=4096)
    assert issubclass(TemplateNotPrefixStable, UserError)


def test_tokenize_dataset_columns_and_cache(tok):
    ds = load_conversations(["gsm8k-train"]).select(range(40))
    td = tokenize_dataset(ds, tok, max_length=256)
    assert td.column_names == ["id", "input_ids", "loss_mask", "n_loss_tokens"]
    assert list(td["id"]) == list(ds["id"])
    for i in (0, 17, 39):
        expected = tokenize_conversation(tok, ds[i]["messages"], 256)
        row = td[i]
        assert row["input_ids"] == expected.input_ids and row["loss_mask"] == expected.loss_mask
        assert row["n_loss_tokens"] == expected.n_loss_tokens == sum(row["loss_mask"])
    assert td.cache_files and tokenize_dataset(ds, tok, max_length=256).cache_files == td.cache_files
    assert tokenize_dataset(ds, tok, max_length=128).cache_files != td.cache_files


# --------------------------------------------------------------------------- token budget


def test_budget_select(tok):
    td = tokenize_dataset(load_conversations(["mbpp-train"]), tok, max_length=512)
    budget = 20_000
    picked = budget_select(td, budget, seed=0)
    counts = list(picked["n_loss_tokens"])
    assert sum(counts) >= budget and sum(counts) - counts[-1] < budget  # the shortest prefix
    assert list(budget_select(td, budget, seed=0)["id"]) == list(picked["id"])  # deterministic
    assert list(budget_select(td, budget, seed=1)["id"]) != list(picked["id"])
    larger = list(budget_select(td, 2 * budget, seed=0)["id"])
    assert larger[: len(picked)] == list(picked["id"])  # a larger budget extends a smaller one
    with pytest.raises(UserError, match="lower the budget"):
        budget_select(td, sum(td["n_loss_tokens"]) + 1, seed=0)
    with pytest.raises(ValueError, match="tokenize_dataset"):
        budget_select(load_conversations(["mbpp-train"]), budget, seed=0)
