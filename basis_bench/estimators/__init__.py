"""Value estimators for RLVR baselines: BASIS and the methods it is compared with.

BASIS in three steps (see docs/method.md for the derivations):

1. :func:`tilted_value` / :func:`tilted_moments`: offline value of the KL-tilted policy
   from cached reference rollouts, for a grid of betas.
2. :func:`refine`: leave-one-out BLUE refinement that borrows the other prompts' rewards.
3. :func:`select_beta` / :func:`basis_estimate`: calibrate beta on the batch, then refine;
   :class:`Basis` does all three for a stream of training batches.

The baselines :func:`vanilla`, :func:`reinforce_pp`, :func:`grpo`, :func:`rloo` need only
the step's rewards. Every estimator is registered in :data:`ESTIMATORS` (:func:`get` by
name) with one uniform call on an :class:`EstimatorInput`. All functions accept numpy
arrays and torch tensors alike and keep their dtype and device.
"""

from basis_bench.estimators.baselines import grpo, reinforce_pp, rloo, vanilla
from basis_bench.estimators.basis import Basis, BasisOutput
from basis_bench.estimators.calibrate import (
    active_fraction,
    basis_estimate,
    batch_loss,
    select_beta,
    take_beta,
)
from basis_bench.estimators.refine import refine
from basis_bench.estimators.registry import (
    ESTIMATORS,
    Estimator,
    EstimatorInput,
    get,
    register_estimator,
)
from basis_bench.estimators.related import SpoTracker, apo_value, james_stein, spo_prior, spo_step
from basis_bench.estimators.tilt import default_betas, is_binary, tilted_moments, tilted_value

__all__ = [
    "ESTIMATORS",
    "Basis",
    "BasisOutput",
    "Estimator",
    "EstimatorInput",
    "SpoTracker",
    "active_fraction",
    "apo_value",
    "basis_estimate",
    "batch_loss",
    "default_betas",
    "get",
    "grpo",
    "is_binary",
    "james_stein",
    "refine",
    "register_estimator",
    "reinforce_pp",
    "rloo",
    "select_beta",
    "spo_prior",
    "spo_step",
    "take_beta",
    "tilted_moments",
    "tilted_value",
    "vanilla",
]
