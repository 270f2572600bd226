"""Files a command writes besides its results (a markdown report and the JSON beside it).

Each is checked before the work starts, so a wrong ``--out`` costs one line, not a finished replay, and is
written whole or not at all (a temporary file in the same folder, then ``os.replace``), so an interrupted
write never leaves a damaged report where a good one stood. Result parquet files have their own writer,
:class:`specbench.results.RunWriter`, which shares :func:`check_folder`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specbench.errors import UserError


def check_folder(folder: Path, flag: str, what: str = "files") -> None:
    """Create ``folder`` (and its parents) and write a probe file in it; a one-line :class:`UserError` naming
    ``flag`` (the option the user can change) when either fails."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".specbench-probe-"):
            pass
    except OSError as e:
        raise UserError(f"cannot write {what} to folder {folder} ({e.strerror or e}); choose another {flag}") from None


def check_out_file(path: Path, flag: str = "--out") -> None:
    """``path`` can be written as the markdown report: not a folder, not the ``.json`` that goes beside it,
    and its folder can be created and written to."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder; name a file, e.g. {flag} {path / 'report.md'}")
    if path.suffix == ".json":
        raise UserError(f"{flag} names the markdown report and its JSON goes beside it, so it cannot end in .json; "
                        f"e.g. {flag} {path.with_suffix('.md')}")
    check_folder(path.parent, flag, "a report")


def file_mode(path: Path) -> int:
    """The permissions ``path`` has, or a new file would get (0666 less the umask): what a replacement keeps,
    since ``mkstemp`` makes its files 0600."""
    try:
        return Path(path).stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) so a reader sees the old file or the new one, never a part; the file
    keeps its permissions (a new one gets the usual ones)."""
    path = Path(path)
    mode = file_mode(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # closes fd whatever happens next
            os.fchmod(f.fileno(), mode)
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(out: Path, markdown: str, data: dict) -> None:
    """A command's report: the markdown at ``out`` and ``data`` as JSON beside it (``out`` with ``.json``), each whole."""
    import json

    out = Path(out)
    write_atomic(out, markdown)
    write_atomic(out.with_suffix(".json"), json.dumps(data, indent=1))
