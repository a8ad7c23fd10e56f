"""Data-gate failures as sentences a user can act on, with the rows; the GX expectation name
follows in brackets for whoever wants to find it in the Data Docs."""

from __future__ import annotations

import json

import pandas as pd

SHOWN_COLUMNS = ("prompt", "response", "chosen", "rejected")


def _rows(indices: list, limit: int = 10) -> str:
    numbers = [i + 1 for i in indices if isinstance(i, int)]
    text = ", ".join(map(str, numbers[:limit]))
    return text + (f" and {len(numbers) - limit} more" if len(numbers) > limit else "")


def _what(kind: str, kwargs: dict, count) -> str:
    """'<count> rows have ...' for each expectation the suites use."""
    col = kwargs.get("column", "")
    field = col.removesuffix("_tokens")
    if kind == "expect_column_values_to_not_be_null":
        return f"{count} rows have no {col} (null or missing)"
    if kind == "expect_column_value_lengths_to_be_between":
        return f"{count} rows have an empty {col}"
    if kind == "expect_column_values_to_not_match_regex":
        return f"{count} rows have a {col} of whitespace only"
    if kind == "expect_column_values_to_be_between" and col.endswith("_tokens"):
        extra = " (EOS included)" if field != "prompt" else ""
        return (f"{count} rows have a {field} outside the token budget of "
                f"{kwargs.get('min_value')}..{kwargs.get('max_value')} tokens{extra}")
    if kind == "expect_column_values_to_be_in_set" and col == "chosen_equals_rejected":
        return f"{count} pairs have chosen == rejected"
    if kind == "expect_compound_columns_to_be_unique":
        return f"{count} rows repeat another row's {' + '.join(kwargs.get('column_list', []))}"
    return f"{count} rows fail {kind} {kwargs}"


def example_row(number: int, row: dict) -> str:
    """'row 5: {"prompt": ...}': the row's text columns as JSON, cut at 200 characters."""
    return f"row {number}: " + json.dumps({c: v for c, v in row.items() if c in SHOWN_COLUMNS},
                                          default=str, ensure_ascii=False)[:200]


def example_rows(df: pd.DataFrame, indices: list, n_examples: int) -> list[str]:
    """'row 5: {...}' for the first ``n_examples`` of ``indices`` (row labels of ``df``: the
    number shown is the label + 1, the row's place in the file) that ``df`` holds."""
    return [example_row(i + 1, {c: df.at[i, c] for c in df.columns})
            for i in indices[:n_examples] if isinstance(i, int) and i in df.index]


def failure_text(label: str, kind: str, kwargs: dict, count, indices: list,
                 examples: list[str]) -> str:
    """The sentence of one failed expectation from its parts."""
    rows = f": rows {_rows(indices)}" if indices else ""
    return f"{label}: {_what(kind, kwargs, count)}{rows} [{kind}]" + \
        (f"; e.g. {'; '.join(examples)}" if examples else "")
