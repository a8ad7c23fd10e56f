"""Everything that talks to MLflow: with the features' own stores the only code importing it."""
