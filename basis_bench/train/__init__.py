"""A compact RLVR training loop with the advantage estimator as a plug-in.

config      TrainConfig, TOML files with ``extends``, ``--set`` overrides, validation
            (the probe's settings against the run's too: ``check_probe``)
setup       data, models, sampler, reference cache, ``make_estimator``: all before step 1
loop        ``train``: sample -> score -> baselines -> update -> record, top to bottom
sample      a step's prompts (seeded), samples and rewards, for the loop and the probe
update      token log-probs and the AdamW steps of one training step
losses      the policy-loss registry (gpg, grpo, gspo) and the k3 KL
checkpoint  save, load (weights-only) and resume
probe       the value probe: the baseline's error against Monte Carlo values, observational
figures     learning curves and the calibrated beta of finished runs

Importing this package does not import torch; the functions that need it do.
"""

from basis_bench.train.checkpoint import load_trainer_state, resume_config
from basis_bench.train.config import TrainConfig, make_config, parse_override, read_config_file
from basis_bench.train.loop import read_log, train
from basis_bench.train.setup import make_estimator

__all__ = [
    "TrainConfig",
    "load_trainer_state",
    "make_config",
    "make_estimator",
    "parse_override",
    "read_config_file",
    "read_log",
    "resume_config",
    "train",
]
