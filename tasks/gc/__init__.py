"""`rlhf gc`, in one folder: what it finds and deletes (plan.py), its records (items.py), the
runs marked deleted in MLflow (deleted.py), what it asks the MLflow store (store.py), which run
folders a live process holds (owners.py) and what a finished run keeps on disk
(retention.py)."""
