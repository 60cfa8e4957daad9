"""basis-bench: value and advantage estimation for RL with verifiable rewards.

The estimators live in :mod:`basis_bench.estimators`; the rollout store in
:mod:`basis_bench.rollouts.store`; the command line in :mod:`basis_bench.cli`.
"""

__version__ = "0.1.0"
