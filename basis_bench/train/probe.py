"""The value probe: how far the estimator's baseline is from the policy's value, during training.

Every ``probe_every`` steps (at step 0 too, and after the last), on a fixed probe set of P =
``probe_prompts`` training prompts (drawn once by a fixed seed: the same prompts for every
arm and seed), K = ``probe_samples`` responses per prompt from the policy that the next step
samples from:

- the first G' of each prompt (the estimator's own rollouts per prompt) go to a deep copy
  of the step estimator, in batches of B_p prompts as a training step makes them: its
  baselines b_pk (P, G'); the estimator's own state is untouched;
- the other M = K - G' give the Monte Carlo value ybar_p and the sample variance s_p^2.

Logged, as means over the probe prompts and the G' baselines of each:

==================  ==========================  =============================================
probe_value_error   (b - ybar)^2 - s^2 / M      unbiased for (b - v)^2, v the prompt's value
probe_value_mse     (b - ybar)^2                the raw error: biased up by Var(r) / M
probe_value         ybar                        the probe set's mean value
==================  ==========================  =============================================

Why the correction: b is a function of other samples than the M targets, so given b,
E (b - ybar)^2 = (b - v)^2 + Var(r) / M, and the sample variance s^2 (ddof 1) is unbiased
for Var(r). For 0/1 rewards s^2 / M = ybar (1 - ybar) / (M - 1). The corrected error can be
negative on one probe; its mean over probes and seeds is what estimates the error.

The probe cannot change training: it samples with a seed stream of its own (PROBE_STREAM,
seed, step) under a fork of torch's RNG, and its copy of the estimator is thrown away;
nothing it computes reaches the update, the checkpoint or the next step's sampling. Its
settings are observational (:data:`~basis_bench.train.config.OBSERVATIONAL_KEYS`): a run
may be resumed or extended with other ones.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from basis_bench.estimators import StepEstimator
from basis_bench.train.sample import derive_seed, sample_rollouts, score_rollouts

PROBE_STREAM = 0x9B0BE  # first key of the probe's sampling seeds: a stream no step uses
PROBE_SET_SEED = 0  # the probe set's draw, the same for every run


def probe_rows(n_train: int, n_probe: int) -> np.ndarray:
    """Training-set rows of the probe set: ``n_probe`` distinct rows, by a fixed seed."""
    rng = np.random.default_rng(PROBE_SET_SEED)
    return np.sort(rng.choice(n_train, size=n_probe, replace=False))


def probe_baselines(
    estimator: StepEstimator, prompt_ids: Sequence[str], rewards: np.ndarray, per_batch: int
) -> np.ndarray:
    """Baselines (P, G') of rewards (P, G'), ``per_batch`` prompts at a time (the last batch
    may be smaller), each batch given to a fresh deep copy of ``estimator``: what its next
    training step would return for that batch, its own state left as it was."""
    found = []
    for start in range(0, len(prompt_ids), per_batch):
        batch = slice(start, start + per_batch)
        out = copy.deepcopy(estimator)(list(prompt_ids[batch]), rewards[batch])
        found.append(np.asarray(out.baselines, dtype=np.float64).reshape(rewards[batch].shape))
    return np.concatenate(found)


def value_error(baselines: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    """The probe's record from baselines (P, G') and target rewards (P, M), M >= 2 (module
    docstring): the noise-corrected squared error, the raw one, the mean value."""
    m = targets.shape[1]
    values = targets.mean(axis=1)
    noise = targets.var(axis=1, ddof=1) / m  # unbiased for Var(ybar)
    squared = ((baselines - values[:, None]) ** 2).mean(axis=1)
    return {
        "probe_value_error": float((squared - noise).mean()),
        "probe_value_mse": float(squared.mean()),
        "probe_value": float(values.mean()),
    }


def value_probe(run: Any, step: int) -> dict[str, float]:
    """The probe after step ``step`` (0: before the first) of a run (:class:`Run`)."""
    import torch

    config = run.config
    prompts = run.data.train_set[probe_rows(run.data.train_set.height, config.probe_prompts)]
    sampling = config.generation.sampling(config.probe_samples, config.train.prompts)
    run.models.policy.eval()
    with torch.random.fork_rng():  # hf's generate engine seeds torch's global RNG
        seed = derive_seed(PROBE_STREAM, config.seed, step)
        rollouts = sample_rollouts(run.sampler, prompts, sampling, seed)
    rewards, _ = score_rollouts(
        rollouts.responses, prompts, run.data, rollouts.response_tokens, rollouts.finish_reasons
    )
    own = rewards[:, : run.group]
    baselines = probe_baselines(
        run.estimator, prompts["prompt_id"].to_list(), own, run.prompts_per_step
    )
    return value_error(baselines, rewards[:, run.group :])
