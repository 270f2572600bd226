"""Invoking the CLI in-process, and the one-line user-error check shared by the CLI tests."""

from __future__ import annotations

from typer.testing import CliRunner

from specbench import cli


def invoke(*args):
    return CliRunner().invoke(cli.app, [str(a) for a in args])


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]
