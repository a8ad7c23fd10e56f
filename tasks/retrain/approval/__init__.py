"""A person signs off the champion (``retrain.approval: required``), in one folder: the answers
and what they do (answers.py), the round that waits and `rlhf serve`'s keeper (waiting.py),
the Prefect side of a served wait (suspend.py), the evidence above the form (evidence.py) and
the sign-off as MLflow keeps it (store.py)."""
