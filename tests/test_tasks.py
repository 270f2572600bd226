"""Tests of specbench.tasks: built-in task counts, categories, subsetting, task files, chat rendering."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from specbench.errors import UserError
from specbench.tasks import (
    TASKS,
    Prompt,
    load_task,
    load_task_file,
    plain_chat_text,
    render_chat,
    select,
    task_counts,
)

EXPECTED_COUNTS = {
    "humaneval": 164,
    "mbpp": 257,
    "math500": 500,
    "gsm8k": 1319,
    "mt-bench": 80,
    "spec-bench": 480,
    "alpaca": 805,
}

# --------------------------------------------------------------------------- built-in tasks


def test_registry_names():
    assert list(TASKS) == list(EXPECTED_COUNTS)
    for name, info in TASKS.items():
        assert info.name == name and info.description


@pytest.mark.parametrize("name", list(EXPECTED_COUNTS))
def test_task_counts_and_shape(name):
    prompts = load_task(name)
    assert len(prompts) == EXPECTED_COUNTS[name]
    assert len({p.id for p in prompts}) == len(prompts)  # ids are unique
    for p in prompts:
        assert isinstance(p, Prompt)
        assert p.turns and all(isinstance(t, str) and t.strip() for t in p.turns)
        assert len(p.turns) == (2 if name == "mt-bench" or p.category == "mt_bench" else 1)
        if TASKS[name].categories:
            assert p.category in TASKS[name].categories


def test_task_counts_listing():
    assert [(n, c) for n, c, _ in task_counts()] == list(EXPECTED_COUNTS.items())


def test_ids_and_formats():
    he = load_task("humaneval")
    assert he[0].id == "HumanEval/0" and he[-1].id == "HumanEval/163"
    assert he[0].turns[0].startswith(
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
    )
    assert he[0].turns[0].endswith("\n```")

    mbpp = load_task("mbpp")
    ids = [int(p.id.split("/")[1]) for p in mbpp]
    assert ids == sorted(ids) and ids[0] >= 11 and ids[-1] <= 510
    assert "Your code should pass these tests:\n\nassert " in mbpp[0].turns[0]

    boxed = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    for name in ("math500", "gsm8k"):
        assert all(p.turns[0].endswith(boxed) for p in load_task(name))
    assert load_task("math500")[0].id == "math500/precalculus/807"

    mt = load_task("mt-bench")
    assert mt[0].id == "mt_bench/81" and mt[-1].id == "mt_bench/160"
    assert load_task("spec-bench")[0].id == "spec_bench/81"
    assert load_task("alpaca")[0].id == "alpaca/0"


def test_spec_bench_categories():
    prompts = load_task("spec-bench")
    assert TASKS["spec-bench"].categories == (
        "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag",
    )
    assert Counter(p.category for p in prompts) == {c: 80 for c in TASKS["spec-bench"].categories}
    for category in TASKS["spec-bench"].categories:
        subset = load_task("spec-bench", category=category)
        assert len(subset) == 80 and {p.category for p in subset} == {category}
    # Spec-Bench's conversation family is MT-Bench itself
    assert [p.turns for p in load_task("spec-bench", "mt_bench")] == [p.turns for p in load_task("mt-bench")]
    assert load_task("spec-bench", "translation")[0].turns[0].startswith("Translate German to English:")


def test_mt_bench_and_math500_categories():
    assert Counter(p.category for p in load_task("mt-bench")) == {c: 10 for c in TASKS["mt-bench"].categories}
    assert len(load_task("mt-bench", "coding")) == 10
    assert sum(len(load_task("math500", c)) for c in TASKS["math500"].categories) == 500


def test_load_task_errors():
    with pytest.raises(UserError, match=r"unknown task 'nope'.*humaneval, mbpp.*alpaca"):
        load_task("nope")
    with pytest.raises(UserError, match=r"unknown category 'chat'.*mt_bench, translation"):
        load_task("spec-bench", category="chat")
    with pytest.raises(UserError, match=r"'gsm8k' has no categories; drop --category"):
        load_task("gsm8k", category="math")


def test_loaded_list_is_a_copy():
    first = load_task("humaneval")
    first.clear()
    assert len(load_task("humaneval")) == 164


# --------------------------------------------------------------------------- select


def test_select_deterministic_ordered_subset():
    prompts = load_task("gsm8k")
    a = select(prompts, 50, seed=0)
    assert len(a) == 50 and len({p.id for p in a}) == 50
    assert a == select(prompts, 50, seed=0)
    assert a != select(prompts, 50, seed=1)
    positions = [prompts.index(p) for p in a]
    assert positions == sorted(positions)  # original order kept
    # the documented recipe, so a subset can be reproduced outside specbench
    import random

    assert positions == sorted(random.Random(0).sample(range(len(prompts)), 50))


def test_select_all_and_errors():
    prompts = load_task("mt-bench")
    assert select(prompts, None, seed=3) == prompts
    assert select(prompts, 80, seed=3) == prompts
    assert select(prompts, 1000, seed=3) == prompts
    for bad in (0, -2):
        with pytest.raises(UserError, match="--limit must be a positive"):
            select(prompts, bad, seed=0)


# --------------------------------------------------------------------------- task files


def _write(tmp_path, text: str | bytes, name: str = "tasks.jsonl"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_task_file_good(tmp_path):
    lines = [
        {"id": "a", "prompt": "Say hi."},
        {"id": 7, "turns": ["First?", "Second?"], "category": "chat", "extra": 1},
    ]
    text = "\n".join(json.dumps(x) for x in lines[:1]) + "\n\n  \n" + json.dumps(lines[1]) + "\n"
    prompts = load_task_file(_write(tmp_path, text))
    assert prompts == [
        Prompt(id="a", turns=("Say hi.",)),
        Prompt(id="7", turns=("First?", "Second?"), category="chat"),
    ]
    assert load_task_file(str(tmp_path / "tasks.jsonl")) == prompts  # str paths work too


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": \n', r"line 2 is not valid JSON"),
        ('["id", "prompt"]\n', r"line 1 is a JSON array, not an object"),
        ('{"prompt": "x"}\n', r'line 1 has no "id"'),
        ('{"id": "", "prompt": "x"}\n', r'"id" must be a non-empty string'),
        ('{"id": "a"}\n', r'line 1 has neither "prompt" nor "turns"'),
        ('{"id": "a", "prompt": "x", "turns": ["y"]}\n', r'line 1 has both "prompt" and "turns"'),
        ('{"id": "a", "prompt": ["x"]}\n', r'"prompt" must be a non-empty string'),
        ('{"id": "a", "turns": []}\n', r'"turns" must be a non-empty list of non-empty strings'),
        ('{"id": "a", "turns": "x"}\n', r'"turns" must be a non-empty list'),
        ('{"id": "a", "turns": ["x", 3]}\n', r'"turns" must be a non-empty list'),
        ('{"id": "a", "prompt": "x", "category": 3}\n', r'"category" must be a string'),
        ('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n{"id": "a", "prompt": "z"}\n',
         r"line 3 repeats id 'a' already used on line 1"),
        ("", r"has no prompts"),
        ("\n  \n", r"has no prompts"),
        (b'{"id": "a", "prompt": "\xff"}\n', r"is not UTF-8"),
    ],
)
def test_task_file_bad(tmp_path, text, pattern):
    with pytest.raises(UserError, match=pattern) as info:
        load_task_file(_write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message and "tasks.jsonl" in message  # one line, names the file


def test_task_file_missing_or_directory(tmp_path):
    with pytest.raises(UserError, match=r"task file not found: .*missing\.jsonl; pass the path"):
        load_task_file(tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match=r"is a directory"):
        load_task_file(tmp_path)


# --------------------------------------------------------------------------- render_chat

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _tiny_tokenizer(chat_template: str | None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>",
             "User", "Assistant", ":", "hi", "there", "how", "are", "you", "?", "fine"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|end|>"],
    )
    tok.chat_template = chat_template
    return tok, {w: i for i, w in enumerate(words)}


MESSAGES = [
    {"role": "user", "content": "hi there"},
    {"role": "assistant", "content": "fine"},
    {"role": "user", "content": "how are you ?"},
]


def test_render_chat_with_template():
    tok, v = _tiny_tokenizer(TEMPLATE)
    ids = render_chat(tok, MESSAGES)
    assert type(ids) is list and all(type(i) is int for i in ids)
    expected = [v[w] for w in "<s> <|user|> hi there <|end|> <|assistant|> fine <|end|> "
                "<|user|> how are you ? <|end|> <|assistant|>".split()]
    assert ids == expected  # one BOS (from the template), ends with the generation prompt
    assert render_chat(tok, MESSAGES[:1]) == expected[:5] + [v["<|assistant|>"]]


def test_render_chat_without_template():
    tok, v = _tiny_tokenizer(None)
    text = plain_chat_text(MESSAGES)
    assert text == "User: hi there\nAssistant: fine\nUser: how are you ?\nAssistant:"
    ids = render_chat(tok, MESSAGES)
    assert ids == tok.encode(text, add_special_tokens=True)
    assert ids[-2:] == [v["Assistant"], v[":"]]


@pytest.mark.parametrize(
    "returned",
    [
        [1, 2, 3],
        {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]},
        torch.tensor([[1, 2, 3]]),
        [[1, 2, 3]],
    ],
)
def test_render_chat_normalises_return_types(returned):
    class FakeTokenizer:
        chat_template = "x"

        def apply_chat_template(self, messages, **kwargs):
            assert kwargs["add_generation_prompt"] and kwargs["tokenize"]
            assert kwargs.get("enable_thinking") is False  # template kwargs are passed through
            return returned

    assert render_chat(FakeTokenizer(), MESSAGES, enable_thinking=False) == [1, 2, 3]
