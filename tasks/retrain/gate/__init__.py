"""The retrain gate: whether a challenger beats the champion, by a paired test on held-out
prompts with one scorer for both; a challenger over ``eval.tax.budget`` does not win."""
