"""The supervised stages and the shared training step: optimiser and schedule, the step seam,
the loop, losses, SFT and the reward model."""
