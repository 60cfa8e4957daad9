"""Making and storing rollouts: prompts, sampling, math-verify rewards, the Parquet store,
the oracle pipeline and the simulator."""
