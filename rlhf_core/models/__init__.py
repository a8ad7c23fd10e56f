"""Models and their files: loading with one load spec, LoRA, checkpoints, precision, chat
templates, tokenised data, reward scores and sampling."""
