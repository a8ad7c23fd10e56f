"""Evaluation and decisions: comparing policies, the retrain gate, serving, collection."""
