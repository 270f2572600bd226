"""Training conversations for learned drafters: the vendored sets, a stable held-out split,
chat-template tokenization with an assistant-only loss mask, and selection by token budget.

Every drafter trains on the same data through these functions, so the comparison stays fair:

1. :func:`load_conversations` reads built-in sets (``TRAIN_SETS``) into one ``datasets.Dataset``
   with columns ``id`` (``"<set>/<key>"``, unique across sets) and ``messages``
   (``[{"role": "user" | "assistant", "content": str}, ...]``; user first, alternating, assistant
   last).
2. :func:`split_holdout` sets aside a held-out part by a hash of each id, so a conversation stays on
   its side when sets are added or removed.
3. :func:`tokenize_dataset` renders each conversation with the target's chat template
   (:func:`tokenize_conversation`) into ``input_ids`` and a ``loss_mask`` that is 1 exactly on
   assistant content and the end-of-turn token after it.
4. :func:`budget_select` takes the same number of loss tokens for every drafter.

The data files are read from the package (``specbench/train/data/<set>/conversations.jsonl.gz``,
provenance and transformations in each folder's ``SOURCE.md``), never from outside it. The
``datasets`` cache (Arrow files of the loaded sets and of tokenization results) lives under
``specbench.fetch.cache_root() / "datasets"``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import as_file, files
from typing import TYPE_CHECKING, Any

from specbench.errors import UserError
from specbench.tasks.chat import PLAIN_ROLE_NAMES, _as_id_list

if TYPE_CHECKING:
    from datasets import Dataset, Features

DATA_FILE = "conversations.jsonl.gz"
ROLES = ("user", "assistant")

# Bump when the output of tokenize_conversation changes for the same inputs: it is part of the
# fingerprint under which `datasets` caches tokenized sets.
TOKENIZATION_VERSION = 1

# Special tokens that end an assistant turn in common chat templates (ChatML, Llama 3, Gemma,
# Phi-3, Llama 2). Those that are added (special) tokens of a tokenizer, plus its eos token, are the
# default end-of-turn tokens of the loss mask.
KNOWN_END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "<|end_of_text|>", "</s>",
)


@dataclass(frozen=True)
class TrainSetInfo:
    """A built-in training set."""

    name: str
    description: str
    n_conversations: int
    licence: str


TRAIN_SETS: dict[str, TrainSetInfo] = {
    info.name: info
    for info in (
        TrainSetInfo(
            "sharegpt",
            "ShareGPT V3 (first 2,000 records, cleaned): multi-turn ChatGPT chats (chat)",
            1954,
            "unclear (user-shared ChatGPT output; research use inside this project only)",
        ),
        TrainSetInfo(
            "gpteacher-codegen",
            "GPTeacher Codegen: coding instructions with GPT-4 answers (code)",
            4535,
            "MIT (GPT-4 output, OpenAI terms apply)",
        ),
        TrainSetInfo(
            "gpteacher-roleplay",
            "GPTeacher Roleplay: role-play and chat instructions with GPT-4 answers (chat)",
            1923,
            "MIT (GPT-4 output, OpenAI terms apply)",
        ),
        TrainSetInfo(
            "gsm8k-train",
            "GSM8K train split: word problems with worked solutions, annotations removed (math)",
            7473,
            "MIT",
        ),
        TrainSetInfo(
            "mbpp-train",
            "MBPP train split (task_id 601-974): Python problems with tests -> reference code (code)",
            374,
            "CC BY 4.0",
        ),
    )
}


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def conversation_features() -> Features:
    """The schema of :func:`load_conversations`: ``id`` and ``messages`` (role, content)."""
    from datasets import Features, List, Value

    return Features(
        {"id": Value("string"), "messages": List({"role": Value("string"), "content": Value("string")})}
    )


def _datasets_cache_dir() -> str:
    from specbench.fetch import cache_root

    return str(cache_root() / "datasets")


def _load_one(name: str) -> Dataset:
    from datasets import load_dataset

    resource = files("specbench.train").joinpath("data", name, DATA_FILE)
    with as_file(resource) as path:
        ds = load_dataset(
            "json",
            data_files=str(path),
            split="train",
            features=conversation_features(),
            cache_dir=_datasets_cache_dir(),
        )
    expected = TRAIN_SETS[name].n_conversations
    if len(ds) != expected:  # a damaged install, not a user mistake
        raise RuntimeError(
            f"training set {name!r} has {len(ds)} conversations, expected {expected}; reinstall specbench"
        )
    return ds


def load_conversations(names: Sequence[str]) -> Dataset:
    """The conversations of the built-in training sets ``names``, one after another in that order.

    Columns ``id`` (``"<set>/<key>"``) and ``messages``. Unknown or repeated names raise
    :class:`~specbench.errors.UserError`.
    """
    from datasets import concatenate_datasets

    if isinstance(names, str):
        names = [names]
    valid = ", ".join(TRAIN_SETS)
    if not names:
        raise UserError(f"no training set given; choose one or more of: {valid}")
    unknown = [n for n in names if n not in TRAIN_SETS]
    if unknown:
        raise UserError(f"unknown training set {', '.join(map(repr, unknown))}; choose one or more of: {valid}")
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise UserError(f"training set {', '.join(map(repr, repeated))} given more than once")
    parts = [_load_one(n) for n in names]
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


# ----------------------------------------------------------------------------------------------
# Held-out split and budget selection: both order conversations by a hash of their id
# ----------------------------------------------------------------------------------------------


def _unit_hash(purpose: str, seed: int, key: str) -> float:
    """A number in [0, 1) that depends only on (purpose, seed, key), on every machine."""
    digest = hashlib.sha256(f"{purpose}\0{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _column(ds: Dataset, name: str) -> list:
    """One column as a Python list, whatever the format of ``ds`` (row-by-row iteration is slow)."""
    return ds.select_columns([name]).to_dict()[name]


@dataclass(frozen=True)
class HoldoutSplit:
    """The two sides of :func:`split_holdout`, each in the input order."""

    train: Dataset
    heldout: Dataset


def split_holdout(ds: Dataset, holdout_fraction: float = 0.02, seed: int = 0) -> HoldoutSplit:
    """Split ``ds`` into train and held-out conversations by a hash of each ``id``.

    A conversation is held out when ``sha256("holdout", seed, id)`` maps below
    ``holdout_fraction``. The decision depends on nothing but its own id and the seed, so the split
    is the same on every machine and a conversation never changes side when other sets are added.
    The held-out share is about ``holdout_fraction``, not exactly.
    """
    if not 0.0 <= holdout_fraction < 1.0:
        raise UserError(f"holdout fraction must be in [0, 1), got {holdout_fraction}")
    train_rows: list[int] = []
    heldout_rows: list[int] = []
    for row, key in enumerate(_column(ds, "id")):
        side = heldout_rows if _unit_hash("holdout", seed, key) < holdout_fraction else train_rows
        side.append(row)
    return HoldoutSplit(train=ds.select(train_rows), heldout=ds.select(heldout_rows))


def budget_select(ds: Dataset, budget_tokens: int, seed: int = 0) -> Dataset:
    """The shortest prefix of a seeded shuffle of ``ds`` with at least ``budget_tokens`` loss tokens.

    ``ds`` comes from :func:`tokenize_dataset` (columns ``id`` and ``n_loss_tokens``). The shuffle
    orders conversations by ``sha256("budget", seed, id)``, so the result is deterministic, a larger
    budget extends a smaller one, and adding sets only interleaves new conversations. Rows without
    loss tokens are skipped. The total overshoots the budget by less than one conversation. A budget
    larger than what ``ds`` holds raises :class:`~specbench.errors.UserError`.
    """
    missing = {"id", "n_loss_tokens"} - set(ds.column_names)
    if missing:
        raise ValueError(f"budget_select needs a tokenized dataset (see tokenize_dataset); missing {sorted(missing)}")
    if budget_tokens <= 0:
        raise UserError(f"the token budget must be positive, got {budget_tokens}")
    keys = _column(ds, "id")
    counts = [int(n) for n in _column(ds, "n_loss_tokens")]
    order = sorted(range(len(keys)), key=lambda row: (_unit_hash("budget", seed, keys[row]), row))
    chosen: list[int] = []
    total = 0
    for row in order:
        if total >= budget_tokens:
            break
        if counts[row] > 0:
            chosen.append(row)
            total += counts[row]
    if total < budget_tokens:
        raise UserError(
            f"token budget {budget_tokens:,} is more than the {total:,} loss tokens of the selected training "
            "data; lower the budget or add training sets"
        )
    return ds.select(chosen)


# ----------------------------------------------------------------------------------------------
# Tokenization
# ----------------------------------------------------------------------------------------------


class TemplateNotPrefixStable(UserError):
    """The chat template rewrites earlier text when a message is added, so turns cannot be told apart."""


@dataclass(frozen=True)
class TokenizedConversation:
    """One conversation rendered with the target's chat template."""

    input_ids: list[int]  # [T] token ids, T <= max_length
    loss_mask: list[int]  # [T] 1 on assistant content and the end-of-turn token after it, else 0

    @property
    def n_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def default_end_token_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's eos token(s) plus those :data:`KNOWN_END_OF_TURN_TOKENS` that are added tokens."""
    ends: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ends.add(eos)
    elif isinstance(eos, (list, tuple)):
        ends.update(int(e) for e in eos)
    # only added (special) tokens: "</s>" can be an ordinary text token (it is in Qwen2.5's vocab)
    added = tokenizer.get_added_vocab()
    ends.update(added[t] for t in KNOWN_END_OF_TURN_TOKENS if t in added)
    return frozenset(ends)


def render_messages(
    tokenizer: Any, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool, **template_kwargs: Any
) -> list[int]:
    """Token ids of ``messages``, with or without the assistant generation prompt.

    The same rendering as :func:`specbench.tasks.render_chat` (which always adds the generation
    prompt): the tokenizer's chat template when it has one, else the plain ``"Role: content"``
    lines of :func:`specbench.tasks.plain_chat_text`, encoded with the default special tokens.
    """
    messages = [dict(m) for m in messages]
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False,
            **template_kwargs,
        )
        return _as_id_list(out)
    lines = [f"{PLAIN_ROLE_NAMES.get(m['role'], m['role'].capitalize())}: {m['content']}" for m in messages]
    if add_generation_prompt:
        lines.append("Assistant:")
    return _as_id_list(tokenizer.encode("\n".join(lines), add_special_tokens=True))


def _check_messages(messages: Sequence[Mapping[str, str]]) -> None:
    if not messages:
        raise ValueError("a conversation needs at least one message")
    for i, m in enumerate(messages):
        ok = isinstance(m, Mapping) and isinstance(m.get("content"), str) and m.get("role") in (*ROLES, "system")
        if not ok:
            raise ValueError(f"message {i} must be {{'role': 'user' | 'assistant' | 'system', 'content': str}}: {m!r}")


def _not_prefix_stable(k: int, role: str, before: list[int], after: list[int]) -> TemplateNotPrefixStable:
    at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    return TemplateNotPrefixStable(
        f"the target's chat template is not prefix-stable: adding message {k} ({role}) changes the tokens "
        f"rendered for the messages before it (first difference at token {at}). The assistant-only loss mask "
        "needs a template that only appends text when a message is added; templates that rewrite earlier "
        "turns (for example ones that drop <think> blocks from earlier assistant turns) work only on "
        "single-turn conversations"
    )


def tokenize_conversation(
    tokenizer: Any,
    messages: Sequence[Mapping[str, str]],
    max_length: int,
    *,
    end_token_ids: Collection[int] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> TokenizedConversation:
    """Render ``messages`` with the chat template and mark the tokens the drafter is trained on.

    The conversation is rendered one message at a time and the token lists are diffed: for an
    assistant message ``k``, ``render(messages[:k], generation prompt)`` is the prompt the target
    saw, and what ``render(messages[:k+1])`` adds after it is the assistant's output: its content
    and the template's closing tokens. The loss mask is 1 on that output up to and including its
    last end-of-turn token (``end_token_ids``, default :func:`default_end_token_ids`), and 0 on what
    the template puts after it (ChatML's newline) and everywhere else. Without an end-of-turn token
    in the output (the plain format), the whole output is marked.

    Every rendering must extend the previous one token for token; a template that rewrites earlier
    turns raises :class:`TemplateNotPrefixStable`. The result is cut to the first ``max_length``
    tokens. ``template_kwargs`` go to the template (e.g. ``enable_thinking=False``).
    """
    if max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    _check_messages(messages)
    ends = default_end_token_ids(tokenizer) if end_token_ids is None else frozenset(end_token_ids)
    kwargs = dict(template_kwargs or {})
    input_ids: list[int] = []
    loss_mask: list[int] = []

    def new_tokens(k: int, rendered: list[int]) -> list[int]:
        if rendered[: len(input_ids)] != input_ids:
            raise _not_prefix_stable(k, messages[k]["role"], input_ids, rendered)
        return rendered[len(input_ids):]

    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            prompt = new_tokens(k, render_messages(tokenizer, messages[:k], True, **kwargs))
            input_ids += prompt
            loss_mask += [0] * len(prompt)
            output = new_tokens(k, render_messages(tokenizer, messages[: k + 1], False, **kwargs))
            end = next((i + 1 for i in range(len(output) - 1, -1, -1) if output[i] in ends), len(output))
            input_ids += output
            loss_mask += [1] * end + [0] * (len(output) - end)
        else:
            added = new_tokens(k, render_messages(tokenizer, messages[: k + 1], False, **kwargs))
            input_ids += added
            loss_mask += [0] * len(added)
        if len(input_ids) >= max_length:  # later messages would be cut anyway
            break
    return TokenizedConversation(input_ids=input_ids[:max_length], loss_mask=loss_mask[:max_length])


def tokenized_features() -> Features:
    """The schema of :func:`tokenize_dataset`."""
    from datasets import Features, List, Value

    return Features(
        {
            "id": Value("string"),
            "input_ids": List(Value("int32")),
            "loss_mask": List(Value("int8")),
            "n_loss_tokens": Value("int32"),
        }
    )


def tokenizer_digest(tokenizer: Any) -> str:
    """A sha256 of everything about ``tokenizer`` that changes its token ids or chat rendering."""
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    h.update(str(getattr(tokenizer, "chat_template", None)).encode())
    h.update(json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str).encode())
    for attr in ("add_bos_token", "add_eos_token"):
        h.update(f"{attr}={getattr(tokenizer, attr, None)}".encode())
    return h.hexdigest()


def _tokenize_batch(
    batch: dict[str, list],
    tokenizer: Any,
    max_length: int,
    end_token_ids: frozenset[int],
    template_kwargs: dict[str, Any],
) -> dict[str, list]:
    out: dict[str, list] = {"id": [], "input_ids": [], "loss_mask": [], "n_loss_tokens": []}
    for key, messages in zip(batch["id"], batch["messages"]):
        try:
            tc = tokenize_conversation(
                tokenizer, messages, max_length, end_token_ids=end_token_ids, template_kwargs=template_kwargs
            )
        except TemplateNotPrefixStable as exc:
            raise TemplateNotPrefixStable(f"conversation {key}: {exc}") from None
        out["id"].append(key)
        out["input_ids"].append(tc.input_ids)
        out["loss_mask"].append(tc.loss_mask)
        out["n_loss_tokens"].append(tc.n_loss_tokens)
    return out


def tokenize_dataset(
    ds: Dataset,
    tokenizer: Any,
    max_length: int,
    num_proc: int = 1,
    *,
    end_token_ids: Collection[int] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Dataset:
    """:func:`tokenize_conversation` over every row of ``ds`` (columns ``id``, ``messages``).

    Returns columns ``id``, ``input_ids``, ``loss_mask`` and ``n_loss_tokens``, in the input order.
    The ``datasets`` fingerprint of the result combines the input's fingerprint, a digest of the
    tokenizer (:func:`tokenizer_digest`), ``max_length``, the end-of-turn ids, the template
    arguments and :data:`TOKENIZATION_VERSION`, so a repeated call on a cached set reuses the
    Arrow file written the first time.
    """
    if max_length < 1:
        raise UserError(f"max length must be a positive number of tokens, got {max_length}")
    ends = default_end_token_ids(tokenizer) if end_token_ids is None else frozenset(int(t) for t in end_token_ids)
    kwargs = dict(template_kwargs or {})
    recipe = json.dumps(
        {
            "input": ds._fingerprint,
            "tokenizer": tokenizer_digest(tokenizer),
            "max_length": max_length,
            "end_token_ids": sorted(ends),
            "template_kwargs": kwargs,
            "version": TOKENIZATION_VERSION,
        },
        sort_keys=True,
        default=str,
    )
    fingerprint = hashlib.sha256(recipe.encode()).hexdigest()[:32]
    return ds.map(
        _tokenize_batch,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, "max_length": max_length, "end_token_ids": ends, "template_kwargs": kwargs},
        remove_columns=ds.column_names,
        features=tokenized_features(),
        num_proc=num_proc if num_proc > 1 else None,
        new_fingerprint=fingerprint,
        desc="tokenizing conversations",
    )
