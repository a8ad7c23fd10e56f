"""The pipeline's stages, one file each: a body, its :class:`~tasks.pipeline.stages.context.Stage`
entry and its Prefect task, all listed in ``tasks.pipeline.stages.table.STAGES``."""
