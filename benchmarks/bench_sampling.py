"""Tokens per second of the `hf` sampling backend on CPU, SmolLM2-135M, by batch size.

Batch size B is the number of sequences per `generate` call. B = 1 is one prompt at a
time (the baseline); for larger B a call holds B // n prompts, left-padded together,
with n samples each via num_return_sequences (the oracle's shape). Tokens/s counts
generated tokens up to and including each response's stop token, so the work padded
sequences do after they finish is not counted as output. Each size runs --repeats
times and the fastest run is reported: the CPUs are shared, and other load only ever
slows a run down.

    python benchmarks/bench_sampling.py                      # 1, 16, 64, 256
    python benchmarks/bench_sampling.py --batch-sizes 1,64 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from basis_bench.models import resolve_checkpoint
from basis_bench.prompts import arithmetic_prompts
from basis_bench.sampling import SamplingConfig
from basis_bench.sampling.hf_backend import HFSampler


def measure(
    sampler: HFSampler,
    problems: list[str],
    batch_size: int,
    n: int,
    max_new_tokens: int,
    repeats: int = 1,
) -> tuple[int, float]:
    """(generated tokens, seconds) of the fastest of ``repeats`` runs of ``problems`` x
    ``n`` samples at ``batch_size`` (same seed, so the same tokens every run)."""
    sampler.batch_size = batch_size
    best = (0, float("inf"))
    for _ in range(repeats):
        start = time.perf_counter()
        out = sampler.sample(problems, SamplingConfig(n=n, max_new_tokens=max_new_tokens), seed=0)
        best = min(best, (int(out.n_tokens.sum()), time.perf_counter() - start), key=lambda r: r[1])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batch-sizes", default="1,16,64,256", help="comma-separated sequences per call"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--samples-per-prompt", type=int, default=16, help="n in a batched call")
    parser.add_argument(
        "--baseline-sequences", type=int, default=8, help="sequences timed at batch size 1"
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per size; the fastest counts")
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]

    start = time.perf_counter()
    sampler = HFSampler.load(resolve_checkpoint("smollm2-135m"), device="cpu")
    print(
        f"model loaded in {time.perf_counter() - start:.1f} s; torch threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    problems = arithmetic_prompts(max(sizes), digits=(1, 2), steps=(1, 2), seed=0)[
        "problem"
    ].to_list()
    measure(sampler, problems[:1], 1, 1, 4)  # warm-up: first-call overheads

    rows = []
    for size in sizes:
        if size == 1:
            shape, batch = (
                f"{args.baseline_sequences} prompts x 1, one at a time",
                problems[: args.baseline_sequences],
            )
            tokens, seconds = measure(sampler, batch, 1, 1, args.max_new_tokens, args.repeats)
        else:
            n = min(args.samples_per_prompt, size)
            shape = f"{size // n} prompts x {n} samples"
            tokens, seconds = measure(
                sampler, problems[: size // n], size, n, args.max_new_tokens, args.repeats
            )
        rows.append((size, shape, tokens, seconds, tokens / seconds))
        print(f"  batch {size}: {tokens} tokens in {seconds:.1f} s", flush=True)

    base = next((r[4] for r in rows if r[0] == 1), None)
    print(
        f"\nhf backend, SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32), CPU, "
        f"max_new_tokens={args.max_new_tokens}"
    )
    print(
        f"{'batch':>5}  {'workload':<34} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'vs batch 1':>10}"
    )
    for size, shape, tokens, seconds, rate in rows:
        speedup = f"{rate / base:.1f}x" if base else "-"
        print(f"{size:>5}  {shape:<34} {tokens:>7} {seconds:>8.1f} {rate:>9.1f} {speedup:>10}")


if __name__ == "__main__":
    main()
