"""One synthetic result row for the tests of results, report and plots (each file sets its own numbers)."""

from __future__ import annotations

from specbench.results import SCHEMA_VERSION


def synthetic_row(prompt_id: str, turn: int, accepted: list[int], **overrides) -> dict:
    """A complete row of a run whose steps accepted ``accepted`` drafts (n_new = sum(accepted + 1))."""
    n_new = overrides.pop("n_new_tokens", sum(a + 1 for a in accepted))
    row = {
        "run_id": "run-1",
        "target": "tiny-llama",
        "drafter": "eagle3",
        "drafter_config": '{"depth":4}',
        "checkpoint_hash": None,
        "checkpoint_path": None,
        "task": "mt_bench",
        "category": "writing",
        "prompt_id": prompt_id,
        "turn": turn,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": 0,
        "max_new_tokens": 64,
        "device": "cpu",
        "dtype": "float32",
        "prompt_ids": [1, 2, 3, turn],
        "output_ids": list(range(100, 100 + n_new)),
        "n_new_tokens": n_new,
        "n_steps": len(accepted),
        "accepted_per_step": list(accepted),
        "tree_size_per_step": [5] * len(accepted),
        "tree_depth_per_step": [4] * len(accepted),
        "drafter_forwards_per_step": [4] * len(accepted),
        "prefill_s": 0.0,
        "decode_s": 1.0,
        "draft_s": 0.25,
        "verify_s": 0.5,
        "other_s": 0.25,
        "device_name": "Test CPU",
        "cpu_model": "Test CPU",
        "threads": 4,
        "torch_version": "2.13.0",
        "transformers_version": "5.24.0",
        "python_version": "3.11.7",
        "specbench_sha": "abc1234",
        "schema_version": SCHEMA_VERSION,
        "load_1min": 0.5,
        "margin_ulps_per_token": None,
        "runner_up_per_token": None,
    }
    row.update(overrides)
    return row
