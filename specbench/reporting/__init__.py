"""One report a person opens, from result files: `specbench report` (see :mod:`specbench.reporting.page`)."""

from specbench.reporting.page import Written, write_report

__all__ = ["Written", "write_report"]
