"""The built-in tasks: where each one's vendored file lives and how a row becomes a Prompt.

Prompt wording follows the public benchmark code of the speculative-decoding papers, so that
acceptance lengths are comparable with theirs:

* humaneval, gsm8k, math500: exactly the templates of DFlash's ``benchmark.py`` (z-lab/dflash).
  EAGLE's HumanEval subset instead says "Complete the code I provided."; we follow DFlash because
  it covers all 164 problems.
* mbpp: the sanitized problem statement followed by its three test asserts, worded as in the MBPP
  paper ("Your code should pass these tests:"), without the paper's few-shot framing. This is a
  deliberate deviation from DFlash, which sends the bare statement: the asserts name the function
  and its signature, so the model writes the intended code instead of guessing an interface.
* mt-bench, spec-bench: the turns exactly as stored (Spec-Bench prompts are already worded as
  instructions: "Translate German to English: ...", "Summarize: ...").
* alpaca: the AlpacaEval ``instruction`` as is.

The data files are read from the package (``specbench/tasks/data``) and never from outside it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING

from specbench.tasks.base import Prompt, TaskInfo

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

HUMANEVAL_TEMPLATE = (
    "Write a solution to the following problem and make sure that it passes the tests:\n"
    "```python\n{prompt}\n```"
)
MBPP_TEMPLATE = "{prompt} Your code should pass these tests:\n\n{tests}"
BOXED_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

MBPP_TEST_IDS = range(11, 511)  # the test split of MBPP: task_id 11..510

MT_BENCH_CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)
# Spec-Bench's six families; its MT-Bench rows carry the eight MT-Bench categories, folded here.
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MATH500_CATEGORIES = (
    "algebra", "counting_and_probability", "geometry", "intermediate_algebra",
    "number_theory", "prealgebra", "precalculus",
)


def _data(relative: str) -> Traversable:
    return files("specbench.tasks").joinpath("data", *relative.split("/"))


def _jsonl(relative: str) -> Iterator[dict]:
    path = _data(relative)
    raw = path.read_bytes()
    if relative.endswith(".gz"):
        raw = gzip.decompress(raw)
    for line in raw.decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def _humaneval() -> list[Prompt]:
    return [
        Prompt(id=row["task_id"], turns=(HUMANEVAL_TEMPLATE.format(prompt=row["prompt"]),))
        for row in _jsonl("humaneval/HumanEval.jsonl.gz")
    ]


def _mbpp() -> list[Prompt]:
    rows = json.loads(_data("mbpp/sanitized-mbpp.json").read_text(encoding="utf-8"))
    rows = sorted((r for r in rows if r["task_id"] in MBPP_TEST_IDS), key=lambda r: r["task_id"])
    return [
        Prompt(
            id=f"mbpp/{row['task_id']}",
            turns=(MBPP_TEMPLATE.format(prompt=row["prompt"], tests="\n".join(row["test_list"])),),
        )
        for row in rows
    ]


def _math500() -> list[Prompt]:
    prompts = []
    for row in _jsonl("math500/test.jsonl"):
        # unique_id looks like "test/precalculus/807.json"
        _, subject, stem = row["unique_id"].split("/")
        prompts.append(
            Prompt(
                id=f"math500/{subject}/{stem.removesuffix('.json')}",
                turns=(BOXED_TEMPLATE.format(question=row["problem"]),),
                category=subject,
            )
        )
    return prompts


def _gsm8k() -> list[Prompt]:
    return [
        Prompt(id=f"gsm8k/{i}", turns=(BOXED_TEMPLATE.format(question=row["question"]),))
        for i, row in enumerate(_jsonl("gsm8k/test.jsonl"))
    ]


def _mt_bench() -> list[Prompt]:
    return [
        Prompt(id=f"mt_bench/{row['question_id']}", turns=tuple(row["turns"]), category=row["category"])
        for row in _jsonl("mt_bench/question.jsonl")
    ]


def _spec_bench() -> list[Prompt]:
    prompts = []
    for row in _jsonl("spec_bench/question.jsonl"):
        category = "mt_bench" if row["category"] in MT_BENCH_CATEGORIES else row["category"]
        prompts.append(
            Prompt(id=f"spec_bench/{row['question_id']}", turns=tuple(row["turns"]), category=category)
        )
    return prompts


def _alpaca() -> list[Prompt]:
    return [
        Prompt(id=f"alpaca/{i}", turns=(row["instruction"],))
        for i, row in enumerate(_jsonl("alpaca/alpaca_eval.jsonl"))
    ]


@dataclass(frozen=True)
class BuiltinTask:
    info: TaskInfo
    read: Callable[[], list[Prompt]]


BUILTIN: dict[str, BuiltinTask] = {
    task.info.name: task
    for task in (
        BuiltinTask(
            TaskInfo("humaneval", "HumanEval: 164 Python function-completion problems (code)", ()),
            _humaneval,
        ),
        BuiltinTask(
            TaskInfo("mbpp", "MBPP sanitized test split: 257 basic Python problems with tests (code)", ()),
            _mbpp,
        ),
        BuiltinTask(
            TaskInfo("math500", "MATH-500: 500 competition math problems, step-by-step (math)", MATH500_CATEGORIES),
            _math500,
        ),
        BuiltinTask(
            TaskInfo("gsm8k", "GSM8K test split: 1,319 grade-school word problems (math)", ()),
            _gsm8k,
        ),
        BuiltinTask(
            TaskInfo("mt-bench", "MT-Bench: 80 two-turn chat questions in 8 categories (chat)", MT_BENCH_CATEGORIES),
            _mt_bench,
        ),
        BuiltinTask(
            TaskInfo("spec-bench", "Spec-Bench: 480 prompts, 80 in each of 6 task families", SPEC_BENCH_CATEGORIES),
            _spec_bench,
        ),
        BuiltinTask(
            TaskInfo("alpaca", "AlpacaEval: 805 single-turn instructions (chat)", ()),
            _alpaca,
        ),
    )
}
