"""Labels, in one folder: the champion's answers collected as pairs to label (collect.py), the
labels coming back from a file (imports.py) or pulled from Label Studio (pull.py), a
collection's Label Studio project (studio.py) and the tool's REST API in the pipeline's words
(client.py: keys, projects, tasks, votes; project.py: the pairwise labelling page); their
settings are the pipeline config's ``collect:`` section (tasks/config/sections.py)."""
