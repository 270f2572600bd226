"""Turn a conversation into the token ids the target is prefilled with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PLAIN_ROLE_NAMES = {"user": "User", "assistant": "Assistant", "system": "System"}


def _as_id_list(out: Any) -> list[int]:
    """Normalise what ``apply_chat_template(tokenize=True)`` returns across transformers versions.

    Seen forms: a list of ints; a BatchEncoding / dict with ``input_ids`` (the 5.x default); a
    tensor or array; any of these batched with one row.
    """
    if isinstance(out, Mapping):  # BatchEncoding is a UserDict, hence a Mapping
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], (list, tuple)):
        if len(out) != 1:
            raise ValueError(f"expected one tokenized conversation, got a batch of {len(out)}")
        out = out[0]
    return [int(t) for t in out]


def plain_chat_text(messages: list[dict[str, str]]) -> str:
    """The fallback format for tokenizers without a chat template.

    One line per message, ``"<Role>: <content>"`` (roles ``User``, ``Assistant``, ``System``), then
    the generation prompt ``"Assistant:"``, without a trailing space so the model's first token
    carries its own leading space::

        User: What is 2+2?
        Assistant: 4
        User: And 3+3?
        Assistant:
    """
    lines = [f"{PLAIN_ROLE_NAMES.get(m['role'], m['role'].capitalize())}: {m['content']}" for m in messages]
    lines.append("Assistant:")
    return "\n".join(lines)


def render_chat(tokenizer: Any, messages: list[dict[str, str]], **template_kwargs: Any) -> list[int]:
    """Token ids of ``messages`` followed by the assistant generation prompt.

    ``messages`` is ``[{"role": "user" | "assistant", "content": str}, ...]``. With a chat template
    the tokenizer's own template renders it (``add_generation_prompt=True``; the template decides
    BOS, so no extra special tokens are added); ``template_kwargs`` go to the template, e.g.
    ``enable_thinking=False`` for Qwen3. Without one, :func:`plain_chat_text` is encoded with the
    tokenizer's default special tokens (a BOS where the tokenizer adds one).
    """
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
        )
        return _as_id_list(out)
    return _as_id_list(tokenizer.encode(plain_chat_text(messages), add_special_tokens=True))
