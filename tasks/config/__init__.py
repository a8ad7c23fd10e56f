"""The pipeline config, in the pipeline's words and importing no feature: every section
(rlhf_core's and data_checks', and the pipeline's own in sections.py: retrain, collect, demo,
tracking, routing), composed and loaded in pipeline_config.py (the file, ``--set``, grids,
``ConfigError``), and how Prefect's Custom run form draws a section and reads it back
(form.py)."""
