"""What score sketches add to sampling: `oracle` on SmolLM2-135M (one torch thread, the CPU)
with and without `--store-scores K`, the same prompts and seed, in CPU seconds of the
process (user + system; a shared machine changes wall time, not these much). Prints one
row per run and the ratio.

    python benchmarks/bench_sketch.py [--prompts 8] [--n 32] [--k 256]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile


def cpu_seconds(args: list[str]) -> float:
    """CPU seconds (user + system) of one `basis-bench` run in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "basis_bench", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--k", type=int, default=256)
    a = parser.parse_args()
    common = [
        "oracle", "--model", "smollm2-135m", "--policy", "reference", "--device", "cpu",
        "--prompts", f"arithmetic:n={a.prompts},digits=1,steps=1,ops=+-*,seed=4",
        "--instruction", "Answer with the number only.", "--max-new-tokens", "16",
        "--n", str(a.n), "--chunk-size", "4", "--workers", "1", "--drop-responses",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        load = cpu_seconds([*common[:7], "--prompts", "arithmetic:n=1,seed=4", "--n", "1",
                            "--out", f"{tmp}/load"])  # fmt: skip
        plain = cpu_seconds([*common, "--out", f"{tmp}/plain"])
        sketched = cpu_seconds([*common, "--store-scores", str(a.k), "--out", f"{tmp}/sketch"])
    samples = a.prompts * a.n
    print(f"{samples} samples of SmolLM2-135M, 16 tokens at most, 1 thread (CPU seconds)")
    print(f"  start-up (model load, 1 sample):  {load:7.1f}")
    print(f"  oracle:                           {plain:7.1f}")
    print(f"  oracle --store-scores {a.k}:       {sketched:7.1f}")
    extra = (sketched - plain) / max(plain - load, 1e-9)
    print(f"  the sketch adds {100 * extra:+.0f}% to sampling (start-up left out)")


if __name__ == "__main__":
    main()
