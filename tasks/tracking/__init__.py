"""Everything that talks to MLflow: runs and their metrics (runs), the spool that keeps a
stage training through a server outage (spool, tables, guarded), stage artifacts (artifacts),
logged and registered models (models, policy_pyfunc, reward_pyfunc, registry). The only
package of the project that imports mlflow."""
