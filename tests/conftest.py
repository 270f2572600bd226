"""Test-wide settings: the tiny models are dispatch-bound, so one thread is faster than two (and
keeps the suite steady on a busy 2-core machine)."""

import torch

torch.set_num_threads(1)
