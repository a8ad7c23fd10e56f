"""The `rlhf` command line: parsing, the commands, their output, signal handling and the exit
codes. It sits above the flows (flows/) and calls them; nothing below imports it."""
