"""PPO: the per-token math, advantage estimators, rollouts and the trainer."""
