"""A person signs off the champion (``retrain.approval: required``): the answers and what they
do (answers.py), the round that waits (waiting.py) and the sign-off as MLflow keeps it
(store.py)."""
