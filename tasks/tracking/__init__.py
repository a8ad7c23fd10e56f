"""Everything that talks to MLflow: runs and their metrics (runs), the pipeline's parent run
(parent_run), the spool that keeps a stage training through a server outage (spool, tables,
guarded), stage artifacts (artifacts), logged and registered models (models, policy_pyfunc,
reward_pyfunc, registry), the champion wing's collections, label imports and consumed
batches (champion_store), the CLI's read-only look-ups (queries: `rlhf runs` reads a local
SQLite store's tables with SQL), URIs and UI links without MLflow (addresses), its errors
(errors). The only package of the project that imports mlflow or reads MLflow's tables, and
the only one that calls an MLflow client: the others call its functions."""
