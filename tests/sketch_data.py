"""A simulated rollouts dataset with score sketches whose true gradient is known, for the
gradient benchmark's tests (simulated: never presented as a result).

Prompt p at checkpoint c has value v and a direction a (K,); a rollout's reward is
r ~ Bernoulli(v) and its sketch s = (r - v) a + e, e ~ N(0, noise^2 I). Then E[s | p] = 0,
as a score's mean is, and E[r s | p] = v (1 - v) a: the prompt's gradient g_p, and
G* = mean_p g_p.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from basis_bench.guards.outputs import write_parquet_atomic


def sketch_dataset(
    root: Path, prompts: int = 24, samples: int = 16, k: int = 8, ref_n: int = 16,
    steps: tuple[int, ...] = (2, 4, 6), noise: float = 1.0, seed: int = 0,
    values: tuple[float, float] = (0.1, 0.9), equal_gradients: bool = False,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Write the dataset into ``root`` (``equal_gradients``: every prompt's g_p of one
    size); return each checkpoint's true G* (K,), and under
    ``name/v`` and ``name/a`` its prompts' values (P,) and directions (P, K)."""
    rng = np.random.default_rng(seed)
    ids = [f"p{i:03d}" for i in range(prompts)]
    base = rng.uniform(*values, prompts)
    truth, frames = {}, []
    policies = [("reference", 0, ref_n)] + [(f"step-{s:03d}", s, samples) for s in steps]
    for name, step, n in policies:
        v = np.clip(base + 0.03 * step * rng.uniform(-1, 1, prompts), *values)
        a = rng.normal(size=(prompts, k))
        if equal_gradients:  # g_p = v (1 - v) a_p alike in size whatever v_p
            a /= (v * (1 - v))[:, None]
        r = (rng.uniform(size=(prompts, n)) < v[:, None]).astype(np.float64)
        s = (r - v[:, None])[..., None] * a[:, None, :] + noise * rng.normal(size=(prompts, n, k))
        truth[name] = ((v * (1 - v))[:, None] * a).mean(axis=0)
        truth[f"{name}/v"], truth[f"{name}/a"] = v, a
        frames.append(pl.DataFrame({
            "prompt_id": np.repeat(ids, n), "policy": [name] * (prompts * n),
            "sample_idx": np.tile(np.arange(n, dtype=np.int32), prompts),
            "reward": r.ravel(),
            "score_sketch": pl.Series(s.reshape(-1, k).astype(np.float32)).cast(
                pl.Array(pl.Float32, k)
            ),
        }))  # fmt: skip
    meta = {"simulated": True, "label": "simulated sketches", "reference_policy": "reference",
            "training_steps": {name: step for name, step, _ in policies}}  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(pl.concat(frames), root / "rollouts" / "part-0.parquet", meta)
    (root / "training.json").write_text(
        json.dumps({"steps": {name: step for name, step, _ in policies}})
    )
    return truth
