"""Labels: the champion's answers collected as pairs to label (collect.py), and the labels
coming back from a file (imports.py) or from Label Studio (pull.py). Settings: ``collect:``."""
