"""The outside services in the pipeline's words, knowing no feature: MLflow (mlflow/: runs,
artifacts, models, the registry, tags), Prefect (prefect/: its API, events, launching stages
on ranks or another machine's worker, logins, preflight), JSON files written atomically
(files.py) and the redaction of secrets in what is shown (redact.py)."""
