"""The retrain loop: which policy serves and how a new one earns it, round after round of the
pipeline gated against the champion, signed off by a person, on labels of its own answers."""
