"""Drafter families. Each module registers itself through the ``specbench.drafters`` entry points."""
