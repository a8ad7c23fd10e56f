"""Everything that talks to MLflow: runs and their metrics (runs), the pipeline's parent run
(parent_run), the spool that keeps a stage training through a server outage (spool, tables,
guarded), stage artifacts (artifacts), logged and registered models (models, policy_pyfunc,
reward_pyfunc, registry), the champion wing's collections, label imports and consumed
batches (champion_store). The only package of the project that imports mlflow, and the only
one that calls an MLflow client: the others call its functions."""
