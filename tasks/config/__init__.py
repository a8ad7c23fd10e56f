"""The pipeline config, importing no feature: its own sections, the composed config and how
Prefect's form draws it."""
