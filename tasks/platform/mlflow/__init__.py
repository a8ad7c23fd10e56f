"""Everything that talks to MLflow: with the features' own stores the only code that imports it,
so the rest of the project depends on these functions, not on MLflow's API."""
