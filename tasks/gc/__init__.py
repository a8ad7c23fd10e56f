"""`rlhf gc`: clears what the pipeline and the retrain loop leave behind once it no longer
serves (plan.py decides, the other modules support it)."""
