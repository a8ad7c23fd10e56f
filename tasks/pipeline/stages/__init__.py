"""The pipeline's stages, one file each: a body (load -> call rlhf_core -> return a typed
record), its :class:`~tasks.pipeline.stages.context.Stage` entry and its Prefect task. The table of
them all is ``tasks.pipeline.stages.table.STAGES``."""
