"""A documented generative model of RLVR rollouts, written in the rollout-store schema.

The model (all rewards binary, one Bernoulli draw per rollout):

1. Reference values. Each prompt i gets a reference success rate p_i from a Beta
   mixture (by default hard, medium and easy components, the U-shape typical of maths
   benchmarks): p_i ~ sum_c w_c Beta(a_c, b_c).
2. Checkpoints. Training stage s (``early``, ``middle``, ``late``) moves each prompt's
   log-odds:

       logit V_{i,s} = (1 + kappa_s) logit p_i + d_i delta_s + tau xi_{i,s},
       xi_{i,s} ~ N(0, 1),   d_i = -1 with probability phi, else +1.

   With kappa = phi = 0 and tau = 0 this is exactly BASIS's tilt model: the binary
   KL-tilted value has logit V_beta = logit p + 1/beta, so stage s is the tilt with
   beta = 1/delta_s. The other terms break it on purpose:
   ``tau`` prompt-level noise (the shift is not shared), ``kappa`` a slope change of the
   log-odds (learning sharpens easy versus hard prompts; no tilt can express it) and
   ``phi`` a share of prompts that get worse while the rest improve.
3. Rollouts. The reference policy gets ``ref_n`` samples per prompt (BASIS's
   cache), each checkpoint ``checkpoint_n`` (the evaluator's oracle plus its pool).

:data:`~basis_bench.rollouts.simulation.SETTINGS` names the presets: ``tilt`` (the model holds up to small noise) and three
misspecified ones. Every file carries ``simulated: true`` and a ``label`` in its metadata,
and ``prompts.parquet`` carries the true values (``sim_value_<policy>``) for diagnostics.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.estimators.tilt import sigmoid
from basis_bench.guards.folders import inside_claim
from basis_bench.guards.locks import publishing
from basis_bench.guards.memory_check import SIMULATE_BYTES_PER_ROLLOUT, check_rollouts_fit
from basis_bench.guards.outputs import (
    STAGED_SUFFIX,
    claim_output_dir,
    holds_output_locks,
    read_metadata,
    write_parquet_atomic,
)
from basis_bench.guards.provenance import __version__
from basis_bench.rollouts.simulation import (
    REFERENCE_POLICY,
    SimulationConfig,
)
from basis_bench.rollouts.store import rollout_files
from basis_bench.schema import PROMPTS_FILE

GENERATOR = "basis_bench.rollouts.simulate"
ROLLOUTS_SUBDIR = "rollouts"


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def reference_values(cfg: SimulationConfig, rng: np.random.Generator) -> np.ndarray:
    """p_i ~ Beta mixture, clipped to [1e-6, 1 - 1e-6] so its log-odds stay finite."""
    weights = np.array([w for w, _, _ in cfg.mixture])
    comp = rng.choice(len(cfg.mixture), size=cfg.n_prompts, p=weights / weights.sum())
    a = np.array([c[1] for c in cfg.mixture])[comp]
    b = np.array([c[2] for c in cfg.mixture])[comp]
    return np.clip(rng.beta(a, b), 1e-6, 1 - 1e-6)


def checkpoint_values(
    p_ref: np.ndarray, cfg: SimulationConfig, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """True value of every prompt at every stage (module docstring, step 2).

    ``rng`` draws the drift signs; each stage's noise has its own stream, so adding a
    stage leaves the other stages' values unchanged.
    """
    setting = cfg.generative_setting()
    sign = np.where(rng.random(p_ref.shape) < setting.phi, -1.0, 1.0)
    late = max(abs(d) for d in cfg.stages.values()) or 1.0
    out = {}
    for name, delta in cfg.stages.items():
        slope = 1.0 + setting.kappa * abs(delta) / late
        stage_rng = np.random.default_rng(_stream(cfg.seed, f"noise:{name}"))
        noise = setting.tau * stage_rng.standard_normal(p_ref.shape)
        out[name] = sigmoid(slope * _logit(p_ref) + sign * delta + noise)
    return out


def _rollouts(
    prompt_ids: list[str], policy: str, values: np.ndarray, n: int, rng: np.random.Generator
) -> pl.DataFrame:
    """n Bernoulli(values[i]) rewards per prompt, sample_idx 0..n-1, in store schema."""
    rewards = (rng.random((len(values), n)) < values[:, None]).astype(np.float64)
    return pl.DataFrame(
        {
            "prompt_id": np.repeat(np.array(prompt_ids), n),
            "policy": np.full(len(values) * n, policy),
            "sample_idx": np.tile(np.arange(n, dtype=np.int32), len(values)),
            "reward": rewards.ravel(),
        },
        schema={
            "prompt_id": pl.String,
            "policy": pl.String,
            "sample_idx": pl.Int32,
            "reward": pl.Float64,
        },
    )


def _stream(seed: int, name: str) -> np.random.SeedSequence:
    """An independent random stream per (seed, name), stable across Python runs."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.SeedSequence([seed, digest])


@holds_output_locks
def simulate(cfg: SimulationConfig, out: str | Path, *, force: bool = False) -> Path:
    """Write a simulated rollouts dataset to ``out`` and return its path.

    Layout: ``out/prompts.parquet`` and ``out/rollouts/<policy>.parquet``, one file per
    policy; the reference policy is named ``reference`` and recorded as
    ``reference_policy`` in every file's metadata.

    ``out`` must be new, empty or an earlier simulated dataset
    (:func:`~basis_bench.rollouts.store.claim_output_dir`; ``force`` writes anyway). A rerun
    replaces the earlier simulation whole: every file is staged, then all are renamed into
    place under the dataset's publish lock and the earlier simulation's files that this
    one does not rewrite (a stage no longer simulated) are removed, so a reader sees one
    simulation, never a mix; an interrupted run leaves the earlier one.
    """
    setting = cfg.generative_setting()
    largest = cfg.n_prompts * (max(cfg.ref_n, cfg.checkpoint_n) + 2)  # a policy, prompts
    check_rollouts_fit(
        largest,
        SIMULATE_BYTES_PER_ROLLOUT,
        "this simulation",
        "lower --prompts or the samples per prompt",
    )
    out = claim_output_dir(out, "rollouts", simulated=True, force=force)
    rng = np.random.default_rng(_stream(cfg.seed, "values"))
    p_ref = reference_values(cfg, rng)
    values = {REFERENCE_POLICY: p_ref, **checkpoint_values(p_ref, cfg, rng)}
    width = len(str(cfg.n_prompts - 1))
    prompt_ids = [f"sim-{i:0{width}d}" for i in range(cfg.n_prompts)]
    policies = [REFERENCE_POLICY, *cfg.stages]
    label = f"simulated ({cfg.setting}): {setting.description}"
    meta: dict[str, Any] = {
        "simulated": True,
        "label": label,
        "generator": GENERATOR,
        "model": "simulated",
        "package_version": __version__,
        "reference_policy": REFERENCE_POLICY,
        "policies": policies,
        "seed": cfg.seed,
        "config": asdict(cfg),
        "setting_params": asdict(setting),
    }
    prompts = pl.DataFrame(
        {
            "prompt_id": prompt_ids,
            "problem": [f"simulated prompt {i}" for i in range(cfg.n_prompts)],
            "answer": [""] * cfg.n_prompts,
            **{f"sim_value_{name}": v for name, v in values.items()},
        }
    )
    finals = [out / ROLLOUTS_SUBDIR / f"{name}.parquet" for name in policies]
    stale = _stale(out, finals)  # known (and refused, if a link leads out) before writing
    tag = uuid.uuid4().hex[:12]  # every file is staged, then all are swapped in at once
    staged = [
        (write_parquet_atomic(prompts, _staged(out / PROMPTS_FILE, tag), meta), out / PROMPTS_FILE)
    ]
    try:
        for name, path in zip(policies, finals, strict=True):
            n = cfg.ref_n if name == REFERENCE_POLICY else cfg.checkpoint_n
            df = _rollouts(
                prompt_ids, name, values[name], n, np.random.default_rng(_stream(cfg.seed, name))
            )
            staged.append((write_parquet_atomic(df, _staged(path, tag), meta), path))
        with publishing(out):  # a reader sees the earlier simulation or this one, not a mix
            for stage, final in staged:
                os.replace(stage, final)
            for f in stale:
                f.unlink(missing_ok=True)
    finally:
        for stage, _ in staged:
            stage.unlink(missing_ok=True)
    return out


def _staged(path: Path, tag: str) -> Path:
    """Where ``path`` is written before it is swapped in (hidden: readers skip it)."""
    return path.parent / f".{path.name}.{tag}{STAGED_SUFFIX}"


def _stale(out: Path, written: list[Path]) -> list[Path]:
    """The rollouts files of an earlier simulation that this one does not rewrite, to be
    removed in the swap; one that a link leads out of ``out`` is refused (not ours)."""
    stale = []
    for f in rollout_files(out):
        if f in written:
            continue
        try:
            generator = read_metadata(f).get("generator")
        except Exception:  # not ours to judge (only with --force): left alone
            continue
        if generator == GENERATOR:
            stale.append(inside_claim(f))
    return stale
