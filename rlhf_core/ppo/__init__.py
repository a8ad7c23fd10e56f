"""PPO: the per-token math, advantage estimators and algorithms, rollouts, the trainer and its
data-parallel form."""
