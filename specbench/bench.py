"""specbench against transformers' own decoding, in one process, on the same prompts, interleaved.

Three pairs (each a specbench method and its transformers counterpart, greedy):

1. ``ar`` through specbench's loop against ``model.generate(do_sample=False)``;
2. ``ngram`` against prompt-lookup decoding (``prompt_lookup_num_tokens`` / ``max_matching_ngram_size``
   set to the ngram drafter's ``num_draft`` / ``max_n``);
3. ``draft-model`` against assisted generation (``assistant_model=``) with the SAME draft model object
   (transformers' defaults: 20 draft tokens at most, constant schedule, confidence threshold 0.4;
   ``--hf-assist key=value`` changes the assistant's generation config).

Per prompt every method runs once, in an order that alternates between prompts (specbench first on
even prompts, transformers first on odd ones) so that a drift in machine load hits both sides.
Reported: end-to-end tokens/s of each side (specbench: prefill + decode; transformers: the whole
``generate`` call) and their ratio, each method's end-to-end speedup over its own greedy baseline,
specbench's decode-only figures (tau, draft share), whether outputs agree, and the harness's own
overhead per step. Writes a markdown table and a JSON file (``--out``, default
``reports/bench_<target>.md`` / ``.json``) and prints a rich table.

Run: ``python -m specbench.bench --target smollm2-135m --task humaneval --limit 10`` or
``specbench bench ...`` (same options).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from specbench.decode import Generation, generate
from specbench.drafter import Sampling, config_json, drafter_class, parse_config
from specbench.errors import UserError
from specbench.outputs import check_out_file, write_report
from specbench.report import cpu_shared
from specbench.results import env_fingerprint, load_average
from specbench.targets import load_target
from specbench.tasks import load_task, render_chat, select

PAIRS = ("ar", "ngram", "draft-model")
HF_NAME = {"ar": "generate", "ngram": "prompt lookup", "draft-model": "assisted"}


def _until_stop(ids: list[int], stop: set[int]) -> list[int]:
    for i, tok in enumerate(ids):
        if tok in stop:
            return ids[: i + 1]
    return ids


def _coerce(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(value.lower(), value)


def _assistant_settings(config) -> dict:
    """The assistant's draft-length settings as assisted generation will use them (unset = upstream default)."""
    defaults = config._get_default_generation_params()
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    return {k: getattr(config, k) if getattr(config, k, None) is not None else defaults.get(k) for k in keys}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specbench bench", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--task", default="humaneval")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--pairs", default="ar,ngram,draft-model", help="which pairs to run (comma-separated: ar, ngram, draft-model)")
    ap.add_argument("--ngram-set", action="append", default=[], metavar="KEY=VALUE", help="ngram option (default: its defaults)")
    ap.add_argument("--draft", default="", help="the draft LM for draft-model / assisted (alias or directory); "
                    "without it the draft-model pair is skipped")
    ap.add_argument("--draft-set", action="append", default=[], metavar="KEY=VALUE", help="draft-model option (default: its defaults)")
    ap.add_argument("--hf-assist", action="append", default=[], metavar="KEY=VALUE",
                    help="assistant generation-config field for transformers' assisted generation, e.g. num_assistant_tokens=5")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default); 1 is steadier on a busy machine")
    ap.add_argument("--out", type=Path, default=None, help="markdown report; JSON beside it (default reports/bench_<target>.md)")
    return ap


def main(argv: list[str] | None = None, prog: str = "python -m specbench.bench") -> dict:
    import sys

    args = _parser().parse_args(argv)
    argv_used = list(argv) if argv is not None else sys.argv[1:]
    if args.limit < 1:
        raise UserError(f"--limit must be at least 1, got {args.limit}")
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.threads < 0:
        raise UserError(f"--threads must be >= 0 (0 = torch's default), got {args.threads}")
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    if not pairs:
        raise UserError(f"--pairs names no pair; choose from {', '.join(PAIRS)}")
    for p in pairs:
        if p not in PAIRS:
            raise UserError(f"unknown pair '{p}' in --pairs; choose from {', '.join(PAIRS)}")
    if "draft-model" in pairs and not args.draft:
        pairs.remove("draft-model")
    out = args.out or Path(f"reports/bench_{args.target.replace('/', '_')}.md")
    check_out_file(out)  # before the model loads, not after the run
    if args.threads:
        torch.set_num_threads(args.threads)

    load_before = load_average()
    target = load_target(args.target)
    model, tok = target.model, target.tokenizer
    stop = set(target.stop_token_ids)
    prompts = select(load_task(args.task), args.limit, args.seed)
    greedy = Sampling()

    drafters = {"ar": drafter_class("ar")(target)}
    configs: dict[str, str] = {}
    if "ngram" in pairs:
        cls = drafter_class("ngram")
        drafters["ngram"] = cls(target, parse_config(cls.Config, args.ngram_set))
    if "draft-model" in pairs:
        cls = drafter_class("draft-model")
        drafters["draft-model"] = cls(target, parse_config(cls.Config, [f"model={args.draft}", *args.draft_set]))
    for name, d in drafters.items():
        configs[name] = config_json(d.config) if hasattr(d, "config") else "{}"

    hf_common = dict(do_sample=False, max_new_tokens=args.max_new_tokens, eos_token_id=list(stop),
                     pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else list(stop)[0])
    hf_extra: dict[str, dict] = {"ar": {}}
    if "ngram" in pairs:
        ncfg = drafters["ngram"].config
        hf_extra["ngram"] = dict(prompt_lookup_num_tokens=ncfg.num_draft, max_matching_ngram_size=ncfg.max_n)
    assistant = None
    if "draft-model" in pairs:
        assistant = drafters["draft-model"].draft.model  # the same weights, the same object
        for pair in args.hf_assist:
            if "=" not in pair:
                raise UserError(f"--hf-assist expects key=value, got '{pair}'")
            key, value = pair.split("=", 1)
            setattr(assistant.generation_config, key.strip(), _coerce(value.strip()))
        hf_extra["draft-model"] = dict(assistant_model=assistant)
    hf_settings = {
        "ar": "greedy",
        "ngram": json.dumps(hf_extra.get("ngram", {})),
        "draft-model": json.dumps(_assistant_settings(assistant.generation_config)) if assistant is not None else "",
    }

    def hf(ids: torch.Tensor, method: str) -> tuple[list[int], float]:
        t0 = time.perf_counter()
        out = model.generate(ids[None], attention_mask=torch.ones_like(ids[None]), **hf_common, **hf_extra[method])
        return _until_stop(out[0, ids.numel():].tolist(), stop), time.perf_counter() - t0

    def ours(ids: torch.Tensor, method: str) -> Generation:
        return generate(target, drafters[method], ids, args.max_new_tokens, greedy)

    # warm-up: every method once on a short generation
    warm = torch.tensor(render_chat(tok, [{"role": "user", "content": prompts[0].turns[0]}]))
    for method in pairs:
        generate(target, drafters[method], warm, 8, greedy)
        model.generate(warm[None], attention_mask=torch.ones_like(warm[None]), **{**hf_common, "max_new_tokens": 8}, **hf_extra[method])

    keys = ("tok", "s", "dec_s", "draft_s", "other_s", "steps", "hf_tok", "hf_s", "same_as_hf_greedy", "same_as_ar")
    tot = {m: dict.fromkeys(keys, 0.0) for m in pairs}
    per_prompt = []
    for k, p in enumerate(prompts):
        ids = torch.tensor(render_chat(tok, [{"role": "user", "content": p.turns[0]}]))
        row: dict = {"id": p.id, "prompt_tokens": ids.numel()}
        outputs: dict[str, list[int]] = {}
        for method in pairs:
            order = ("ours", "hf") if k % 2 == 0 else ("hf", "ours")
            for side in order:
                if side == "ours":
                    g = ours(ids, method)
                    outputs[method] = g.output_ids
                    t = tot[method]
                    t["tok"] += len(g.output_ids)
                    t["s"] += g.prefill_s + g.decode_s
                    t["dec_s"] += g.decode_s
                    t["draft_s"] += sum(s.draft_s for s in g.steps)
                    t["other_s"] += sum(s.other_s for s in g.steps)
                    t["steps"] += len(g.steps)
                    row[f"{method}_tok"], row[f"{method}_s"] = len(g.output_ids), g.prefill_s + g.decode_s
                else:
                    hf_ids, hf_s = hf(ids, method)
                    outputs[f"hf_{method}"] = hf_ids
                    tot[method]["hf_tok"] += len(hf_ids)
                    tot[method]["hf_s"] += hf_s
                    row[f"hf_{method}_tok"], row[f"hf_{method}_s"] = len(hf_ids), hf_s
        reference = outputs.get("hf_ar")
        for method in pairs:
            same_hf = reference is not None and outputs[f"hf_{method}"] == reference
            same_ar = outputs[method] == outputs["ar"] if "ar" in outputs else False
            tot[method]["same_as_hf_greedy"] += same_hf
            tot[method]["same_as_ar"] += same_ar
            row[f"{method}_same_as_ar"] = same_ar
            row[f"hf_{method}_same_as_hf_greedy"] = same_hf
        row["load_1min"] = load_average()
        per_prompt.append(row)
        print(f"{p.id}: " + ", ".join(f"{m} {row[f'{m}_tok'] / row[f'{m}_s']:.1f} vs {row[f'hf_{m}_tok'] / row[f'hf_{m}_s']:.1f} tok/s"
                                      for m in pairs), flush=True)

    summary = {}
    for method in pairs:
        t = tot[method]
        ours_tps, hf_tps = t["tok"] / t["s"], t["hf_tok"] / t["hf_s"]
        summary[method] = {
            "specbench": method, "transformers": HF_NAME[method], "config": configs[method], "hf_settings": hf_settings[method],
            "tok_s": ours_tps, "hf_tok_s": hf_tps, "ratio": ours_tps / hf_tps,
            "tau": t["tok"] / t["steps"], "decode_tok_s": t["tok"] / t["dec_s"], "draft_share": t["draft_s"] / t["dec_s"],
            "overhead_share": t["other_s"] / t["dec_s"],
            "same_as_ar": int(t["same_as_ar"]), "hf_same_as_hf_greedy": int(t["same_as_hf_greedy"]), "prompts": len(prompts),
        }
    if "ar" in summary:
        for method in pairs:
            s = summary[method]
            s["speedup_e2e"] = s["tok_s"] / summary["ar"]["tok_s"]
            s["hf_speedup_e2e"] = s["hf_tok_s"] / summary["ar"]["hf_tok_s"]
            s["decode_speedup"] = s["decode_tok_s"] / summary["ar"]["decode_tok_s"]

    env = env_fingerprint(target.device.type, str(target.dtype).removeprefix("torch."))
    command = f"{prog} " + " ".join(shlex.quote(a) for a in argv_used)
    report = {"command": command, "target": args.target, "task": args.task, "draft": args.draft, "max_new_tokens": args.max_new_tokens,
              "env": env, "load_before": load_before, "load_max": max((r["load_1min"] for r in per_prompt), default=None),
              "shared_machine_note": load_note(load_before, [r["load_1min"] for r in per_prompt], torch.get_num_threads()),
              "summary": summary, "per_prompt": per_prompt}
    write_report(out, markdown(report), report)
    print_table(report)
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return report


def load_note(before: float | None, during: list[float | None], threads: int) -> str:
    """One sentence on how busy the machine was: the 1-minute load average before the run and its
    peak after the prompts, against the threads this process runs (its own share of the load).

    The verdict rests on the peak alone: the average lags by about a minute, so a load left over
    from a process that just ended shows before the run without sharing the CPU during it."""
    seen = [x for x in during if x is not None]
    if before is None or not seen:
        return ("The load average is not available here; the ratios come from one process on the same prompts, "
                "interleaved, which cancels a slow drift in load but not another process competing for the cores.")
    peak = max(seen)
    if cpu_shared(peak, threads):
        verdict = ("other processes shared the CPU: tok/s are deflated and the ratios unreliable (interleaving cancels "
                   "a slow drift in load, not contention); rerun on an idle machine.")
    else:
        verdict = "the machine was otherwise idle; the ratios come from one process on the same prompts, interleaved."
    return (f"1-minute load average {before:.2f} before the run, at most {peak:.2f} after a prompt, against this "
            f"process's {threads} threads: " + verdict)


def _speed(s: dict, key: str) -> str:
    return f"{s[key]:.2f}x" if key in s else "-"


def markdown(report: dict) -> str:
    env = report["env"]
    lines = [
        f"# specbench against transformers: {report['target']}" + (f" (draft {report['draft']})" if report["draft"] else ""),
        "", f"`{report['command']}`", "",
        f"Machine: {env['cpu_model']}, {env['threads']} threads, {env['device']} {env['dtype']}, torch {env['torch_version']}, "
        f"transformers {env['transformers_version']}, specbench {env['specbench_sha']}. {report['shared_machine_note']}",
        "", f"Task {report['task']}, {next(iter(report['summary'].values()))['prompts']} prompts, greedy, "
        f"up to {report['max_new_tokens']} new tokens.", "",
        "| specbench | transformers | specbench tok/s | transformers tok/s | ratio | specbench speedup over ar | transformers speedup over generate | tau | draft share | outputs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in report["summary"].values():
        lines.append(
            f"| {s['specbench']} | {s['transformers']} | {s['tok_s']:.2f} | {s['hf_tok_s']:.2f} | **{s['ratio']:.2f}** | "
            f"{_speed(s, 'speedup_e2e')} | {_speed(s, 'hf_speedup_e2e')} | {s['tau']:.2f} | {100 * s['draft_share']:.0f}% | "
            f"= ar {s['same_as_ar']}/{s['prompts']}, transformers = its greedy {s['hf_same_as_hf_greedy']}/{s['prompts']} |")
    lines += ["", "tok/s are end to end (specbench: prefill + decode; transformers: the whole `generate` call), summed over prompts.", ""]
    for s in report["summary"].values():
        lines.append(f"- `{s['specbench']}` config {s['config']}; transformers {s['hf_settings']}; specbench decode-only "
                     f"{s['decode_tok_s']:.2f} tok/s" + (f" (decode speedup over ar {s['decode_speedup']:.2f}x)" if "decode_speedup" in s else "")
                     + f"; harness overhead {100 * s['overhead_share']:.2f}% of decode time.")
    return "\n".join(lines) + "\n"


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"specbench vs transformers on {report['target']} ({report['task']})")
    for col in ("specbench", "transformers", "tok/s", "hf tok/s", "ratio", "speedup", "hf speedup", "tau", "draft share", "= ar"):
        table.add_column(col, justify="left" if col in ("specbench", "transformers") else "right")
    for s in report["summary"].values():
        table.add_row(s["specbench"], s["transformers"], f"{s['tok_s']:.2f}", f"{s['hf_tok_s']:.2f}", f"{s['ratio']:.2f}",
                      _speed(s, "speedup_e2e"), _speed(s, "hf_speedup_e2e"), f"{s['tau']:.2f}", f"{100 * s['draft_share']:.0f}%",
                      f"{s['same_as_ar']}/{s['prompts']}")
    Console().print(table)


if __name__ == "__main__":
    try:
        main()
    except UserError as exc:
        raise SystemExit(f"error: {exc}") from None
    except KeyboardInterrupt:
        print("interrupted; no report was written", file=sys.stderr)
        raise SystemExit(130) from None
