"""Speed of BASIS's per-batch work (select_beta + refine), vectorised vs a plain Python loop.

For B in {64, 512, 8192} and K = 64 candidate betas (+ inf) over 1000 repeated batches:
time per batch and per prompt of `basis_estimate` (calibrate on the batch, then refine),
processed in chunks of batches so the (K, chunk, B) grids stay near 4M elements, against a
straightforward loop over batches, betas and prompts (timed on a few batches). Prints a
table; targets: >= 50x over the loop at B = 512, per-prompt time flat (within 2x) from 64
to 8192.

    python benchmarks/bench_estimators.py [--repeats 1000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from basis_bench.estimators import basis_estimate, default_betas, tilted_moments


def python_loop_basis(
    v_grid: np.ndarray, var_grid: np.ndarray, rewards: np.ndarray, eps: float = 1e-6
) -> list[float]:
    """One batch as the formulas read, in plain Python: loss per beta, then per-prompt LOO sums (O(B^2))."""
    K, B = v_grid.shape
    v_rows, var_rows, r = v_grid.tolist(), var_grid.tolist(), rewards.tolist()
    losses = [sum((r[i] - v_rows[k][i]) ** 2 for i in range(B)) / B for k in range(K)]
    best = min(range(K), key=losses.__getitem__)
    v, var = v_rows[best], var_rows[best]
    out = []
    for i in range(B):
        s1 = sum(v[j] / var[j] * r[j] for j in range(B) if j != i and var[j] > eps)
        s2 = sum(v[j] / var[j] * v[j] for j in range(B) if j != i and var[j] > eps)
        out.append(v[i] * s1 / s2 if s2 > 0 else v[i])
    return out


def numpy_loop_basis(
    v_grid: np.ndarray, var_grid: np.ndarray, rewards: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """One batch with a Python loop over betas and prompts and numpy sums inside."""
    K, B = v_grid.shape
    best = min(range(K), key=lambda k: float(np.mean((rewards - v_grid[k]) ** 2)))
    v, var = v_grid[best], var_grid[best]
    out = np.empty(B)
    for i in range(B):
        mask = (np.arange(B) != i) & (var > eps)
        a = v[mask] / var[mask]
        s2 = float(a @ v[mask])
        out[i] = v[i] * float(a @ rewards[mask]) / s2 if s2 > 0 else v[i]
    return out


def time_per_batch(fn, batches: int) -> tuple[float, object]:
    start = time.perf_counter()
    for t in range(batches):
        out = fn(t)
    return (time.perf_counter() - start) / batches, out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=1000)
    parser.add_argument("--grid", type=int, default=64)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    betas = default_betas(args.grid)
    K = betas.size
    prompts = 20_000
    ref = (rng.random((prompts, 64)) < rng.beta(0.7, 0.7, (prompts, 1))).astype(float)
    v_table, var_table = tilted_moments(ref, betas)
    print(f"K = {K} candidate betas, {args.repeats} batches per B, chunks of ~1M grid cells")
    print(
        f"{'B':>6} {'vectorised ms/batch':>20} {'us/prompt':>10} {'python loop ms':>15} {'speed-up':>9}"
        f" {'numpy loop ms':>14} {'speed-up':>9}"
    )
    for B in (64, 512, 8192):
        chunk = max(1, 1_000_000 // (K * B))
        idx = np.stack([rng.choice(prompts, B, replace=False) for _ in range(args.repeats)])
        rewards = (rng.random(idx.shape) < v_table[-1][idx]).astype(float)

        def vectorised(idx=idx, rewards=rewards, chunk=chunk) -> None:
            for lo in range(0, args.repeats, chunk):
                sl = idx[lo : lo + chunk]
                basis_estimate(
                    v_table[:, sl], var_table[:, sl], rewards[lo : lo + chunk], min_active=0
                )

        vectorised()  # warm-up: first-touch page faults of the temporaries are not the method's cost
        start = time.perf_counter()
        vectorised()
        vec = (time.perf_counter() - start) / args.repeats
        few = 1 if B > 1000 else 5
        py, want = time_per_batch(
            lambda t, idx=idx, rewards=rewards: python_loop_basis(
                v_table[:, idx[t]], var_table[:, idx[t]], rewards[t]
            ),
            few,
        )
        nl, _ = time_per_batch(
            lambda t, idx=idx, rewards=rewards: numpy_loop_basis(
                v_table[:, idx[t]], var_table[:, idx[t]], rewards[t]
            ),
            few,
        )
        got, _ = basis_estimate(
            v_table[:, idx[few - 1]], var_table[:, idx[few - 1]], rewards[few - 1], min_active=0
        )
        assert np.allclose(got, want), "the loop and the vectorised code disagree"
        print(
            f"{B:>6} {vec * 1e3:>20.3f} {vec / B * 1e6:>10.3f} {py * 1e3:>15.1f} {py / vec:>8.0f}x"
            f" {nl * 1e3:>14.1f} {nl / vec:>8.0f}x"
        )


if __name__ == "__main__":
    main()
