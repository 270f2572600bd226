"""Custom prompt files (``--task-file``).

Format: JSONL (UTF-8), one JSON object per line; blank lines are skipped. Each object has

* ``id``: a unique non-empty string (an integer is accepted and turned into a string), and
* exactly one of ``prompt`` (a non-empty string: one user turn) or ``turns`` (a non-empty list
  of non-empty strings: the user turns of a multi-turn conversation, asked in order),
* optionally ``category`` (a string). Other keys are ignored.

Example::

    {"id": "greet", "prompt": "Say hello in French."}
    {"id": "chat-1", "turns": ["Name a prime.", "Now a bigger one."], "category": "math"}

Every problem raises a one-line :class:`~specbench.drafter.UserError` naming the file, the line
and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbench.errors import UserError
from specbench.tasks.base import Prompt

EXAMPLE = '{"id": "q1", "prompt": "Hello"}'


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _read_text(path: Path) -> str:
    if not path.exists():
        raise UserError(f"task file not found: {path}; pass the path of an existing JSONL file to --task-file")
    if path.is_dir():
        raise UserError(f"task file {path} is a directory; pass a JSONL file to --task-file")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"task file {path} is not UTF-8 text; save it as UTF-8 JSONL") from None
    except OSError as e:
        raise UserError(f"cannot read task file {path} ({e.strerror}); check the path and its permissions") from None


def _parse_line(obj: Any, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise UserError(f"{where} is a JSON {_json_type(obj)}, not an object; write one object per line, e.g. {EXAMPLE}")

    if "id" not in obj:
        raise UserError(f'{where} has no "id"; give every object a unique id, e.g. {EXAMPLE}')
    raw_id = obj["id"]
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or raw_id == "":
        raise UserError(f'{where}: "id" must be a non-empty string or an integer, not {json.dumps(raw_id)}')

    has_prompt, has_turns = "prompt" in obj, "turns" in obj
    if has_prompt and has_turns:
        raise UserError(f'{where} has both "prompt" and "turns"; keep exactly one of them')
    if not has_prompt and not has_turns:
        raise UserError(
            f'{where} has neither "prompt" nor "turns"; add "prompt": "<text>" or "turns": ["<turn 1>", ...]'
        )
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise UserError(f'{where}: "prompt" must be a non-empty string, not a JSON {_json_type(prompt)}')
        turns: tuple[str, ...] = (prompt,)
    else:
        raw_turns = obj["turns"]
        if (
            not isinstance(raw_turns, list)
            or not raw_turns
            or not all(isinstance(t, str) and t for t in raw_turns)
        ):
            raise UserError(f'{where}: "turns" must be a non-empty list of non-empty strings, e.g. ["Hi", "And then?"]')
        turns = tuple(raw_turns)

    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise UserError(f'{where}: "category" must be a string, not a JSON {_json_type(category)}')
    return Prompt(id=str(raw_id), turns=turns, category=category)


def load_task_file(path: str | Path) -> list[Prompt]:
    """Read a custom JSONL prompt file (format in the module docstring)."""
    path = Path(path)
    prompts: list[Prompt] = []
    first_line_of: dict[str, int] = {}
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"task file {path} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where} is not valid JSON ({e.msg}); write one JSON object per line, e.g. {EXAMPLE}") from None
        prompt = _parse_line(obj, where)
        if prompt.id in first_line_of:
            raise UserError(
                f"{where} repeats id {prompt.id!r} already used on line {first_line_of[prompt.id]}; ids must be unique"
            )
        first_line_of[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise UserError(f"task file {path} has no prompts; write one JSON object per line, e.g. {EXAMPLE}")
    return prompts
