"""The published points the analytic profiles must reproduce (HARDWARE.md), as data plus one function.

Each :class:`Point` names a profile, a target shape, what the model computes and the published value
with its tolerance (relative). Speedup/tau points use the speedup identity: the published
``speedup / tau`` is the per-token cost of AR over the per-step cost of the method,
``(t_fix + T_fwd(1)) / (t_fix + t_round + T_draft + T_fwd(n))``.

Assumptions the sources do not state (context lengths, draft lengths, drafter shapes) are written
next to each point; reports/hardware.md lists them too.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.hardware.analytic import ANALYTIC_PROFILES, AnalyticProfile, load_shape


@dataclass(frozen=True)
class Point:
    key: str
    source: str
    profile: str
    target: str  # bundled shape
    quantity: str  # "ar_ms" (ms/token), "fwd_ms" (T_fwd(n) ms), "step_ms" (ms/round), "token_ms", "ratio"
    published: float
    tolerance: float  # relative
    n: int = 1  # query tokens of the verify forward
    context: int = 512
    drafter: str | None = None  # bundled shape of the drafter (None: no weights, e.g. prompt lookup)
    drafter_forwards: int = 0
    drafter_n: int = 1  # query tokens per drafter forward
    tau: float | None = None
    note: str = ""


def _ratio(speedup: float, tau: float) -> float:
    return speedup / tau


# vLLM issue 20780 (EAGLE-3, Llama-3.1-8B, batch 1): K drafts in K head forwards, a chain of K+1 nodes.
_VLLM_K = {2: (2.36, 4.32), 3: (2.79, 4.09), 4: (3.08, 4.05), 5: (3.32, 4.13), 6: (3.46, 4.20), 7: (3.54, 4.29)}
# JetSpec project page, H100, Qwen3-8B (speedup, tau), per budget and task.
_JETSPEC = {64: {"math500": (6.76, 7.42), "humaneval": (5.53, 6.06), "mt_bench": (3.97, 4.77)},
            256: {"math500": (9.64, 10.76), "humaneval": (7.12, 7.78), "mt_bench": (4.58, 5.94)}}
# liranringel/ddtree results table: DFlash, Qwen3-8B, block 16, T = 0 (speedup, tau).
_DFLASH = {"math500": (5.56, 7.79), "gsm8k": (4.78, 6.57), "humaneval": (4.84, 6.61), "mbpp": (4.33, 5.99),
           "mt_bench": (2.56, 4.28), "alpaca": (2.07, 3.12)}


def published_points() -> list[Point]:
    pts = [
        Point("sglang-llama8b-ar", "SGLang docs, speculative decoding page (MT-Bench, 1x H100)", "h100-sxm:engine",
              "llama-3.1-8b", "ar_ms", 1000 / 158.34, 0.15, note="context 512 assumed"),
        Point("vllm-llama8b-ar", "vllm-project/vllm issue 20780", "h100-sxm:engine", "llama-3.1-8b", "ar_ms",
              7.07, 0.10, note="context 512 assumed"),
    ]
    for k, (tau, ms) in _VLLM_K.items():
        pts.append(Point(f"vllm-llama8b-eagle3-k{k}", "vllm-project/vllm issue 20780", "h100-sxm:engine",
                         "llama-3.1-8b", "token_ms", ms, 0.10, n=k + 1, drafter="eagle3-llama-3.1-8b",
                         drafter_forwards=k, tau=tau, note=f"chain of {k} drafts, {k} head forwards"))
    for n, ms in [(1, 34.8), (64, 34.8), (128, 34.8), (192, 34.8), (256, 38.5), (384, 46.9), (512, 55.2)]:
        pts.append(Point(f"caddtree-a800-qwen3-8b-n{n}", "ZhangShuai1230/CaDDTree cost_models/Qwen3-8B_convex.pt",
                         "a100:hf-eager", "qwen3-8b", "fwd_ms", ms, 0.10, n=n, context=1,
                         note="A800 = the a100 profile (same 2.0 TB/s, 312 TFLOP/s)"))
    pts.append(Point("caddtree-a800-qwen3-4b-n1", "ZhangShuai1230/CaDDTree", "a100:hf-eager", "qwen3-4b", "fwd_ms",
                     34.0, 0.10, n=1, context=1))
    pts += [
        Point("jetspec-bench-qwen3-8b-ar", "hao-ai-lab/JetSpec bench/outputs (GSM8K)", "h100-sxm:hf-eager", "qwen3-8b",
              "ar_ms", 32.2, 0.10, context=384, note="GPU not stated; h100 assumed"),
        Point("jetspec-bench-qwen3-8b-dflash16", "hao-ai-lab/JetSpec bench/outputs (GSM8K)", "h100-sxm:hf-eager",
              "qwen3-8b", "step_ms", 39.7, 0.10, n=16, context=384, drafter="dflash-qwen3-8b-b16",
              drafter_forwards=1, drafter_n=16, tau=6.17, note="16-node chain, one block forward"),
        Point("jetspec-bench-qwen3-8b-tree255", "hao-ai-lab/JetSpec bench/outputs (GSM8K)", "h100-sxm:hf-eager",
              "qwen3-8b", "step_ms", 33.1, 0.10, n=255, context=384, drafter="dflash-qwen3-8b-b16",
              drafter_forwards=1, drafter_n=16, tau=8.54, note="255-node tree, one block forward"),
    ]
    for budget, tasks in _JETSPEC.items():
        for task, (sp, tau) in tasks.items():
            pts.append(Point(f"jetspec-paper-b{budget}-{task}", "JetSpec project page (H100, Qwen3-8B)",
                             "h100-sxm:hf-eager", "qwen3-8b", "ratio", _ratio(sp, tau), 0.10, n=budget, context=512,
                             drafter="dflash-qwen3-8b-b16", drafter_forwards=1, drafter_n=16, tau=tau,
                             note=f"speedup {sp} / tau {tau}; tree of {budget} nodes, one head forward"))
    for task, (sp, tau) in _DFLASH.items():
        pts.append(Point(f"ddtree-dflash-b16-{task}", "liranringel/ddtree results table (Qwen3-8B, T=0)",
                         "h100-sxm:hf-eager", "qwen3-8b", "ratio", _ratio(sp, tau), 0.25, n=16, context=512,
                         drafter="dflash-qwen3-8b-b16", drafter_forwards=1, drafter_n=16, tau=tau,
                         note=f"speedup {sp} / tau {tau}; 16-node chain"))
    pts += [
        Point("specbench-a100-vicuna7b-pld", "hemingkx/Spec-Bench Leaderboard.md", "a100:hf-eager", "vicuna-7b",
              "ratio", _ratio(1.59, 1.73), 0.25, n=11, context=512, drafter=None, drafter_forwards=0, tau=1.73,
              note="prompt lookup: up to 10 drafts, no drafter forward"),
        Point("specbench-a100-vicuna7b-sps", "hemingkx/Spec-Bench Leaderboard.md", "a100:hf-eager", "vicuna-7b",
              "ratio", _ratio(1.49, 2.28), 0.25, n=6, context=512, drafter="vicuna-68m", drafter_forwards=5, tau=2.28,
              note="vicuna-68m drafts 5 tokens (HF assisted generation default)"),
        Point("specbench-a100-vicuna7b-eagle", "hemingkx/Spec-Bench Leaderboard.md", "a100:hf-eager", "vicuna-7b",
              "ratio", _ratio(2.29, 3.61), 0.25, n=26, context=512, drafter="eagle-vicuna-7b", drafter_forwards=5,
              drafter_n=4, tau=3.61, note="EAGLE-1 static tree of 26 nodes, 5 head forwards"),
    ]
    return pts


@dataclass(frozen=True)
class Result:
    point: Point
    model: float

    @property
    def error(self) -> float:
        return (self.model - self.point.published) / self.point.published

    @property
    def ok(self) -> bool:
        return abs(self.error) <= self.point.tolerance


def step_seconds(profile: AnalyticProfile, p: Point) -> float:
    target = load_shape(p.target)
    drafter = load_shape(p.drafter) if p.drafter else None
    draft = p.drafter_forwards * profile.drafter_forward(drafter, p.drafter_n, p.context)
    speculative = p.n > 1 or p.drafter_forwards > 0
    return profile.t_fix + (profile.t_round if speculative else 0.0) + draft + profile.t_fwd(target, p.n, p.context)


def ar_token_seconds(profile: AnalyticProfile, p: Point) -> float:
    return profile.t_fix + profile.t_fwd(load_shape(p.target), 1, p.context)


def evaluate(p: Point, profiles: dict[str, AnalyticProfile] | None = None) -> Result:
    profile = (profiles or ANALYTIC_PROFILES)[p.profile]
    if p.quantity == "fwd_ms":
        value = profile.t_fwd(load_shape(p.target), p.n, p.context) * 1e3
    elif p.quantity == "ar_ms":
        value = ar_token_seconds(profile, p) * 1e3
    elif p.quantity == "step_ms":
        value = step_seconds(profile, p) * 1e3
    elif p.quantity == "token_ms":
        value = step_seconds(profile, p) / p.tau * 1e3
    elif p.quantity == "ratio":
        value = ar_token_seconds(profile, p) / step_seconds(profile, p)
    else:
        raise ValueError(p.quantity)
    return Result(p, value)


# The points no parameter set can meet together with the others (reports/hardware.md, "Hardware notes"):
# each names the point(s) it contradicts under the speedup identity with the same drafter shape.
CONFLICTS: dict[str, tuple[str, str]] = {
    "jetspec-bench-qwen3-8b-tree255": (
        "jetspec-paper-b256-mt_bench",
        "the bench's decode round is 0.9 ms over AR; the paper's end-to-end speedup/tau needs >= 6 ms",
    ),
    "ddtree-dflash-b16-mt_bench": (
        "jetspec-bench-qwen3-8b-dflash16",
        "the same DFlash drafter costs <= 10.2 ms per round in the JetSpec bench but >= 11.3 ms here",
    ),
}


def allowed_extra(p: Point, profiles: dict[str, AnalyticProfile] | None = None) -> tuple[float, float]:
    """The interval of a step's cost beyond ``t_fix + T_fwd(n)`` (seconds) that meets ``p``'s tolerance.

    Drafter forwards, ``t_d`` and ``t_round`` all land in this one number, so two points of the same
    profile and drafter whose intervals are disjoint cannot both be met by any parameter values.
    """
    profile = (profiles or ANALYTIC_PROFILES)[p.profile]
    base = profile.t_fix + profile.t_fwd(load_shape(p.target), p.n, p.context)
    lo, hi = p.published * (1 - p.tolerance), p.published * (1 + p.tolerance)
    if p.quantity == "step_ms":
        return lo * 1e-3 - base, hi * 1e-3 - base
    if p.quantity == "ratio":
        ar = ar_token_seconds(profile, p)
        return ar / hi - base, ar / lo - base
    if p.quantity == "token_ms":
        return lo * 1e-3 * p.tau - base, hi * 1e-3 * p.tau - base
    raise ValueError(f"{p.key}: no extra cost in a {p.quantity} point")


def sglang_eagle3_implied_tau(profile: AnalyticProfile | None = None) -> float:
    """tau the engine model needs to give SGLang's 373.25 tok/s for EAGLE-3 on Llama-3.1-8B (H100).

    The page states no tau, so this point is checked for plausibility only: SGLang's EAGLE-3 example
    drafts 5 steps (top-k 8) into 32 verified tokens, so tau must lie in (1, 6].
    """
    profile = profile or ANALYTIC_PROFILES["h100-sxm:engine"]
    p = Point("sglang-llama8b-eagle3", "SGLang docs", "h100-sxm:engine", "llama-3.1-8b", "token_ms", 1000 / 373.25,
              0.0, n=32, drafter="eagle3-llama-3.1-8b", drafter_forwards=5)
    return step_seconds(profile, p) / (p.published * 1e-3)


def calibration_table() -> list[Result]:
    return [evaluate(p) for p in published_points()]


def plot_calibration(out_dir) -> list:
    """Two figures in ``out_dir``: T_fwd(n) curves against the CaDDTree points, and model / published
    for every point with its tolerance band. Returns the paths written."""
    from pathlib import Path

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = calibration_table()
    written = []

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ns = list(range(1, 513))
    curves = [("a100:hf-eager", "qwen3-8b", 1, "A100/A800 hf-eager, Qwen3-8B, ctx 1"),
              ("a100:hf-eager", "qwen3-4b", 1, "A100/A800 hf-eager, Qwen3-4B, ctx 1"),
              ("h100-sxm:hf-eager", "qwen3-8b", 512, "H100 hf-eager, Qwen3-8B, ctx 512"),
              ("h100-sxm:engine", "llama-3.1-8b", 512, "H100 engine, Llama-3.1-8B, ctx 512"),
              ("h200:engine", "llama-3.1-8b", 512, "H200 engine, Llama-3.1-8B, ctx 512")]
    for prof, shape, ctx, label in curves:
        s = load_shape(shape)
        ax1.plot(ns, [ANALYTIC_PROFILES[prof].t_fwd(s, n, ctx) * 1e3 for n in ns], label=label)
    fwd = [r for r in results if r.point.quantity == "fwd_ms"]
    ax1.errorbar([r.point.n for r in fwd], [r.point.published for r in fwd],
                 yerr=[r.point.published * r.point.tolerance for r in fwd], fmt="ko", capsize=3,
                 label="CaDDTree (A800, published, ±tol)")
    ax1.set_xlabel("query tokens n")
    ax1.set_ylabel("T_fwd(n) ms (model)")
    ax1.set_title("Analytic T_fwd(n) and the published forward times")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)

    ys = list(range(len(results)))
    colors = ["tab:green" if r.ok else "tab:red" for r in results]
    ax2.barh(ys, [r.error * 100 for r in results], color=colors)
    for y, r in zip(ys, results):
        ax2.plot([-r.point.tolerance * 100, r.point.tolerance * 100], [y, y], "k|", markersize=6)
    ax2.axvline(0, color="k", lw=0.8)
    ax2.set_yticks(ys, [r.point.key for r in results], fontsize=6)
    ax2.invert_yaxis()
    ax2.set_xlabel("model error vs published, % (| = tolerance; red = outside)")
    ax2.set_title("Every published point (HARDWARE.md)")
    ax2.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path = out / "hardware_calibration.png"
    fig.savefig(path, dpi=150)
    written.append(path)
    return written
