"""The `specbench` command: parse, build by registry, call the library, print with rich."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from specbench.errors import UserError
from specbench.outputs import check_folder
from specbench.progress import LoggedProgress

out_console = Console()
err_console = Console(stderr=True)

_INTERRUPTED = "interrupted; rows finished so far are kept — rerun with --resume --out FILE to continue"
_INTERRUPTED_AS = {  # what Ctrl-C leaves, per command (sweep and tune say it themselves); others: "interrupted"
    "run": _INTERRUPTED,
    "train": "interrupted; training resumes from its last saved step — rerun the same command to continue",
    "bench": "interrupted; no report was written",
    "replay": "interrupted; no report was written",
}


def _without_flag_metavar(params):
    """Flags take no value, so help shows no type for them (typer would print ``<bool>``)."""
    for param in params:
        if param is not None and getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class _Group(typer.core.TyperGroup):
    """Turns a UserError from any command into one red line on stderr and exit status 2; Ctrl-C into
    the --resume hint and exit status 130."""

    def get_params(self, ctx):
        return _without_flag_metavar(super().get_params(ctx))

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _without_flag_metavar([*command.params, command.get_help_option(ctx)])
        return command

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:  # typer turns it into a silent exit 130 before main() sees it
            err_console.print(_INTERRUPTED_AS.get(ctx.invoked_subcommand or "", "interrupted"), highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        """A wrong flag, value or command gets one line too, instead of usage text plus a framed panel."""
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except Exception as exc:  # typer vendors click, so match its UsageError family by name
            if not any(cls.__name__ == "UsageError" for cls in type(exc).__mro__):
                raise
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
                typer.echo(ctx.get_help())
                rv = 0
            else:
                where = ctx.command_path if ctx is not None else "specbench"
                err_console.print(f"[bold red]error:[/] {exc.format_message()} (see `{where} --help`)",
                                  highlight=False, soft_wrap=True)
                rv = 2
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Benchmark speculative-decoding drafters side by side on one lossless harness.",
)


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _lossless_text(summary: dict) -> str:
    """report.lossless_label, with what ``tie`` means spelled out."""
    from specbench import report

    label = report.lossless_label(summary.get("lossless"), summary.get("divergence"))
    return "tie (differs only at rounding near-ties)" if label == "tie" else label


@app.command()
def run(
    drafter: str = typer.Option("ngram", "--drafter", "-d", help="drafter name (see `specbench drafters`)"),
    task: Optional[str] = typer.Option("humaneval", "--task", "-t", help="built-in task (see `specbench tasks`)"),
    task_file: Optional[Path] = typer.Option(None, "--task-file", help="custom prompts: JSONL with id and prompt or turns"),
    category: Optional[str] = typer.Option(None, "--category", help="only this category of the task"),
    target: str = typer.Option("smollm2-135m", "--target", help="alias, local model directory or hub id (see `specbench targets`)"),
    limit: int = typer.Option(20, "--limit", "-n", help="a deterministic subset of N prompts (chosen with --seed); 0 = all"),
    seed: int = typer.Option(0, "--seed"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off"),
    options: List[str] = typer.Option([], "--set", help="drafter option key=value (repeatable)"),
    drafter_path: Optional[Path] = typer.Option(None, "--drafter-path", help="checkpoint directory of a learned drafter"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16"),
    device_map: Optional[str] = typer.Option(None, "--device-map", help="spread the target over the GPUs with accelerate: auto, balanced, sequential"),
    out: Optional[Path] = typer.Option(None, "--out", help="results file (default: <run-id>.parquet in --results-dir)"),
    results_dir: Path = typer.Option(Path("results"), "--results-dir", help="where runs go and baselines are looked up"),
    resume: bool = typer.Option(False, "--resume", help="continue the interrupted run in --out"),
    baseline: bool = typer.Option(True, "--baseline/--no-baseline", help="pair with the AR baseline (run or reused)"),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="one untimed generation first"),
    compile_: bool = typer.Option(False, "--compile", help="CUDA: the target on a static cache, its forward in CUDA graphs (torch.compile)"),
) -> None:
    """Run a drafter (and its AR baseline) over a task and write one row per (prompt, turn)."""
    from specbench import report, runner
    from specbench.targets import load_target

    spec = runner.RunSpec(
        drafter=drafter, target=target, task=None if task_file else task, task_file=task_file, category=category,
        limit=None if limit == 0 else limit, seed=seed, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        options=tuple(options), drafter_path=drafter_path, device=device, dtype=dtype, out=out,
        results_dir=results_dir, resume=resume, baseline=baseline, warmup=warmup, device_map=device_map,
        compile=compile_,
    )
    runner.validate(spec)  # user errors surface before any progress display or model load
    runner.check_checkpoint_exists(spec)
    from specbench import distributed

    world = distributed.from_env()  # under torchrun: this rank's share of the prompts, merged on rank 0
    with LoggedProgress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[label]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=True,
        disable=world is not None and world.rank != 0,
    ) as bar:
        job = bar.add_task(f"{drafter} on {target}", total=None, label="loading")

        def progress(done: int, total: int, label: str) -> None:
            bar.update(job, completed=done, total=total, label=label)

        outcome = distributed.run(spec, lambda s: load_target(s.target, s.device, s.dtype, device_map=s.device_map),
                                  progress, world)
    if outcome is None:  # a data-parallel rank other than 0; rank 0 prints the merged run
        return

    summary = report.run_summary(outcome.rows, None if outcome.baseline_rows is None else _frame(outcome.baseline_rows))
    table = Table(title=f"{drafter} on {target} · {runner.task_name(spec)} · T={temperature}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("meaning", style="dim")
    rows = [
        ("prompts", _fmt(summary.get("n_prompts")), "prompts run (each turn is a row)"),
        ("tau (micro)", _fmt(summary.get("tau_micro"), 2), "tokens per target forward, all steps pooled"),
        ("tau 95% interval", "-" if summary.get("tau_lo") is None else
         f"{_fmt(summary['tau_lo'], 2)} – {_fmt(summary['tau_hi'], 2)}",
         "bootstrap over prompts: how far the prompt sample alone moves tau"),
        ("tau (macro)", _fmt(summary.get("tau_macro"), 2), "mean over (prompt, turn)"),
        ("acceptance rate", _fmt(summary.get("acceptance_rate")), "accepted drafts / drafted nodes"),
        ("draft share", _fmt(summary.get("draft_share")), "drafting seconds / decode seconds"),
        ("tokens/s", _fmt(summary.get("tokens_per_s"), 1), "decode throughput"),
        ("decode speedup", f"{_fmt(summary.get('decode_speedup_sum'), 2)} | {_fmt(summary.get('decode_speedup_mean'), 2)}",
         "paired with ar: ratio of sums | mean of per-prompt ratios"),
        ("e2e speedup", f"{_fmt(summary.get('e2e_speedup_sum'), 2)} | {_fmt(summary.get('e2e_speedup_mean'), 2)}",
         "the same with prefill included"),
        ("lossless", _lossless_text(summary), "greedy outputs equal ar's token for token"),
    ]
    for row in rows:
        table.add_row(*row)
    out_console.print(table)
    if summary.get("cpu_shared"):
        import torch  # loaded by the run already

        err_console.print(f"[yellow]warning:[/] other processes shared the CPU while this run was timed (1-minute load "
                          f"average up to {summary['load_max']:.1f} against this process's {torch.get_num_threads()} threads): "
                          "its tokens/s and speedups are unreliable; rerun on an idle machine")
    out_console.print(f"results: {outcome.out}")
    if outcome.baseline_source:
        where = outcome.baseline_out if outcome.baseline_source == "ran" else outcome.baseline_source
        out_console.print(f"AR baseline: {where}")


def _frame(rows):
    import pandas as pd

    return pd.DataFrame(rows)


_LOSSLESS_ACROSS_HELP = ("greedy rows with no AR baseline on their own machine check lossless against one from another "
                         "(same target, prompt, settings, dtype), leaving out prompts where those machines' AR outputs differ; "
                         "speedups still pair per machine; implies --allow-mixed")


@app.command()
def compare(
    files: List[str] = typer.Argument(..., help="result files or globs, e.g. 'results/*.parquet'"),
    fmt: str = typer.Option("table", "--format", "-f", help="table (fits the terminal), json, csv or markdown (every field)"),
    allow_mixed: bool = typer.Option(False, "--allow-mixed", help="list results from several devices together"),
    lossless_across: bool = typer.Option(False, "--lossless-across-machines", help=_LOSSLESS_ACROSS_HELP),
    wide: bool = typer.Option(False, "--wide", help="table: every column, full config, at its natural width"),
    columns: Optional[str] = typer.Option(None, "--columns", help="only these columns, in this order, e.g. task,drafter,tau (any format)"),
    sort: Optional[str] = typer.Option(None, "--sort", help="order rows by this column: numbers high to low, text A to Z"),
    depths: Optional[int] = typer.Option(None, "--depths", help="per-depth acceptance up to depth N (default: the deepest accepted)"),
    hardware: List[str] = typer.Option([], "--hardware", help="add the projected decode speedup on this profile (repeatable; see `specbench hardware`)"),
    as_target: Optional[str] = typer.Option(None, "--as-target", help="what-if: price the same acceptance on this model's shape (config.json or bundled name)"),
) -> None:
    """One row per (target, task, drafter, setting): tau, per-depth acceptance, draft share, speedup, lossless."""
    from specbench import report, results

    if fmt not in report.FORMATS:
        raise UserError(f"unknown --format '{fmt}'; use table, json, csv or markdown")
    df = results.read_results(results.expand_globs(files))
    frame = report.compare(df, allow_mixed=allow_mixed, depths=depths, outputs_across_machines=lossless_across)
    # further columns (one per compare row) go into `frame` here, before it is sorted and formatted
    if as_target is not None and not hardware:
        raise UserError("--as-target needs --hardware PROFILE to price the what-if on (e.g. --hardware h100-sxm:engine)")
    notes = [report.cross_machine_note(frame)]
    if hardware:  # projected, not measured: one row per (compare row, profile), labelled in `projection`
        from specbench.hardware.project import add_projections, unpriced_note

        frame = add_projections(df, frame, list(hardware), as_target)
        notes.append(unpriced_note(frame))
        if columns is None:  # the default table plus the projection, side by side with the measured speedup
            keys = [c for c in ("target", "task", "drafter", "setting", *report.SETTING_COLUMNS) if c in frame.columns
                    and (c != "target" or frame["target"].nunique() > 1)]
            columns = ",".join([*keys, "tau", "decode_speedup_sum", "hardware", "projection",
                                "projected_decode_speedup_sum", "projected_decode_speedup_mean", "lossless"])
    chosen = report.parse_columns(frame, columns) if columns is not None else None
    if sort is not None:
        frame = report.sort_compare(frame, sort)
    if fmt == "table":
        typer.echo(report.compare_view(frame, out_console.width, wide=wide, columns=chosen).text(), nl=False)
    else:
        typer.echo(report.format_compare(frame, fmt, columns=chosen), nl=False)
    for note in (*notes, report.shared_cpu_note(df), report.baseline_note(df)):  # on stderr: a piped table or file stays clean
        if note is not None:
            err_console.print(f"[yellow]warning:[/] {note}")


@app.command()
def plot(
    files: List[str] = typer.Argument(..., help="result files or globs, e.g. 'results/*.parquet'"),
    out_dir: Path = typer.Option(Path("reports/figures"), "--out-dir", help="where the PNG figures go"),
    allow_mixed: bool = typer.Option(False, "--allow-mixed", help="plot results from several devices together"),
) -> List[Path]:
    """PNG figures per (target, task): per-depth acceptance, accepted lengths, speedup and tau, time per step."""
    from specbench import plots, report, results

    df = results.read_results(results.expand_globs(files))
    written = plots.make_figures(df, out_dir, allow_mixed=allow_mixed)
    for path in written:
        typer.echo(str(path))
    if (note := report.shared_cpu_note(df)) is not None:  # the timing figures say so too, in their subtitles
        typer.echo(f"warning: {note}", err=True)
    return written


@app.command()
def train(
    drafter: str = typer.Option("eagle3", "--drafter", "-d", help="a learned drafter (see `specbench drafters`)"),
    target: str = typer.Option("smollm2-135m", "--target", help="alias, local model directory or hub id"),
    data: str = typer.Option("all", "--data", help="comma-separated built-in training sets, or all (see `specbench train-sets`)"),
    budget_tokens: int = typer.Option(20_000, "--budget-tokens", help="assistant tokens of training data (same for every drafter)"),
    heldout_tokens: int = typer.Option(6_000, "--heldout-tokens", help="assistant tokens of held-out data"),
    regenerate: Optional[bool] = typer.Option(None, "--regenerate/--no-regenerate",
                                              help="train on answers the target writes itself (default: the recipe's)"),
    options: List[str] = typer.Option([], "--set", help="recipe option key=value (repeatable), e.g. epochs=3"),
    out: Path = typer.Option(..., "--out", help="checkpoint directory (rerun the same command to resume)"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]"),
) -> None:
    """Train a drafter for a target: data, self-distillation, feature cache, trainer, checkpoint."""
    from specbench.targets import load_target
    from specbench.train import pipeline

    job = pipeline.TrainJob(
        drafter=drafter, target=target, data=_train_sets() if data.strip() == "all" else tuple(d.strip() for d in data.split(",") if d.strip()),
        budget_tokens=budget_tokens, heldout_tokens=heldout_tokens, regenerate=regenerate, options=tuple(options),
        out=out, device=device,
    )
    _, recipe = pipeline.validate(job)
    from drafters.common.precision import slow_bf16_note
    from specbench.targets import pick_device

    if (note := slow_bf16_note(getattr(recipe, "precision", "fp32"), pick_device(device))) is not None:
        err_console.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
    import datasets

    from specbench import distributed

    world = distributed.from_env()  # under torchrun: data-parallel training, rank 0 displays and writes
    datasets.disable_progress_bars()  # the rich display below shows every stage
    with LoggedProgress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[label]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, disable=world is not None and world.rank != 0,
    ) as bar:
        tasks: dict[str, int] = {}

        def progress(p: pipeline.Progress) -> None:
            if p.stage not in tasks:
                tasks[p.stage] = bar.add_task(p.stage, total=p.total, label="")
            label = ""
            report = p.fields.get("report")
            if report is not None:
                m = report.metrics
                accs = " ".join(f"{m[k]:.2f}" for k in sorted((k for k in m if k.startswith("acc_")), key=lambda k: int(k[4:])))
                label = f"loss {m.get('loss', float('nan')):.3f} · acc/depth {accs} · {report.tokens_per_s:,.0f} tok/s"
                if report.heldout:
                    h = report.heldout
                    label += f" · held-out acc_0 {h.get('acc_0', float('nan')):.2f}"
            bar.update(tasks[p.stage], completed=p.done, total=p.total, label=label)

        command = "specbench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        summary = pipeline.run_training(job, lambda j: load_target(j.target, j.device, "float32"), progress,
                                        command=command)
    if world is not None and world.rank != 0:
        return

    held = summary["heldout"]
    table = Table(title=f"{drafter} for {target}: held-out metrics after {summary['steps']} steps")
    table.add_column("depth", justify="right")
    table.add_column("top-1 acc", justify="right")
    table.add_column("soft CE", justify="right")
    depths = sorted(int(k[4:]) for k in held if k.startswith("acc_"))
    for d in depths:
        table.add_row(str(d + 1), _fmt(held.get(f"acc_{d}")), _fmt(held.get(f"loss_{d}")))
    out_console.print(table)
    secs = summary["seconds"]
    out_console.print(
        f"{summary['train_loss_tokens']:,} assistant tokens ({summary['train_conversations']} conversations), "
        f"regenerate={summary['job']['regenerate']}; this call: {secs['total_this_call']:.0f} s "
        f"(regenerate {secs['regenerate_this_call']:.0f} s, features {secs['features_this_call']:.0f} s, "
        f"train {secs['train_this_call']:.0f} s)"
    )
    out_console.print(f"checkpoint: {out}" if summary["finished"] else f"unfinished; rerun the same command to resume ({out})")


def _train_sets() -> tuple[str, ...]:
    from specbench.train.data import TRAIN_SETS

    return tuple(TRAIN_SETS)


@app.command("train-sets")
def train_sets() -> None:
    """List the built-in training sets (what `specbench train --data` takes)."""
    from specbench.train.data import TRAIN_SETS

    table = Table(title="training sets (vendored; licences in specbench/train/data/*/SOURCE.md)")
    for col in ("set", "conversations", "description", "licence"):
        table.add_column(col)
    for info in TRAIN_SETS.values():
        table.add_row(info.name, str(info.n_conversations), info.description, info.licence)
    out_console.print(table)


@app.command()
def targets() -> None:
    """List the built-in targets, their size and whether each is cached."""
    from specbench.fetch import ALIASES, alias_dir, is_cached
    from specbench.targets import DEFAULT_TARGET, TINY_TARGETS

    table = Table(title="built-in targets (any local HF model directory works too)")
    for col in ("alias", "model", "download", "cached"):
        table.add_column(col, overflow="fold")  # a path too long for the column folds, never cut to "…"
    for name, info in ALIASES.items():
        label = name + (" (default)" if name == DEFAULT_TARGET else "")
        table.add_row(label, info.description, f"{info.download_mb} MB",
                      str(alias_dir(name)) if is_cached(name) else "no (fetched on first use)")
    for name, desc in TINY_TARGETS.items():
        table.add_row(name, desc, "-", "built in code")
    out_console.print(table)


@app.command()
def tasks() -> None:
    """List the built-in tasks with their prompt counts."""
    from specbench.tasks import TASKS, task_counts

    table = Table(title="tasks (or --task-file FILE.jsonl)")
    for col in ("task", "prompts", "categories", "description"):
        table.add_column(col)
    for name, count, desc in task_counts():
        table.add_row(name, str(count), ", ".join(TASKS[name].categories) or "-", desc)
    out_console.print(table)


@app.command()
def drafters() -> None:
    """List the registered drafters (entry-point group specbench.drafters) and their options."""
    import dataclasses

    from specbench.drafter import available_drafters

    table = Table(title="drafters (options go in as --set key=value)")
    for col in ("drafter", "description", "options (default)"):
        table.add_column(col)
    for name, ep in sorted(available_drafters().items()):
        try:
            cls = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not hide the others
            table.add_row(name, f"[red]failed to load: {exc}", "")
            continue
        opts = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Config))
        table.add_row(name, cls.description, opts or "-")
    out_console.print(table)
    from drafters.common.locate import shipped_defaults

    for target, heads in shipped_defaults().items():  # what path='auto' loads
        out_console.print(f"path='auto' loads the head that ships for the target; {target}: drafters/checkpoints/"
                          + ", ".join(folder for _, folder in sorted(heads.items())), highlight=False)


@app.command()
def sweep(
    file: Path = typer.Argument(..., help="sweep file (TOML): targets, tasks, drafters and settings; see specbench/sweep.py"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the cells and their state; run nothing"),
    executor: Optional[str] = typer.Option(None, "--executor", help="local or ray (default: the file's, else local)"),
    address: Optional[str] = typer.Option(None, "--address", help="join this Ray cluster (default: start a local one)"),
    only: List[str] = typer.Option([], "--only", help="run only the cells whose name matches this glob (repeatable; names: --dry-run)"),
) -> None:
    """Run a grid of `run`s from a sweep file: finished cells skipped, interrupted ones resumed."""
    from specbench import sweep as sweeps

    plan = sweeps.select(sweeps.load_sweep(file, executor), only)
    if dry_run:
        for item in sweeps.describe_view(plan, out_console.width):
            out_console.print(item, crop=False, highlight=False)
        return
    counts = {"done": 0, "skipped": 0, "failed": 0, "running": 0}
    results: list = []
    with LoggedProgress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[label]}"),
        TimeElapsedColumn(), console=err_console, transient=True,
    ) as bar:
        def status() -> str:
            return (f"[green]{counts['done']} done[/] · {counts['skipped']} skipped · "
                    f"[cyan]{counts['running']} running[/] · [red]{counts['failed']} failed[/]")

        overall = bar.add_task(f"sweep {plan.name}", total=len(plan.cells), label=status())
        current = bar.add_task("cell", total=None, label="", visible=plan.executor == "local")

        def start(cell) -> None:
            counts["running"] += 1
            bar.update(overall, label=status())
            bar.update(current, description=cell.name, completed=0, total=None, label="")

        def finish(result) -> None:
            counts["running"] -= 1
            counts[result.status] += 1
            results.append(result)
            bar.update(overall, advance=1, label=status())
            if result.status == "failed":
                err_console.print(f"[red]failed:[/] {result.cell.name}: {result.error}", highlight=False, soft_wrap=True)

        def cell_progress(done: int, total: int, label: str) -> None:
            bar.update(current, completed=done, total=total, label=label)

        events = sweeps.Events(start, finish, cell_progress)
        try:
            sweeps.run_sweep(plan, events, address)
        except KeyboardInterrupt:
            err_console.print(f"interrupted; finished cells are kept — rerun `specbench sweep {file}` to continue",
                              highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None
    failed = [r for r in results if r.status == "failed"]
    out_console.print(f"{plan.name}: {counts['done']} cells run, {counts['skipped']} already finished, "
                      f"{len(failed)} failed, of {len(plan.cells)} → {plan.results_dir}")
    from specbench import report, results as result_files

    ran = [p for r in results if r.status == "done"
           for p in (r.cell.out, result_files.baseline_path(r.cell.out)) if p.exists()]
    if ran:
        if (note := report.shared_cpu_note(result_files.read_results(ran))) is not None:
            err_console.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
    if failed:
        for r in failed:
            err_console.print(f"[bold red]failed cell[/] {r.cell.name}: {r.error}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command()
def tune(
    drafter: str = typer.Option(..., "--drafter", "-d", help="drafter name (see `specbench drafters`)"),
    task: Optional[str] = typer.Option("humaneval", "--task", "-t", help="built-in task (see `specbench tasks`)"),
    task_file: Optional[Path] = typer.Option(None, "--task-file", help="custom prompts: JSONL with id and prompt or turns"),
    category: Optional[str] = typer.Option(None, "--category", help="only this category of the task"),
    budgets: str = typer.Option("16,32,64,128", "--budgets", help="node budgets to run, comma-separated"),
    hardware: List[str] = typer.Option([], "--hardware", help="also project onto this profile (repeatable; see `specbench hardware`)"),
    budget_key: Optional[str] = typer.Option(None, "--budget-key", help="the drafter option the budget sets (default: budget, total_tokens or num_draft)"),
    target: str = typer.Option("smollm2-135m", "--target", help="alias, random:CONFIG, local model directory or hub id"),
    limit: int = typer.Option(10, "--limit", "-n", help="prompts per budget (0 = all)"),
    seed: int = typer.Option(0, "--seed"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
    options: List[str] = typer.Option([], "--set", help="fixed drafter option key=value at every budget (repeatable)"),
    drafter_path: Optional[Path] = typer.Option(None, "--drafter-path", help="checkpoint directory of a learned drafter"),
    results_dir: Path = typer.Option(Path("results/tune"), "--results-dir", help="where the runs go (finished ones are reused)"),
    baseline: bool = typer.Option(True, "--baseline/--no-baseline", help="pair with the AR baseline (needed for the measured speedup)"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16"),
    executor: str = typer.Option("local", "--executor", help="local or ray (as `specbench sweep`)"),
    address: Optional[str] = typer.Option(None, "--address", help="join this Ray cluster"),
    out_dir: Path = typer.Option(Path("reports/figures"), "--out-dir", help="where the figure goes"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """The best budget per device: run (or reuse) a drafter at each budget, then tau, measured and projected speedups."""
    import json

    from specbench import sweep as sweeps
    from specbench import tune as tuning

    if fmt not in ("table", "json"):
        raise UserError(f"unknown --format '{fmt}'; use table or json")
    if executor not in sweeps.EXECUTORS:
        raise UserError(f"unknown --executor '{executor}'; use local or ray")
    check_folder(out_dir, "--out-dir", "the figure")  # now, not after the runs
    spec = tuning.TuneSpec(
        drafter=drafter, task=None if task_file else task, task_file=task_file, category=category,
        budgets=tuning.parse_budgets(budgets), hardware=tuple(hardware), target=target, limit=limit, seed=seed,
        max_new_tokens=max_new_tokens, temperature=temperature, options=tuple(options), drafter_path=drafter_path,
        budget_key=budget_key, results_dir=results_dir, baseline=baseline, device=device, dtype=dtype, executor=executor,
    )
    plan, key, sweep_file = tuning.write_sweep(spec)
    failed: list = []
    with LoggedProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[label]}"),
                        TimeElapsedColumn(), console=err_console, transient=True) as bar:
        overall = bar.add_task(f"tune {drafter}", total=len(plan.cells), label="")
        current = bar.add_task("cell", total=None, label="", visible=plan.executor == "local")

        def start(cell) -> None:
            bar.update(current, description=cell.name, completed=0, total=None, label="")

        def finish(result) -> None:
            bar.update(overall, advance=1, label=f"{result.cell.name}: {result.status}")
            if result.status == "failed":
                failed.append(result)
                err_console.print(f"[red]failed:[/] {result.cell.name}: {result.error}", highlight=False, soft_wrap=True)

        def cell_progress(done: int, total: int, label: str) -> None:
            bar.update(current, completed=done, total=total, label=label)

        try:
            sweeps.run_sweep(plan, sweeps.Events(start, finish, cell_progress), address)
        except KeyboardInterrupt:
            err_console.print("interrupted; finished budgets are kept — rerun the same command to continue",
                              highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None
    result = tuning.collect(plan, spec, key, sweep_file)
    machine = ""
    if result.rows:
        import pandas as pd

        first = pd.read_parquet(result.rows[0]["file"], columns=["device_name"])
        machine = str(first["device_name"].iloc[0]) if len(first) else ""
    figure = None
    if result.rows:
        figure = tuning.plot_tune(result, out_dir / f"{tuning.file_stem(spec)}.png", machine)
    if fmt == "json":
        typer.echo(json.dumps({**result.as_json(), "machine": machine, "figure": None if figure is None else str(figure)}))
    else:
        table = Table(title=f"{drafter} on {target} · {tuning.task_label(spec)}: tau and decode speedup (ratio of sums) by {key}")
        table.add_column(key, justify="right")
        table.add_column("prompts", justify="right")
        table.add_column("mean tree", justify="right")
        table.add_column("tau", justify="right")
        for device in result.devices:
            table.add_column(f"measured ({machine})" if device == tuning.MEASURED else f"{device} (projected)", justify="right")
        for r in result.rows:
            table.add_row(str(r["budget"]), str(r["n_prompts"]), _fmt(r["mean_tree_size"], 1), _fmt(r["tau"], 2),
                          *(_fmt(tuning.speedup_of(r, d), 2) for d in result.devices))
        out_console.print(table)
        best = Table(title="the best budget per device")
        for col in ("device", "kind", f"best {key}", "decode speedup", "tau"):
            best.add_column(col, justify="left" if col in ("device", "kind") else "right")
        for b in result.best:
            name = machine if b["device"] == tuning.MEASURED and machine else b["device"]
            best.add_row(name, b["kind"], _fmt(b["best_budget"]), _fmt(b["decode_speedup_sum"], 2), _fmt(b["tau"], 2))
        out_console.print(best)
        if not baseline:
            out_console.print("no measured speedup: --no-baseline skips the AR baseline")
        out_console.print(f"sweep file: {sweep_file}" + (f"\nfigure: {figure}" if figure is not None else ""))
    if failed:
        raise typer.Exit(1)


@app.command()
def bench(
    target: str = typer.Option("smollm2-135m", "--target", help="alias, local model directory or hub id"),
    task: str = typer.Option("humaneval", "--task", "-t", help="built-in task (see `specbench tasks`)"),
    limit: int = typer.Option(10, "--limit", "-n", help="prompts (a deterministic subset)"),
    seed: int = typer.Option(0, "--seed"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens"),
    pairs: str = typer.Option("ar,ngram,draft-model", "--pairs", help="pairs to run, comma-separated: ar, ngram, draft-model"),
    ngram_set: List[str] = typer.Option([], "--ngram-set", help="ngram option key=value (repeatable; default: its defaults)"),
    draft: str = typer.Option("", "--draft", help="draft LM for draft-model and assisted generation (without it that pair is skipped)"),
    draft_set: List[str] = typer.Option([], "--draft-set", help="draft-model option key=value (repeatable)"),
    hf_assist: List[str] = typer.Option([], "--hf-assist", help="assistant generation-config field for transformers, e.g. num_assistant_tokens=5"),
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = torch's default; 1 is steadier on a busy machine)"),
    out: Optional[Path] = typer.Option(None, "--out", help="markdown report, JSON beside it (default reports/bench_<target>.md)"),
) -> None:
    """specbench against transformers' own decoding (generate, prompt lookup, assisted), interleaved in one process."""
    from specbench import bench as benchmod

    argv = ["--target", target, "--task", task, "--limit", str(limit), "--seed", str(seed),
            "--max-new-tokens", str(max_new_tokens), "--pairs", pairs, "--threads", str(threads)]
    argv += [a for kv in ngram_set for a in ("--ngram-set", kv)]
    argv += [a for kv in draft_set for a in ("--draft-set", kv)]
    argv += [a for kv in hf_assist for a in ("--hf-assist", kv)]
    if draft:
        argv += ["--draft", draft]
    if out is not None:
        argv += ["--out", str(out)]
    benchmod.main(argv, prog="specbench bench")


@app.command(epilog="Against a run's own result files it retraces that run step for step. ngram or draft-model "
             "alone tunes its defaults; those modes' own knobs: python -m specbench.replay --help")
def replay(
    drafter: str = typer.Argument(..., help="any drafter (see `specbench drafters`); ngram or draft-model alone tunes its defaults"),
    refs: List[str] = typer.Argument(None, help="result files or globs whose prompts and greedy outputs to replay "
                                     "against (e.g. a sweep's AR baseline); default: generate them"),
    set_: List[str] = typer.Option([], "--set", help="a drafter option every setting shares, key=value (repeatable)"),
    vary: List[str] = typer.Option([], "--vary", help="a drafter option at each value, key=v1,v2 (repeatable: a grid)"),
    target: Optional[str] = typer.Option(None, "--target", help="default smollm2-135m, or the one the result files name"),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="comma-separated; with result files, only their rows of these"),
    limit: int = typer.Option(10, "--limit", "-n", help="prompts per task, when generating references"),
    seed: int = typer.Option(0, "--seed"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens"),
    hardware: List[str] = typer.Option([], "--hardware", help="also project each setting's decode speedup onto this "
                                       "profile (repeatable; see `specbench hardware`)"),
    as_target: Optional[str] = typer.Option(None, "--as-target", help="with --hardware: price the steps as if the target "
                                            "had this shape"),
    draft: str = typer.Option("", "--draft", help="draft-model tuning: the draft LM"),
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = torch's default; 1 is steadier on a busy machine)"),
    out: Optional[Path] = typer.Option(None, "--out", help="markdown table, JSON beside it"),
) -> None:
    """Replay greedy decoding on the target's outputs: tau (and projected speedups) of any setting, no verify forward."""
    from specbench import replay as replaymod
    from specbench import results

    argv = [drafter, "--limit", str(limit), "--seed", str(seed), "--max-new-tokens", str(max_new_tokens),
            "--threads", str(threads)]
    argv += [a for kv in set_ for a in ("--set", kv)]
    argv += [a for kv in vary for a in ("--vary", kv)]
    argv += [a for name in hardware for a in ("--hardware", name)]
    for flag, value in (("--target", target), ("--tasks", tasks), ("--as-target", as_target), ("--draft", draft or None),
                        ("--out", None if out is None else str(out))):
        if value is not None:
            argv += [flag, value]
    if refs:
        argv += ["--refs", *map(str, results.expand_globs(refs))]
    replaymod.main(argv, prog="specbench replay")


# ---------------------------------------------------------------------------- hardware profiles

hardware_app = typer.Typer(cls=_Group, help="Hardware cost profiles: list them, print T_fwd(n), check the calibration.",
                           invoke_without_command=True, no_args_is_help=False)
app.add_typer(hardware_app, name="hardware")


@hardware_app.callback()
def hardware(ctx: typer.Context) -> None:
    """List the analytic profiles (HARDWARE.md) and the measured ones (`specbench profile`)."""
    if ctx.invoked_subcommand is not None:
        return
    from specbench.hardware.analytic import ANALYTIC_PROFILES
    from specbench.hardware.profiles import list_measured, profile_dir

    table = Table(title=f"hardware profiles (measured ones live in {profile_dir()})")
    for col in ("profile", "kind", "description"):
        table.add_column(col)
    for name, prof in ANALYTIC_PROFILES.items():
        table.add_row(name, "analytic", prof.description)
    for prof in list_measured():
        table.add_row(prof.name, "measured", prof.description)
    out_console.print(table)


@hardware_app.command("latency")
def hardware_latency(
    profile: str = typer.Option(..., "--profile", "-p", help="a profile from `specbench hardware`"),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="HF config.json, model directory or bundled shape (e.g. llama-3.1-8b)"),
    tokens: str = typer.Option("1,64,256", "--tokens", help="query token counts n, comma-separated"),
    context: int = typer.Option(512, "--context", help="cached positions before the forward"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """T_fwd(n) in milliseconds: one target forward over n query tokens at --context."""
    import json

    from specbench.hardware.analytic import load_shape
    from specbench.hardware.measure import parse_ints
    from specbench.hardware.profiles import MeasuredProfile, get_profile

    if fmt not in ("table", "json"):
        raise UserError(f"unknown --format '{fmt}'; use table or json")
    if context < 0:
        raise UserError(f"--context must be >= 0, got {context}")
    ns = parse_ints(tokens, "--tokens")
    prof = get_profile(profile)
    if config is None and not isinstance(prof, MeasuredProfile):
        raise UserError(f"--config is needed with the analytic profile '{profile}' (e.g. --config llama-3.1-8b)")
    shape = load_shape(config) if config is not None else None
    rows = [{"n": n, "ms": prof.t_fwd(shape, n, context) * 1e3} for n in ns]
    if fmt == "json":
        typer.echo(json.dumps(rows))
        return
    label = shape.name if shape is not None else prof.target
    table = Table(title=f"T_fwd(n) of {label} on {profile} at context {context}")
    table.add_column("n", justify="right")
    table.add_column("ms", justify="right")
    for r in rows:
        table.add_row(str(r["n"]), f"{r['ms']:.3f}")
    out_console.print(table)


@hardware_app.command("calibrate")
def hardware_calibrate(
    out_dir: Path = typer.Option(Path("reports/figures"), "--out-dir", help="where the calibration figure goes"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """Every published point of HARDWARE.md: model value, published value, error; and the figure."""
    import json

    from specbench.hardware import calibration

    if fmt not in ("table", "json"):
        raise UserError(f"unknown --format '{fmt}'; use table or json")
    check_folder(out_dir, "--out-dir", "the figure")
    results_ = calibration.calibration_table()
    paths = calibration.plot_calibration(out_dir)
    if fmt == "json":
        typer.echo(json.dumps([{"point": r.point.key, "profile": r.point.profile, "model": r.model,
                                "published": r.point.published, "error": r.error, "tolerance": r.point.tolerance,
                                "ok": r.ok, "conflict": calibration.CONFLICTS.get(r.point.key, [None])[0]}
                               for r in results_]))
        return
    table = Table(title="analytic profiles against the published points (HARDWARE.md)")
    for col in ("point", "profile", "model", "published", "error", "tol", "ok"):
        table.add_column(col, justify="left" if col in ("point", "profile") else "right")
    for r in results_:
        ok = "yes" if r.ok else ("conflict" if r.point.key in calibration.CONFLICTS else "NO")
        table.add_row(r.point.key, r.point.profile, f"{r.model:.3f}", f"{r.point.published:.3f}",
                      f"{r.error:+.1%}", f"{r.point.tolerance:.0%}", ok)
    out_console.print(table)
    for p in paths:
        out_console.print(f"figure: {p}")


@hardware_app.command("overhead")
def hardware_overhead(
    target: str = typer.Option("smollm2-135m", "--target", help="alias, random:CONFIG shape target, tiny-*, local directory"),
    nodes: int = typer.Option(256, "--nodes", help="tree size, root included"),
    depth: int = typer.Option(8, "--depth", help="layers below the root (a path this deep is accepted)"),
    context: int = typer.Option(512, "--context", help="cached positions before the step"),
    repeats: int = typer.Option(10, "--repeats", help="timed steps (median kept per part)"),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (0 = leave as is)"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """The harness's own time per decode step (tree build, mask, acceptance, commit) against the target forward."""
    import json

    import torch

    from specbench.hardware.overhead import PARTS, measure_overhead
    from specbench.targets import load_target

    if fmt not in ("table", "json"):
        raise UserError(f"unknown --format '{fmt}'; use table or json")
    if threads < 0:
        raise UserError(f"--threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    with LoggedProgress(TextColumn("[bold]{task.description}"), TextColumn("{task.fields[label]}"), TimeElapsedColumn(),
                        console=err_console, transient=True) as bar:
        job = bar.add_task(f"step overhead on {target}", label="loading")
        tgt = load_target(target, device, dtype)
        result = measure_overhead(tgt, target, nodes=nodes, depth=depth, context=context, repeats=repeats,
                                  progress=lambda label: bar.update(job, label=label))
    if fmt == "json":
        typer.echo(json.dumps(result.as_json()))
        return
    table = Table(title=f"one greedy step of {target}: {result.nodes} nodes, {result.accepted} accepted, context "
                        f"{result.context}, {result.device} {result.dtype}, {result.threads} threads (median of {repeats})")
    for col in ("part", "ms", "share of step"):
        table.add_column(col, justify="left" if col == "part" else "right")
    for part in PARTS:
        ms = result.ms[part]
        table.add_row(part + (" (model)" if part == "forward" else ""), f"{ms:.3f}", f"{ms / result.step_ms:.2%}")
    table.add_row("[bold]harness (all but the forward)", f"{result.non_model_ms:.3f}", f"[bold]{result.non_model_share:.2%}")
    out_console.print(table)


@app.command()
def profile(
    target: str = typer.Option(..., "--target", help="alias, random:CONFIG shape target, tiny-*, local directory"),
    name: str = typer.Option(..., "--name", help="name of the saved profile (see `specbench hardware`)"),
    tokens: str = typer.Option("1,2,4,8,16,32,64,128,256,512", "--tokens", help="query token counts n"),
    contexts: str = typer.Option("128,1024,4096", "--contexts", help="context lengths to time at"),
    drafter: List[str] = typer.Option([], "--drafter", "-d", help="also time this drafter per forward (repeatable; NAME or NAME:k=v,k=v)"),
    repeats: int = typer.Option(5, "--repeats", help="timed forwards per point (median kept)"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16"),
    compile_: bool = typer.Option(False, "--compile", help="CUDA: time the static-cache, CUDA-graph forward (an engine-like profile)"),
) -> None:
    """Measure T_fwd(n) on this device (tree masks, a few contexts) and drafter cost; save a profile."""
    from specbench.hardware import measure
    from specbench.hardware.profiles import check_name, save_measured
    from specbench.targets import load_target

    check_name(name)
    if repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {repeats}")
    req = measure.ProfileRequest(name=name, ns=measure.parse_ints(tokens, "--tokens"),
                                 contexts=measure.parse_ints(contexts, "--contexts"), drafters=tuple(drafter),
                                 repeats=repeats)
    total = len(req.ns) * len(req.contexts) + len(req.drafters)
    if compile_:
        from specbench.static import bucket, check_compile, make_static
        from specbench.targets import pick_device

        check_compile(pick_device(device))  # a user error before any progress display
    with LoggedProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[label]}"), TimeElapsedColumn(), console=err_console, transient=True) as bar:
        job = bar.add_task(f"profiling {target}", total=total, label="loading")
        tgt = load_target(target, device, dtype)
        if compile_:
            tgt = make_static(tgt, True, max_len=bucket(max(req.contexts) + max(req.ns) + 1))

        def progress(label: str) -> None:
            bar.update(job, advance=1, label=label)

        prof = measure.run_profile(tgt, target, req, progress)
    path = save_measured(prof)
    table = Table(title=f"T_fwd(n) ms of {target} on {prof.fingerprint.get('device_name')} ({prof.fingerprint.get('dtype')})")
    table.add_column("n", justify="right")
    for c in prof.contexts:
        table.add_column(f"ctx {c}", justify="right")
    for j, n in enumerate(prof.ns):
        table.add_row(str(n), *(f"{prof.t_fwd_ms[i][j]:.3f}" for i in range(len(prof.contexts))))
    out_console.print(table)
    for d, entry in prof.drafters.items():
        out_console.print(f"drafter {d}: {entry['ms_per_forward']:.3f} ms per forward, {entry['ms_per_step']:.3f} ms draft per step")
    out_console.print(f"profile '{name}' saved: {path}")


@app.command("export")
def export_cmd(
    src: Path = typer.Argument(..., help="a trained drafter's checkpoint directory (e.g. drafters/checkpoints/eagle3-smollm2-135m)"),
    out: Path = typer.Argument(..., help="the new folder to write"),
    fmt: str = typer.Option("speculators", "--format", "-f", help="speculators (what `vllm serve OUT` reads)"),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="the target as vLLM loads it: HF id or model directory (default: the checkpoint's own target)"),
    tokens: int = typer.Option(3, "--tokens", help="speculative tokens per step vLLM uses by default"),
) -> None:
    """Write a drafter checkpoint in a serving format: EAGLE-3 heads for vLLM (speculators)."""
    from specbench import export

    if fmt not in export.FORMATS:
        raise UserError(f"unknown --format '{fmt}'; use {', '.join(export.FORMATS)}")
    config = export.export_speculators(src, out, verifier, tokens)
    name = config["speculators_config"]["verifier"]["name_or_path"]
    typer.echo(f"{out}: EAGLE-3 in the speculators format, verifier {name}, "
               f"{config['draft_vocab_size']}-token draft vocabulary\nserve it with: vllm serve {out}")


@app.command("report")
def report_cmd(
    files: List[str] = typer.Argument(..., help="result files or globs, e.g. 'results/*.parquet'"),
    out: Path = typer.Option(..., "--out", help="folder for report.html, report.md and figures/"),
    title: Optional[str] = typer.Option(None, "--title", help="the page title"),
    allow_mixed: bool = typer.Option(False, "--allow-mixed", help="report results from several devices together"),
    lossless_across: bool = typer.Option(False, "--lossless-across-machines", help=_LOSSLESS_ACROSS_HELP),
) -> None:
    """One page from result files: DIR/report.html (self-contained) and DIR/report.md with PNG/PDF figures."""
    from specbench import results
    from specbench.reporting import write_report

    paths = results.expand_globs(files)
    with err_console.status("drawing the report"):
        written = write_report(paths, out, allow_mixed=allow_mixed, title=title, lossless_across_machines=lossless_across)
    out_console.print(f"{written.html}\n{written.markdown}\n{len(written.figures)} figure files in {out / 'figures'}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # outside a command (the group's invoke says what a command leaves)
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
