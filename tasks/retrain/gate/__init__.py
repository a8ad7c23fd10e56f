"""The retrain gate: whether a challenger beats the champion, by a paired test on held-out
prompts (stage.py) with one scorer for both (``retrain.gate.scorer``); a challenger over
``eval.tax.budget`` does not win. Settings: ``retrain.gate``; the test's arithmetic is
rlhf_core/eval/gate.py."""
