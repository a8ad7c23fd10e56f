"""Labels: the champion's answers collected as pairs to label, and the labels coming back from
a file or from Label Studio."""
