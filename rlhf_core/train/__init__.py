"""The supervised stages (SFT, reward model) and the shared training step and loop."""
