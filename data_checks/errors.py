"""The data layer's errors, in a module that imports nothing: the CLI names them in its
except clauses without loading pandas or the data gate."""

from __future__ import annotations


class DataError(ValueError):
    """Malformed input; the message names the file and the line, row or column."""


class ValidationFailed(Exception):
    """A failed expectation; the message lists every failure with example rows."""
