"""Hardware cost profiles: the analytic model against the published points, projections from per-step
logs, measured profiles, and the `specbench hardware` / `specbench profile` commands."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specbench.hardware import analytic, calibration
from specbench.hardware.analytic import ANALYTIC_PROFILES, load_shape, shape_from_config

# ------------------------------------------------------------------------------- shapes

# Linear weight counts from the published parameter totals (8,030,261,248 for Llama-3.1-8B;
# 8,190,735,360 for Qwen3-8B) minus the input embedding and the norm vectors.
PUBLISHED_LINEAR = {
    "llama-3.1-8b": 8_030_261_248 - 128256 * 4096 - (32 * 2 + 1) * 4096,
    "qwen3-8b": 8_190_735_360 - 151936 * 4096 - (36 * 2 + 1) * 4096 - 36 * 2 * 128,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_LINEAR))
def test_linear_params_match_published_totals(name):
    assert load_shape(name).linear_params == PUBLISHED_LINEAR[name]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-4b", "smollm2-135m"])
def test_linear_params_match_transformers_model(name):
    """The count equals the nn.Linear weights of the model transformers builds from the config (on
    the meta device: no memory); a tied lm_head is an nn.Linear too, so it counts as read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _, cfg = analytic.load_config(name)
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert load_shape(name).linear_params == linear


def test_shape_from_config_drafter_fields():
    base = dict(num_hidden_layers=1, hidden_size=8, num_attention_heads=2, intermediate_size=16, vocab_size=100)
    plain = shape_from_config(base)
    eagle3 = shape_from_config({**base, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 10})
    assert eagle3.vocab == 10 and eagle3.qkv_in == 16 and eagle3.extra_params == 3 * 8 * 8
    assert plain.extra_params == 0 and plain.qkv_in == 8
    assert shape_from_config({"text_config": base}) == plain


def test_shape_from_config_names_missing_keys():
    from specbench.errors import UserError

    with pytest.raises(UserError, match="intermediate_size"):
        shape_from_config(dict(num_hidden_layers=1, hidden_size=8, num_attention_heads=2, vocab_size=10), "x")


def test_t_fwd_regimes():
    shape = load_shape("llama-3.1-8b")
    engine, eager = ANALYTIC_PROFILES["h100-sxm:engine"], ANALYTIC_PROFILES["h100-sxm:hf-eager"]
    # engine: memory-bound at n=1, so the H200's bandwidth makes it faster by about 4.8/3.35
    h200 = ANALYTIC_PROFILES["h200:engine"]
    assert engine.t_fwd(shape, 1, 512) / h200.t_fwd(shape, 1, 512) == pytest.approx(4.8 / 3.35, rel=0.02)
    # engine pays for large trees; hf-eager's host time hides them
    assert engine.t_fwd(shape, 512, 512) > 1.5 * engine.t_fwd(shape, 1, 512)
    assert eager.t_fwd(shape, 256, 512) == eager.t_fwd(shape, 1, 512)
    # monotone in n and context
    for prof in (engine, eager):
        ts = [prof.t_fwd(shape, n, 512) for n in (1, 2, 64, 256, 512, 1024)]
        assert ts == sorted(ts)
        assert prof.t_fwd(shape, 64, 32_000) >= prof.t_fwd(shape, 64, 100)
    assert engine.t_fwd(shape, 64, 32_000) > engine.t_fwd(shape, 64, 100)  # KV bytes count when memory-bound


# ------------------------------------------------------------------------------- published points

POINTS = {p.key: p for p in calibration.published_points()}


@pytest.mark.parametrize(
    "key",
    [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=f"contradicts {calibration.CONFLICTS[k][0]}: "
                                              f"{calibration.CONFLICTS[k][1]}"))
     if k in calibration.CONFLICTS else k for k in POINTS],
)
def test_published_point(key):
    r = calibration.evaluate(POINTS[key])
    assert r.ok, f"{key}: model {r.model:.4g} vs published {r.point.published:.4g} ({r.error:+.1%}, tolerance {r.point.tolerance:.0%})"


@pytest.mark.parametrize("key", sorted(calibration.CONFLICTS))
def test_conflicting_points_cannot_both_be_met(key):
    """The two xfail points above: with the same profile and drafter shape, the step cost beyond
    T_fwd(n) that one point allows and the one its partner allows do not overlap, so no value of
    t_round, t_d or the drafter's own cost meets both."""
    other = calibration.CONFLICTS[key][0]
    a, b = calibration.allowed_extra(POINTS[key]), calibration.allowed_extra(POINTS[other])
    assert POINTS[key].profile == POINTS[other].profile and POINTS[key].drafter == POINTS[other].drafter
    assert a[1] < b[0] or b[1] < a[0], (a, b)


def test_sglang_eagle3_point_is_plausible():
    tau = calibration.sglang_eagle3_implied_tau()
    assert 1.0 < tau <= 6.0


def test_hf_eager_refit_is_needed():
    """HARDWARE.md's first estimate (t_round = t_d = 0 for hf-eager) misses the Spec-Bench EAGLE point;
    the refitted values meet it. Guards the README's claim that the refit was necessary."""
    eager0 = {k: analytic.with_params(v, t_round=0.0, t_d=0.0) if k.endswith("hf-eager") else v
              for k, v in ANALYTIC_PROFILES.items()}
    point = POINTS["specbench-a100-vicuna7b-eagle"]
    assert not calibration.evaluate(point, eager0).ok
    assert calibration.evaluate(point).ok


def test_calibration_figure(tmp_path):
    paths = calibration.plot_calibration(tmp_path)
    assert [p.name for p in paths] == ["hardware_calibration.png"]
    assert paths[0].stat().st_size > 10_000


# ------------------------------------------------------------------------------- projections

import pandas as pd  # noqa: E402

from rowfactory import synthetic_row  # noqa: E402
from specbench.hardware import profiles, project  # noqa: E402

BIG = "random:llama-3.1-8b"


def ar_row(pid: str, n_new: int, **kw) -> dict:
    return synthetic_row(pid, 0, [0] * n_new, drafter="ar", drafter_config="{}", tree_size_per_step=[1] * n_new,
                         tree_depth_per_step=[0] * n_new, drafter_forwards_per_step=[0] * n_new, **kw)


def ngram_row(pid: str, accepted: list[int], tree: int = 8, **kw) -> dict:
    return synthetic_row(pid, 0, accepted, drafter="ngram", drafter_config='{"num_draft":7}',
                         tree_size_per_step=[tree] * len(accepted), drafter_forwards_per_step=[0] * len(accepted), **kw)


@pytest.fixture(autouse=True)
def _profile_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(profiles.ENV_DIR, str(tmp_path / "hw"))


@pytest.mark.parametrize("hardware", sorted(ANALYTIC_PROFILES))
@pytest.mark.parametrize("target", [BIG, "tiny-llama"])
def test_ar_projects_to_exactly_one(hardware, target):
    rows = pd.DataFrame([ar_row("a", 7, target=target), ar_row("b", 3, target=target, prompt_ids=list(range(40)))])
    p = project.project_rows(rows, hardware)
    assert p.speedup_sum == 1.0 and p.speedup_mean == 1.0 and p.label == "projected"


def test_projection_by_hand():
    """One ngram row priced by hand from T_fwd: sum of AR token costs over sum of step costs."""
    prof = ANALYTIC_PROFILES["h100-sxm:engine"]
    shape = load_shape("llama-3.1-8b")
    row = ngram_row("p", [3, 0, 7], tree=8, target=BIG, prompt_ids=list(range(10)), n_new_tokens=12)
    # positions: 9, then 9+4=13, then 13+1=14; the last step commits 8 but only 7 count (n_new 12)
    spec = sum(prof.t_fix + prof.t_round + prof.t_fwd(shape, 8, c) for c in (9, 13, 14))
    ar = sum(prof.t_fix + prof.t_fwd(shape, 1, c) for c in [9, 10, 11, 12, 13, *range(14, 21)])
    p = project.project_rows(pd.DataFrame([row]), "h100-sxm:engine")
    assert p.speedup_sum == pytest.approx(ar / spec, rel=1e-12)


def test_projection_matches_the_identity():
    """Constant steps: the projection equals tau * (t_fix + T_fwd(1)) / step cost (calibration's formula)."""
    prof = ANALYTIC_PROFILES["h100-sxm:engine"]
    row = synthetic_row("p", 0, [3] * 50, drafter="eagle3", target=BIG, tree_size_per_step=[8] * 50,
                        drafter_forwards_per_step=[4] * 50, prompt_ids=[1] * 2000)
    point = calibration.Point("x", "", "h100-sxm:engine", "llama-3.1-8b", "ratio", 1.0, 0.1, n=8, context=2100,
                              drafter="eagle3-llama-3.1-8b", drafter_forwards=4)
    expected = 4 * calibration.ar_token_seconds(prof, point) / calibration.step_seconds(prof, point)
    got = _with_drafter_dir(row, "eagle3-llama-3.1-8b")
    assert got.speedup_sum == pytest.approx(expected, rel=0.01)
    assert 1.0 < got.speedup_sum < 4.0


def _with_drafter_dir(row, shape_name):
    """Project ``row`` with its drafter checkpoint folder holding the bundled ``shape_name`` config."""
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(analytic.load_config(shape_name)[1]))
    row = {**row, "drafter_config": json.dumps({"path": str(folder)})}
    return project.project_rows(pd.DataFrame([row]), "h100-sxm:engine")


def test_sum_and_mean_differ_and_unknown_drafter_is_nan():
    rows = pd.DataFrame([ngram_row("a", [7] * 5, target=BIG), ngram_row("b", [0] * 20, target=BIG)])
    p = project.project_rows(rows, "h100-sxm:engine")
    assert p.speedup_mean != pytest.approx(p.speedup_sum)
    # a drafter with forwards whose weights cannot be found is not priced (NaN), not priced at zero
    unknown = synthetic_row("c", 0, [2, 2], target=BIG, drafter_config='{"path":"random"}')
    assert math.isnan(project.project_rows(pd.DataFrame([unknown]), "h100-sxm:engine").speedup_sum)


def test_a_relative_checkpoint_path_prices_from_any_folder_and_a_lost_one_is_named(tmp_path, monkeypatch):
    """A sweep records ``drafters/checkpoints/...`` relative to the project root; compare run from another
    folder must still find the drafter's shape, and a folder found nowhere is named, not a silent '-'."""
    from specbench import report

    monkeypatch.chdir(tmp_path)
    shipped = "drafters/checkpoints/eagle3-smollm2-135m-r200k"
    row = synthetic_row("a", 0, [2, 2], target=BIG, drafter="eagle3", drafter_config=json.dumps({"path": shipped}))
    found = project.project_rows(pd.DataFrame([row]), "h100-sxm:engine")
    assert found.speedup_sum > 0 and found.missing == ()
    lost = {**row, "drafter_config": json.dumps({"path": "heads/gone"})}
    gone = project.project_rows(pd.DataFrame([lost]), "h100-sxm:engine")
    assert math.isnan(gone.speedup_sum) and gone.missing == ("heads/gone",)

    rows = pd.DataFrame([ar_row("a", 6, target=BIG), row])
    assert project.unpriced_note(project.add_projections(rows, report.compare(rows), ["h100-sxm:engine"])) is None
    rows = pd.DataFrame([ar_row("a", 6, target=BIG), lost])
    out = project.add_projections(rows, report.compare(rows), ["h100-sxm:engine", "h100-sxm:hf-eager"])
    assert out.loc[out["drafter"] == "eagle3", "projected_decode_speedup_sum"].isna().all()
    note = project.unpriced_note(out)
    assert note is not None and note.count("heads/gone") == 1 and "config.json was not found" in note


def test_a_default_checkpoint_run_prices_from_the_folder_it_loaded():
    """``path=auto`` rows: the folder the run read (recorded as a machine-specific absolute path) is found
    under drafters/checkpoints/ by name; without a record, today's default from defaults.toml prices it
    (not ``<family>-<target>``, which no longer ships)."""
    from drafters.common.locate import default_checkpoint_name, recorded_checkpoint, shipped_folder

    r40k = "eagle3-smollm2-135m-r40k"
    folder, _ = recorded_checkpoint("eagle3", "smollm2-135m", "auto", f"/another/machine/drafters/checkpoints/{r40k}")
    assert folder == shipped_folder(r40k)
    folder, _ = recorded_checkpoint("eagle3", "smollm2-135m", "auto", None)
    assert folder == shipped_folder(default_checkpoint_name("eagle3", "smollm2-135m")) != shipped_folder(r40k)
    assert recorded_checkpoint("eagle3", "no-such-target", "auto", None)[0] is None

    auto = json.dumps({"path": "auto"})
    row = synthetic_row("a", 0, [2, 2], target="smollm2-135m", drafter="eagle3", drafter_config=auto)
    priced = project.project_rows(pd.DataFrame([row]), "h100-sxm:engine", as_target="qwen3-8b")
    assert priced.speedup_sum > 0 and priced.missing == ()


def test_tree_costs_more_on_engine_than_eager():
    """A 256-node tree accepted 6 deep: hf-eager hides the tree (its speedup tracks tau); the engine pays."""
    rows = pd.DataFrame([ngram_row("a", [6] * 30, tree=256, target=BIG)])
    eager = project.project_rows(rows, "h100-sxm:hf-eager").speedup_sum
    engine = project.project_rows(rows, "h100-sxm:engine").speedup_sum
    assert engine < eager < 7.0
    assert eager > 0.9 * 7 * 0.97  # only t_round stands between eager and tau here


def test_what_if_as_target():
    rows = pd.DataFrame([ngram_row("a", [3] * 10, tree=8, target="tiny-llama")])
    p = project.project_rows(rows, "h100-sxm:engine", as_target="qwen3-8b")
    assert p.label == "what-if: qwen3-8b" and 1.0 < p.speedup_sum < 4.0
    with pytest.raises(Exception, match="cannot find the architecture"):
        project.project_rows(pd.DataFrame([ngram_row("a", [1], target="org/unknown-model")]), "h100-sxm:engine")


def test_unknown_profile_is_one_line_error():
    from specbench.errors import UserError

    with pytest.raises(UserError, match="unknown hardware profile 'tpu'.*h100-sxm:engine"):
        profiles.get_profile("tpu")


def _measured(name="cpu-test", target="tiny-llama") -> profiles.MeasuredProfile:
    cfg = project.target_config(target)
    return profiles.MeasuredProfile(name=name, target=target, target_config=cfg, contexts=[10, 110], ns=[1, 2, 4],
                                    t_fwd_ms=[[1.0, 1.5, 2.5], [2.0, 2.5, 3.5]], drafters={"ngram": {"ms_per_forward": 0.1}},
                                    fingerprint={"device": "cpu"}, created="2025-01-01T00:00:00")


def test_as_target_on_a_measured_profile_is_refused_before_any_work(monkeypatch):
    """A measured profile knows one target's forward; --as-target on it is one line before a replay or a compare
    starts (it was raised only once the first row was priced, after the replay's minutes)."""
    from specbench import replay
    from specbench.errors import UserError

    profiles.save_measured(_measured("cpu-test"))
    with pytest.raises(UserError, match="--as-target needs an analytic profile; 'cpu-test' is measured on tiny-llama"):
        project.check_projection(["h100-sxm:engine", "cpu-test"], "qwen3-8b")
    project.check_projection(["h100-sxm:engine", "cpu-test"])  # without --as-target both price

    def no_model(*args, **kwargs):
        raise AssertionError("a model loaded before the profiles were checked")

    monkeypatch.setattr(replay, "load_target", no_model)
    with pytest.raises(UserError, match="'cpu-test' is measured on tiny-llama"):
        replay.main(["jetspec", "--target", "tiny-llama", "--hardware", "cpu-test", "--as-target", "qwen3-8b"])


def test_measured_profiles_live_in_the_cache_unless_told_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv(profiles.ENV_DIR)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    assert profiles.profile_dir() == tmp_path / "cache" / "hardware"  # with the models, features and replays
    monkeypatch.setenv(profiles.ENV_DIR, str(tmp_path / "elsewhere"))
    assert profiles.profile_dir() == tmp_path / "elsewhere"


def test_measured_profile_roundtrip_and_interpolation():
    path = profiles.save_measured(_measured())
    assert path.parent == profiles.profile_dir() and path.is_file()
    prof = profiles.get_profile("cpu-test")
    assert isinstance(prof, profiles.MeasuredProfile)
    assert prof.t_fwd(None, 1, 10) == pytest.approx(1.0e-3)
    assert prof.t_fwd(None, 3, 60) == pytest.approx(2.5e-3)  # midway in n and in context
    assert prof.t_fwd(None, 8, 10) == pytest.approx(4.5e-3)  # extrapolated along the last segment
    assert prof.t_fwd(None, 1, 10_000) == pytest.approx(2.0e-3)  # clamped in context
    rows = pd.DataFrame([ngram_row("a", [3] * 4, tree=4, target="tiny-llama", prompt_ids=[1] * 11)])
    p = project.project_rows(rows, "cpu-test")
    assert p.speedup_sum == pytest.approx((16 * 1.0) / (4 * 2.5), rel=0.05)
    with pytest.raises(Exception, match="cannot price another model"):
        project.project_rows(pd.DataFrame([ngram_row("a", [1], target=BIG)]), "cpu-test")


def test_add_projections_to_compare_table():
    from specbench import report

    rows = pd.DataFrame([ar_row("a", 8, target=BIG), ar_row("b", 8, target=BIG),
                         ngram_row("a", [3, 3], target=BIG), ngram_row("b", [1, 1, 1, 1], target=BIG)])
    table = report.compare(rows)
    out = project.add_projections(rows, table, ["h100-sxm:engine", "h100-sxm:hf-eager"])
    assert len(out) == 2 * len(table)
    assert list(out.columns[-4:]) == project.PROJECTION_COLUMNS
    ar = out[out["drafter"] == "ar"]
    assert (ar["projected_decode_speedup_sum"] == 1.0).all() and set(ar["hardware"]) == {"h100-sxm:engine", "h100-sxm:hf-eager"}
    ng = out[(out["drafter"] == "ngram") & (out["hardware"] == "h100-sxm:engine")].iloc[0]
    direct = project.project_rows(rows[rows["drafter"] == "ngram"], "h100-sxm:engine")
    assert ng["projected_decode_speedup_sum"] == pytest.approx(direct.speedup_sum)
    assert ng["projection"] == "projected"


# ------------------------------------------------------------------------------- random: shape targets

SMALL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
         "max_position_embeddings": 4096, "tie_word_embeddings": False}


def test_random_target_from_config(tmp_path):
    from specbench.targets import load_target

    cfg = tmp_path / "small.json"
    cfg.write_text(json.dumps(SMALL))
    t1, t2 = load_target(f"random:{cfg}", "cpu"), load_target(f"random:{cfg}", "cpu")
    assert t1.dtype == torch.float32 and t1.num_layers == 2 and t1.vocab_size == 320
    for a, b in zip(t1.model.parameters(), t2.model.parameters()):  # seeded: same config, same weights
        assert torch.equal(a, b)
    # the cost model reads the same shape the model has
    assert load_shape(str(cfg)).linear_params == sum(
        m.weight.numel() for m in t1.model.modules() if isinstance(m, torch.nn.Linear))


def test_random_target_errors():
    from specbench.errors import UserError
    from specbench.targets import load_target

    with pytest.raises(UserError, match="no config 'nope'"):
        load_target("random:nope", "cpu")


def test_random_target_run_is_lossless_and_projects(tmp_path):
    """ngram vs ar on a random: target through the CLI, greedy outputs equal; projection on the result."""
    from typer.testing import CliRunner

    from specbench import cli, report, results

    cfg = tmp_path / "small.json"
    cfg.write_text(json.dumps(SMALL))
    res = CliRunner().invoke(cli.app, ["run", "--target", f"random:{cfg}", "--drafter", "ngram", "--task", "mt-bench",
                                       "--limit", "2", "--max-new-tokens", "24", "--no-warmup",
                                       "--results-dir", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    df = results.read_results(results.expand_globs([str(tmp_path / "r" / "*.parquet")]))
    table = report.compare(df)
    assert table.loc[table["drafter"] == "ngram", "lossless"].iloc[0] is True
    out = project.add_projections(df, table, ["h100-sxm:engine"])
    assert (out.loc[out["drafter"] == "ar", "projected_decode_speedup_sum"] == 1.0).all()
    assert out.loc[out["drafter"] == "ngram", "projected_decode_speedup_sum"].notna().all()


# ------------------------------------------------------------------------------- CLI


def _cli(*args):
    from typer.testing import CliRunner

    from specbench import cli

    return CliRunner().invoke(cli.app, [str(a) for a in args])


def test_cli_hardware_list_and_latency(tmp_path):
    profiles.save_measured(_measured("cpu-test"))
    res = _cli("hardware")
    assert res.exit_code == 0
    for name in [*ANALYTIC_PROFILES, "cpu-test"]:
        assert name in res.output
    res = _cli("hardware", "latency", "--profile", "h100-sxm:engine", "--config", "llama-3.1-8b",
               "--tokens", "1,64,256", "--format", "json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    shape, prof = load_shape("llama-3.1-8b"), ANALYTIC_PROFILES["h100-sxm:engine"]
    assert [r["n"] for r in got] == [1, 64, 256]
    assert [r["ms"] for r in got] == pytest.approx([prof.t_fwd(shape, n, 512) * 1e3 for n in (1, 64, 256)])
    cfg = tmp_path / "config.json"  # any HF config file works, at any context
    cfg.write_text(json.dumps(SMALL))
    res = _cli("hardware", "latency", "-p", "a100:hf-eager", "-c", cfg, "--tokens", "4", "--context", "9", "-f", "json")
    assert json.loads(res.stdout)[0]["ms"] == pytest.approx(ANALYTIC_PROFILES["a100:hf-eager"].t_fwd(load_shape(cfg), 4, 9) * 1e3)
    res = _cli("hardware", "latency", "--profile", "cpu-test", "--tokens", "2", "--context", "10")  # measured: no config
    assert res.exit_code == 0 and "1.500" in res.output


@pytest.mark.parametrize("args,words", [
    (["hardware", "latency", "--profile", "tpu", "--config", "llama-3.1-8b"], "unknown hardware profile 'tpu'"),
    (["hardware", "latency", "--profile", "h200:engine"], "--config is needed"),
    (["hardware", "latency", "--profile", "h200:engine", "-c", "nope.json"], "no config 'nope.json'"),
    (["hardware", "latency", "--profile", "h200:engine", "-c", "qwen3-8b", "--tokens", "1,x"], "comma-separated integers"),
    (["hardware", "latency", "--profile", "h200:engine", "-c", "qwen3-8b", "-f", "xml"], "unknown --format 'xml'"),
    (["profile", "--target", "tiny-llama", "--name", "h100-sxm:engine"], "is an analytic profile"),
    (["profile", "--target", "tiny-llama", "--name", "x", "--tokens", "0"], "integers >= 1"),
])
def test_cli_hardware_user_errors(args, words):
    res = _cli(*args)
    assert res.exit_code == 2
    assert "error:" in res.output and words in res.output and "Traceback" not in res.output


def test_cli_hardware_calibrate_out_dir_under_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    res = _cli("hardware", "calibrate", "--out-dir", tmp_path / "f" / "figs")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "error: cannot write the figure to folder" in res.output and "choose another --out-dir" in res.output


def test_cli_hardware_calibrate(tmp_path):
    res = _cli("hardware", "calibrate", "--out-dir", tmp_path, "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == len(POINTS)
    assert {r["point"] for r in rows if not r["ok"]} == set(calibration.CONFLICTS)
    assert (tmp_path / "hardware_calibration.png").is_file()


def test_cli_profile_tiny(tmp_path):
    """A tiny profile on CPU: saved with the fingerprint, listed, usable for projection."""
    res = _cli("profile", "--target", "tiny-llama", "--name", "tiny-cpu", "--tokens", "1,2,4", "--contexts", "8,16",
               "--drafter", "ngram", "--drafter", "eagle3:path=random", "--repeats", "1", "--device", "cpu")
    assert res.exit_code == 0, res.output
    prof = profiles.get_profile("tiny-cpu")
    assert prof.ns == [1, 2, 4] and prof.contexts == [8, 16]
    assert all(v > 0 for row in prof.t_fwd_ms for v in row)
    assert prof.fingerprint["device"] == "cpu" and prof.fingerprint["torch_version"] == torch.__version__
    assert prof.drafters["eagle3"]["forwards"] > 0 and prof.drafters["eagle3"]["ms_per_forward"] > 0
    assert prof.drafters["ngram"]["forwards"] == 0
    assert "tiny-cpu" in _cli("hardware").output
    rows = pd.DataFrame([ngram_row("a", [3] * 4, tree=4, target="tiny-llama", prompt_ids=[1] * 11)])
    assert project.project_rows(rows, "tiny-cpu").speedup_sum > 0


def test_binary_tree_mask_shape():
    from specbench.hardware.measure import binary_tree
    from specbench.tree import depths

    tree = binary_tree(7)
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2, 2] and int(depths(tree.parents).max()) == 2


def test_cli_compare_hardware_and_as_target(tmp_path):
    res = _cli("run", "--target", "tiny-llama", "--drafter", "ngram", "--task", "mt-bench", "--limit", "2",
               "--max-new-tokens", "16", "--no-warmup", "--results-dir", tmp_path)
    assert res.exit_code == 0, res.output
    files = str(tmp_path / "*.parquet")
    res = _cli("compare", files, "--hardware", "h100-sxm:engine", "--hardware", "a100:hf-eager", "-f", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 4 and {r["projection"] for r in rows} == {"projected"}
    assert all(r["projected_decode_speedup_sum"] == 1.0 == r["projected_decode_speedup_mean"] for r in rows if r["drafter"] == "ar")
    assert all(r["projected_decode_speedup_sum"] > 0 for r in rows)
    res = _cli("compare", files, "--hardware", "h200:engine", "--as-target", "qwen3-8b", "-f", "json")
    assert {r["projection"] for r in json.loads(res.stdout)} == {"what-if: qwen3-8b"}
    table = _cli("compare", files, "--hardware", "h100-sxm:engine").output
    assert "projected" in table and "h100-sxm:engine" in table
    for args, words in [(["--as-target", "qwen3-8b"], "--as-target needs --hardware"),
                        (["--hardware", "tpu"], "unknown hardware profile 'tpu'")]:
        res = _cli("compare", files, *args)
        assert res.exit_code == 2 and words in res.output
