"""Which policy serves, and how a new one earns it: the pipeline's champion rule (rule), the
retrain's gate scorers (scorers), preference batches (batches), answers collected from the
champion and their labels (collect, labels), and the retrain's events and settings."""
