"""Tokens per second of the `hf` sampling backend on CPU, SmolLM2-135M, by batch size.

Batch size B is the number of sequences per `generate` call. B = 1 is one prompt at a
time (the baseline); for larger B a call holds B // n prompts, left-padded together,
with n samples each via num_return_sequences (the oracle's shape). Tokens count the
generated tokens up to and including each response's stop token, so the work padded
sequences do after they finish is not counted as output.

Shared CPUs make wall time swing with other people's load. Sizes are run round-robin
--repeats times, so each size sees several moments, and two rates are reported per
size, each from its best round: tokens per wall-clock second, and tokens per CPU-second
of this process (all its threads; with --threads 1 other load barely moves it).

    python benchmarks/bench_sampling.py                      # 1, 16, 64, 256
    python benchmarks/bench_sampling.py --batch-sizes 1,64 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from basis_bench.rollouts.models import resolve_checkpoint
from basis_bench.rollouts.prompts import arithmetic_prompts
from basis_bench.rollouts.sampling import SamplingConfig
from basis_bench.rollouts.sampling.hf import HFSampler


def measure(
    sampler: HFSampler, problems: list[str], batch_size: int, n: int, max_new_tokens: int
) -> tuple[int, float, float]:
    """(generated tokens, wall seconds, CPU seconds) of ``problems`` x ``n`` samples at
    ``batch_size`` (fixed seed: the same tokens every round)."""
    sampler.batch_size = batch_size
    wall, cpu = time.perf_counter(), time.process_time()
    out = sampler.sample(problems, SamplingConfig(n=n, max_new_tokens=max_new_tokens), seed=0)
    return int(out.n_tokens.sum()), time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-sizes", default="1,16,64,256", help="sequences per call")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--samples-per-prompt", type=int, default=16, help="n in a batched call")
    parser.add_argument(
        "--baseline-sequences", type=int, default=8, help="sequences timed at batch size 1"
    )
    parser.add_argument("--repeats", type=int, default=2, help="round-robin rounds; best counts")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's). On shared CPUs use 1: threads beyond the "
        "free cores make OpenMP spin and can slow sampling 5-10x.",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(b) for b in args.batch_sizes.split(",")]

    start = time.perf_counter()
    sampler = HFSampler.load(resolve_checkpoint("smollm2-135m"), device="cpu")
    print(
        f"model loaded in {time.perf_counter() - start:.1f} s; torch threads "
        f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    problems = arithmetic_prompts(max(sizes), digits=(1, 2), steps=(1, 2), seed=0)
    texts = problems["problem"].to_list()
    measure(sampler, texts[:1], 1, 1, 4)  # warm-up: first-call overheads

    workloads = {}
    for size in sizes:
        if size == 1:
            k = args.baseline_sequences
            workloads[size] = (f"{k} prompts x 1, one at a time", texts[:k], 1)
        else:
            n = min(args.samples_per_prompt, size)
            workloads[size] = (f"{size // n} prompts x {n} samples", texts[: size // n], n)
    best_wall: dict[int, float] = {}
    best_cpu: dict[int, float] = {}
    for round_ in range(args.repeats):
        for size, (_, batch, n) in workloads.items():
            tokens, wall, cpu = measure(sampler, batch, size, n, args.max_new_tokens)
            best_wall[size] = max(best_wall.get(size, 0.0), tokens / wall)
            best_cpu[size] = max(best_cpu.get(size, 0.0), tokens / cpu)
            print(
                f"  round {round_ + 1} batch {size}: {tokens} tokens, {wall:.1f} s wall, "
                f"{cpu:.1f} CPU-s (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )

    print(
        f"\nhf backend, SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32), CPU, "
        f"max_new_tokens={args.max_new_tokens}, best of {args.repeats} rounds"
    )
    print(
        f"{'batch':>5}  {'workload':<32} {'tokens/s':>9} {'speed-up':>9} "
        f"{'tokens/CPU-s':>13} {'speed-up':>9}"
    )
    for size, (shape, _, _) in workloads.items():
        wall_up = best_wall[size] / best_wall[1] if 1 in best_wall else float("nan")
        cpu_up = best_cpu[size] / best_cpu[1] if 1 in best_cpu else float("nan")
        print(
            f"{size:>5}  {shape:<32} {best_wall[size]:>9.1f} {wall_up:>8.1f}x "
            f"{best_cpu[size]:>13.1f} {cpu_up:>8.1f}x"
        )


if __name__ == "__main__":
    main()
