"""The labelling tool's wing: Label Studio's REST API in the pipeline's words (a project of
pairs to label, the votes on them). It imports no other wing of tasks/."""
