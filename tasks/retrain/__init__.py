"""The retrain loop: which policy serves and how a new one earns it. The pipeline's champion
rule (rule.py), the gate's scorers (scorers.py), a round's decisions (round.py), preference
batches (batches.py), what the loop keeps in MLflow (store.py), its Prefect events
(events.py) and records (records.py), its settings in the pipeline config (tasks/config.py:
``retrain:``, ``collect:``); the champion's answers and their labels in labels/, a person's
sign-off in approval/."""
