"""Value estimators for RLVR baselines: BASIS and the methods it is compared with.

BASIS in three steps (see docs/method.md for the derivations):

1. :func:`tilted_value` / :func:`tilted_moments`: offline value of the KL-tilted policy
   from cached reference rollouts, for a grid of betas (:class:`TiltTable` holds it).
2. :func:`refine`: leave-one-out BLUE refinement that borrows the other prompts' rewards.
3. :func:`select_beta` / :func:`basis_estimate`: calibrate beta on the batch, then refine;
   :func:`Basis` does all three for a stream of training batches.

The baselines :func:`vanilla`, :func:`reinforce_pp`, :func:`grpo`, :func:`rloo` need only
the step's rewards. Every estimator is registered in :data:`ESTIMATORS` (:func:`get` by
name) as a step-kernel factory (:mod:`basis_bench.estimators.kernel`), the stateless ones
also with one uniform call on an :class:`EstimatorInput`, each with its own typed options
(:mod:`basis_bench.estimators.options`; :func:`parse_options` builds them from a mapping).
:func:`make_step_estimator` is the one entry point of a training loop. Third-party
packages add estimators through the entry point group ``basis_bench.estimators``. All
functions accept numpy arrays and torch tensors alike and keep their dtype and device.
"""

# Import order is registration order, which is the order of ``--estimators all``.
from basis_bench.estimators import registry
from basis_bench.estimators.baselines import grpo, reinforce_pp, rloo, vanilla
from basis_bench.estimators.basis import BASIS_FAMILY, Basis, BasisKernel, basis_values
from basis_bench.estimators.calibrate import (
    active_fraction,
    basis_estimate,
    batch_loss,
    select_beta,
    take_beta,
)
from basis_bench.estimators.context import ContextOptions
from basis_bench.estimators.kernel import StatelessKernel, StepKernel
from basis_bench.estimators.memory import MemoryOptions, memory_values
from basis_bench.estimators.options import (
    ApoOptions,
    BasisOptions,
    JamesSteinOptions,
    NoOptions,
    SpoOptions,
    TableOptions,
)
from basis_bench.estimators.output import StepOutput
from basis_bench.estimators.refine import refine
from basis_bench.estimators.registry import (
    ENTRY_POINT_GROUP,
    ESTIMATORS,
    Estimator,
    EstimatorInput,
    available,
    get,
    load_plugins,
    parse_options,
    register_estimator,
)
from basis_bench.estimators.related import (
    SpoKernel,
    SpoTracker,
    apo_value,
    james_stein,
    spo_prior,
    spo_step,
)
from basis_bench.estimators.step import StepEstimator, make_step_estimator
from basis_bench.estimators.table import PromptIndex, TiltTable
from basis_bench.estimators.tilt import default_betas, is_binary, tilted_moments, tilted_value
from basis_bench.estimators.track import TrackOptions
from basis_bench.registry import PluginWarning

__all__ = [
    "BASIS_FAMILY",
    "ENTRY_POINT_GROUP",
    "ESTIMATORS",
    "ApoOptions",
    "Basis",
    "BasisKernel",
    "BasisOptions",
    "ContextOptions",
    "Estimator",
    "EstimatorInput",
    "JamesSteinOptions",
    "MemoryOptions",
    "NoOptions",
    "PluginWarning",
    "PromptIndex",
    "SpoKernel",
    "SpoOptions",
    "SpoTracker",
    "StatelessKernel",
    "StepEstimator",
    "StepKernel",
    "StepOutput",
    "TableOptions",
    "TiltTable",
    "TrackOptions",
    "active_fraction",
    "apo_value",
    "available",
    "basis_estimate",
    "basis_values",
    "batch_loss",
    "default_betas",
    "get",
    "grpo",
    "is_binary",
    "james_stein",
    "load_plugins",
    "make_step_estimator",
    "memory_values",
    "parse_options",
    "refine",
    "register_estimator",
    "registry",
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
