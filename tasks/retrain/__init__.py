"""The retrain loop: which policy serves and how a new one earns it, over and over the
pipeline (tasks/pipeline/). A round's decisions (round.py), preference batches (batches.py),
what the loop keeps in MLflow (store.py), its announcements (events.py) and records
(records.py); the gate that tests a challenger against the champion in gate/, a person's
sign-off in approval/, the champion's answers and their labels in labels/. Its settings are
the pipeline config's ``retrain:`` and ``collect:`` sections (tasks/config/sections.py)."""
