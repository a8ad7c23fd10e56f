"""The pipeline's stages, one file each: a body (load -> call rlhf_core -> return a typed
record), its :class:`~tasks.stages.context.Stage` entry and its Prefect task. The table of
them all is ``tasks.stages.table.STAGES``."""
