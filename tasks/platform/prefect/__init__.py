"""Prefect, torchrun and the servers' checks in the pipeline's words, knowing no feature."""
