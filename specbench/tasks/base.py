"""The two value types of the task package: a prompt and a task's description."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One benchmark item: the user messages of a conversation, asked in order.

    A multi-turn prompt (MT-Bench) is run the way the speculative-decoding papers run it: the
    model answers turn 1, its answer is appended as the assistant message, then turn 2 is asked.
    """

    id: str  # stable id, e.g. "HumanEval/0", "mt_bench/81"
    turns: tuple[str, ...]  # user messages; 2 for MT-Bench rows, 1 otherwise
    category: str | None = None


@dataclass(frozen=True)
class TaskInfo:
    name: str
    description: str
    categories: tuple[str, ...]  # () when the task has none
