"""The value-estimation benchmark: replay stored rollouts through every estimator, tables,
sensitivity sweeps, trajectory replay and the paper's figures."""
