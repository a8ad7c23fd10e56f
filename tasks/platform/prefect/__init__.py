"""Prefect in the pipeline's words: its API, events, stages on torchrun ranks or other
machines, server checks and notifications."""
