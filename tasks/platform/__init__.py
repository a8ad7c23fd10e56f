"""MLflow, Prefect and file helpers in the pipeline's words, knowing no feature."""
