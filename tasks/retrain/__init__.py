"""The retrain loop: which policy serves and how a new one earns it. The pipeline's champion
rule (rule.py), the gate's scorers (scorers.py), a round's decisions (round.py), preference
batches (batches.py), answers collected from the champion and their labels (collect.py,
labels.py, Label Studio: studio.py, pull.py), what the loop keeps in MLflow (store.py), its
Prefect events (events.py), records (records.py) and settings (config.py, collect_config.py);
a person's sign-off in approval/."""
