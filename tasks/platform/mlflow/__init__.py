"""Everything that talks to MLflow. With the features' own stores (tasks/retrain/store.py,
tasks/retrain/approval/store.py, tasks/gc/store.py) the only code that imports mlflow, so
the rest of the project depends on these functions, not on MLflow's API."""
