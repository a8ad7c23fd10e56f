"""Reward functions the tests name as ``ppo.reward_sources`` (kind function)."""

CALLS: list[dict] = []


def brevity(prompts, completions, **columns):
    """-(words in the answer) / 10, None for an empty answer; each call's arguments kept."""
    CALLS.append({"prompts": list(prompts), "completions": list(completions), **columns})
    return [None if not c.split() else -len(c.split()) / 10 for c in completions]
