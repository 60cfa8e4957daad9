"""A compact single-rollout RLVR training loop with the advantage estimator as a plug-in."""
