"""How a stage runs when not in the task's own process: on torchrun ranks (launch), on
another machine's Prefect worker (remote); and what it measures of itself (memory)."""
