"""Everything that talks to MLflow: runs and their metrics (runs), the pipeline's parent run
(parent_run), the spool that keeps a stage training through a server outage (spool, tables,
guarded), stage artifacts (artifacts), logged and registered models (models, policy_pyfunc,
reward_pyfunc, registry), the CLI's read-only look-ups (queries: `rlhf runs` reads a local
SQLite store's tables with SQL), URIs and UI links without MLflow (addresses), its errors
(errors). With a feature's own store (tasks/retrain/store.py, tasks/retrain/approval/store.py,
tasks/gc/store.py) the only code that imports mlflow or calls an MLflow client: the others call
their functions."""
