"""The pipeline config, importing no feature: the pipeline's own sections (sections.py),
composed and loaded with the others in pipeline_config.py, and drawn for Prefect's form
(form.py)."""
