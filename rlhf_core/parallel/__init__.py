"""Data parallelism: the process group, FSDP sharding and global statistics across ranks."""
