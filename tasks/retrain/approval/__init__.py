"""A person signs off a retrain's candidate before it becomes champion."""
