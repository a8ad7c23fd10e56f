"""Models and their files: loading, LoRA, checkpoints, chat templates, data and sampling."""
