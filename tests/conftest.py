"""Test-wide settings: the tiny models are dispatch-bound, so one thread is faster than two (about
4x on a busy 2-core machine) and keeps the suite steady."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def wide_console():
    """A wide stdout console, so the CLI's end-of-run table is never truncated in captured output."""
    from specbench import cli

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.out_console, "_width", 220)
        yield
