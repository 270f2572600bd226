"""Harness benchmark: is the same-stack baseline honest, and what does the harness itself cost?

Measured in ONE process on the same prompts, interleaved prompt by prompt:

1. ``ar`` through specbench's loop against transformers ``generate(do_sample=False)``: end-to-end
   tokens/s of each (our prefill + decode against HF's whole call) and whether the tokens agree;
2. ``ngram`` against transformers' prompt-lookup assisted generation
   (``prompt_lookup_num_tokens``, ``max_matching_ngram_size``) with the same draft length and
   n-gram size, each as a speedup over its own greedy baseline;
3. the harness's own overhead per step (everything outside draft and the target forward +
   verification) as a share of step time.

Run: ``python -m specbench.bench --target smollm2-135m --limit 10 --max-new-tokens 128``.
Writes a markdown report (``--out``, default reports/harness_bench.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specbench.decode import generate
from specbench.drafter import Sampling, drafter_class, parse_config
from specbench.results import env_fingerprint
from specbench.targets import load_target
from specbench.tasks import load_task, render_chat, select


def _until_stop(ids: list[int], stop: set[int]) -> list[int]:
    for i, tok in enumerate(ids):
        if tok in stop:
            return ids[: i + 1]
    return ids


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--task", default="humaneval")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-draft", type=int, default=7)
    ap.add_argument("--max-n", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("reports/harness_bench.md"))
    args = ap.parse_args(argv)

    target = load_target(args.target)
    model, tok = target.model, target.tokenizer
    stop = set(target.stop_token_ids)
    prompts = select(load_task(args.task), args.limit, args.seed)
    ar = drafter_class("ar")(target)
    ngram_cls = drafter_class("ngram")
    ngram = ngram_cls(target, parse_config(ngram_cls.Config, [f"num_draft={args.num_draft}", f"max_n={args.max_n}"]))
    greedy = Sampling()
    hf_common = dict(do_sample=False, max_new_tokens=args.max_new_tokens, eos_token_id=list(stop),
                     pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else list(stop)[0])
    totals = {k: 0.0 for k in ("ar_tok", "ar_s", "ar_dec_s", "ar_other_s", "ng_tok", "ng_s", "ng_dec_s", "ng_other_s",
                               "hf_tok", "hf_s", "pld_tok", "pld_s", "ar_steps", "ng_steps")}
    agree = 0
    pld_agree = 0

    def hf(ids: torch.Tensor, **extra) -> tuple[list[int], float]:
        t0 = time.perf_counter()
        out = model.generate(ids[None], attention_mask=torch.ones_like(ids[None]), **hf_common, **extra)
        return _until_stop(out[0, ids.numel():].tolist(), stop), time.perf_counter() - t0

    warm = torch.tensor(render_chat(tok, [{"role": "user", "content": prompts[0].turns[0]}]))
    generate(target, ar, warm, 8, greedy)
    generate(target, ngram, warm, 8, greedy)
    model.generate(warm[None], attention_mask=torch.ones_like(warm[None]), do_sample=False, max_new_tokens=8)

    for p in prompts:
        ids = torch.tensor(render_chat(tok, [{"role": "user", "content": p.turns[0]}]))
        g_ar = generate(target, ar, ids, args.max_new_tokens, greedy)
        hf_ids, hf_s = hf(ids)
        g_ng = generate(target, ngram, ids, args.max_new_tokens, greedy)
        pld_ids, pld_s = hf(ids, prompt_lookup_num_tokens=args.num_draft, max_matching_ngram_size=args.max_n)
        agree += g_ar.output_ids == hf_ids
        pld_agree += pld_ids == hf_ids
        assert g_ng.output_ids == g_ar.output_ids, f"ngram differs from ar on {p.id}"
        totals["ar_tok"] += len(g_ar.output_ids)
        totals["ar_s"] += g_ar.prefill_s + g_ar.decode_s
        totals["ar_dec_s"] += g_ar.decode_s
        totals["ar_other_s"] += sum(s.other_s for s in g_ar.steps)
        totals["ar_steps"] += len(g_ar.steps)
        totals["ng_tok"] += len(g_ng.output_ids)
        totals["ng_s"] += g_ng.prefill_s + g_ng.decode_s
        totals["ng_dec_s"] += g_ng.decode_s
        totals["ng_other_s"] += sum(s.other_s for s in g_ng.steps)
        totals["ng_steps"] += len(g_ng.steps)
        totals["hf_tok"] += len(hf_ids)
        totals["hf_s"] += hf_s
        totals["pld_tok"] += len(pld_ids)
        totals["pld_s"] += pld_s
        print(f"{p.id}: ar {len(g_ar.output_ids)} tok, hf {len(hf_ids)} tok, same={g_ar.output_ids == hf_ids}", flush=True)

    t = totals
    ar_tps, hf_tps = t["ar_tok"] / t["ar_s"], t["hf_tok"] / t["hf_s"]
    ng_tps, pld_tps = t["ng_tok"] / t["ng_s"], t["pld_tok"] / t["pld_s"]
    env = env_fingerprint(target.device.type, str(target.dtype).removeprefix("torch."))
    lines = [
        "# Harness benchmark",
        "",
        f"`python -m specbench.bench --target {args.target} --task {args.task} --limit {args.limit} "
        f"--max-new-tokens {args.max_new_tokens} --num-draft {args.num_draft} --max-n {args.max_n}`",
        "",
        f"Machine: {env['cpu_model']}, {env['threads']} threads, {env['device']} {env['dtype']}, torch {env['torch_version']}, "
        f"transformers {env['transformers_version']}, specbench {env['specbench_sha']}. One process, same prompts, interleaved.",
        "",
        "| measure | specbench | transformers | ratio (specbench / transformers) |",
        "|---|---:|---:|---:|",
        f"| greedy AR, end-to-end tokens/s | {ar_tps:.2f} | {hf_tps:.2f} | {ar_tps / hf_tps:.2f} |",
        f"| n-gram / prompt lookup, end-to-end tokens/s | {ng_tps:.2f} | {pld_tps:.2f} | {ng_tps / pld_tps:.2f} |",
        f"| n-gram speedup over own greedy baseline (end-to-end) | {ng_tps / ar_tps:.2f}x | {pld_tps / hf_tps:.2f}x | |",
        "",
        f"- Outputs: specbench `ar` equals transformers greedy on {agree}/{len(prompts)} prompts; "
        f"transformers prompt lookup equals its own greedy on {pld_agree}/{len(prompts)}; specbench `ngram` equals `ar` on all (asserted).",
        f"- Decode-only: `ar` {t['ar_tok'] / t['ar_dec_s']:.2f} tok/s, `ngram` {t['ng_tok'] / t['ng_dec_s']:.2f} tok/s "
        f"(decode speedup {(t['ng_tok'] / t['ng_dec_s']) / (t['ar_tok'] / t['ar_dec_s']):.2f}x, tau {t['ng_tok'] / t['ng_steps']:.2f}).",
        f"- Harness overhead (commit, bookkeeping, next context) per step: {100 * t['ar_other_s'] / t['ar_dec_s']:.2f}% of `ar` "
        f"decode time, {100 * t['ng_other_s'] / t['ng_dec_s']:.2f}% of `ngram` decode time.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
