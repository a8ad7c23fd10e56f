"""The retrain loop: which policy serves and how a new one earns it, round after round of the
pipeline (tasks/pipeline/), gated against the champion (gate/), optionally signed off by a
person (approval/), on labels of the champion's own answers (labels/)."""
