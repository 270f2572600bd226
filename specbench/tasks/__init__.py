"""Evaluation tasks: the built-in prompt sets, custom prompt files, subsetting and chat rendering.

Built-in tasks (data vendored under ``specbench/tasks/data``, provenance in each ``SOURCE.md``):

=========== ======= ====================================================================
name        prompts categories
=========== ======= ====================================================================
humaneval   164     -
mbpp        257     - (sanitized test split, task_id 11..510)
math500     500     the 7 MATH subjects
gsm8k       1319    -
mt-bench    80      the 8 MT-Bench categories; every prompt has 2 turns
spec-bench  480     mt_bench, translation, summarization, qa, math_reasoning, rag (80 each)
alpaca      805     -
=========== ======= ====================================================================

Prompt wording is documented in :mod:`specbench.tasks.builtin`; the custom file format in
:mod:`specbench.tasks.taskfile`.
"""

from __future__ import annotations

import random
from functools import lru_cache

from specbench.errors import UserError
from specbench.tasks.base import Prompt, TaskInfo
from specbench.tasks.builtin import BUILTIN
from specbench.tasks.chat import plain_chat_text, render_chat
from specbench.tasks.taskfile import load_task_file

__all__ = [
    "Prompt",
    "TaskInfo",
    "TASKS",
    "load_task",
    "load_task_file",
    "select",
    "task_counts",
    "render_chat",
    "plain_chat_text",
]

TASKS: dict[str, TaskInfo] = {name: task.info for name, task in BUILTIN.items()}


@lru_cache(maxsize=None)
def _all_prompts(name: str) -> tuple[Prompt, ...]:
    return tuple(BUILTIN[name].read())


def load_task(name: str, category: str | None = None) -> list[Prompt]:
    """The prompts of built-in task ``name`` in file order, optionally only one ``category``."""
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)} (or pass --task-file)")
    info = TASKS[name]
    prompts = list(_all_prompts(name))
    if category is None:
        return prompts
    if not info.categories:
        raise UserError(f"task {name!r} has no categories; drop --category")
    if category not in info.categories:
        raise UserError(
            f"unknown category {category!r} for task {name!r}; choose one of: {', '.join(info.categories)}"
        )
    return [p for p in prompts if p.category == category]


def select(prompts: list[Prompt], limit: int | None, seed: int) -> list[Prompt]:
    """A deterministic subset of ``limit`` prompts, kept in their original order.

    The chosen positions are ``random.Random(seed).sample(range(len(prompts)), limit)``, so the
    same (prompts, limit, seed) always gives the same subset, on any machine. ``limit=None`` or a
    limit of at least ``len(prompts)`` returns every prompt.
    """
    if limit is None:
        return list(prompts)
    if limit <= 0:
        raise UserError(f"--limit must be a positive number of prompts, got {limit}; omit it to run all prompts")
    if limit >= len(prompts):
        return list(prompts)
    chosen = sorted(random.Random(seed).sample(range(len(prompts)), limit))
    return [prompts[i] for i in chosen]


def task_counts() -> list[tuple[str, int, str]]:
    """``(name, number of prompts, description)`` of every built-in task, for ``specbench tasks``."""
    return [(name, len(_all_prompts(name)), info.description) for name, info in TASKS.items()]
