"""Where a learned drafter's checkpoint folder is, with no torch import (``compare`` uses it too).

* :func:`default_checkpoint_name`: the folder ``--drafter <family>`` loads for a target, from
  ``drafters/checkpoints/defaults.toml``;
* :func:`checkpoint_dir`: a ``--drafter-path`` (or a path a result file recorded) as written, else
  relative to the project root, so ``drafters/checkpoints/...`` works from any folder;
* :func:`recorded_checkpoint`: the folder a finished run loaded, from its result row.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DEFAULTS_NAME = "defaults.toml"


def project_root() -> Path:
    """The folder that holds the ``drafters`` package (the repository root in a checkout)."""
    return Path(str(files("drafters"))).parent


def shipped_folder(name: str) -> Path:
    """``drafters/checkpoints/<name>`` (package data), whether or not it exists."""
    return Path(str(files("drafters").joinpath("checkpoints", name)))


def shipped_defaults() -> dict[str, dict[str, str]]:
    """``defaults.toml`` as ``{target: {family: folder}}`` (empty when the file is absent)."""
    table = shipped_folder(DEFAULTS_NAME)
    return {t: {f: str(d) for f, d in heads.items()} for t, heads in tomllib.loads(table.read_text()).items()} \
        if table.is_file() else {}


def default_checkpoint_name(family: str, target_name: str) -> str:
    """The folder under ``drafters/checkpoints/`` that ``--drafter <family>`` loads for a target.

    ``defaults.toml`` names it per target (``[smollm2-135m] eagle3 = "eagle3-smollm2-135m-r200k"``) when
    several heads of one family ship (the other ones stay loadable with ``--drafter-path``); without an
    entry it is ``<family>-<target>``.
    """
    return shipped_defaults().get(target_name, {}).get(family, f"{family}-{target_name}")


def is_checkpoint(folder: Path) -> bool:
    """True when ``folder`` holds a checkpoint's config.json."""
    return (folder / "config.json").is_file()


def checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint folder as given (absolute, or relative to the current folder); else, for a relative
    path such as the ``drafters/checkpoints/...`` that sweeps and result files record, the same path under
    the project root. The path as given when neither holds a config.json, so the caller's error names it."""
    given = Path(path).expanduser()
    if given.is_absolute() or is_checkpoint(given):
        return given
    rooted = project_root() / given
    return rooted if is_checkpoint(rooted) else given


def recorded_checkpoint(drafter: str, target: str, path: str, loaded_from: str | None) -> tuple[Path | None, str]:
    """(the checkpoint folder a run used, or None; what was looked for) from its recorded options.

    ``path`` is the ``path`` option the run was given. ``auto`` means the default of the day, which can
    change after the run (the defaults moved from the 40k to the 200k heads), so the folder the run
    actually read (``loaded_from``, the row's ``checkpoint_path``) comes first: as recorded, else the
    shipped folder of that name (the recorded path is absolute and machine-specific), and only then
    today's default."""
    if path != "auto":
        found = checkpoint_dir(path)
        return (found if is_checkpoint(found) else None), path
    candidates = []
    if loaded_from and not loaded_from.startswith("random:"):
        candidates += [Path(loaded_from), shipped_folder(Path(loaded_from).name)]
    candidates.append(shipped_folder(default_checkpoint_name(drafter, target)))
    return next((c for c in candidates if is_checkpoint(c)), None), str(candidates[0])


__all__ = ["DEFAULTS_NAME", "project_root", "shipped_folder", "shipped_defaults", "default_checkpoint_name",
           "is_checkpoint", "checkpoint_dir", "recorded_checkpoint"]
