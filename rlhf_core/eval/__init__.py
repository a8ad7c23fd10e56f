"""Evaluation and decisions: sampling both policies, the retrain gate's paired test, serving
the registered models, collecting answers."""
