"""`rlhf gc`, in one folder: what it finds and deletes (plan.py), its records (items.py), the
runs marked deleted in MLflow (deleted.py), what it asks the MLflow store (store.py) and one
gc at a time per store (lock.py). It reads what the features below it leave: the pipeline's
run folders (which a live process holds, tasks/pipeline/owners.py; what a finished run
keeps, tasks/pipeline/retention.py) and the retrain's batches, quarantined files and pull
records."""
