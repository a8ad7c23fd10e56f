"""The great-expectations side of the data gate: each data set's suite, run chunk by chunk on
the cleaned rows, the chunks' results merged into one per set, and GX's own Data Docs. Failures
read as sentences a user can act on, with the rows, the GX expectation's name in brackets.

Row-level facts (chosen == rejected, token lengths) are derived columns checked with plain column
expectations: GX 1.x's ``UnexpectedRowsExpectation`` does not run on pandas.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from data_checks.adapters import COLUMNS, TEXT_FIELDS
from data_checks.config import ValidationConfig
from data_checks.tokens import TEXT_COLUMNS


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
    return f"row {number}: " + json.dumps({c: v for c, v in row.items() if c in TEXT_COLUMNS},
                                          default=str, ensure_ascii=False)[:200]


def example_rows(df: pd.DataFrame, indices: list, n_examples: int) -> list[str]:
    """'row 5: {...}' for the first ``n_examples`` of ``indices`` (labels) that ``df`` holds."""
    return [example_row(i + 1, {c: df.at[i, c] for c in df.columns})
            for i in indices[:n_examples] if isinstance(i, int) and i in df.index]


def e_g(examples: list[str]) -> str:
    """'; e.g. row 5: {...}; row 9: {...}' (nothing without examples)."""
    return f"; e.g. {'; '.join(examples)}" if examples else ""


def suite_context():
    """-> (GX context in memory, without progress bars; its pandas data source; the run id of
    a validation's first chunk)."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    context = gx.get_context(mode="ephemeral", project_config=DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        progress_bars=ProgressBarsConfig(globally=False)))
    return context, context.data_sources.add_pandas("rlhf"), \
        RunIdentifier(run_name="rlhf-validate")


@dataclass
class ChunkedSuite:
    """One data set's GX validation, run on each of its cleaned chunks, results merged."""

    name: str
    label: str
    definition: object
    run_id: object
    n_examples: int
    results: list[dict] = field(default_factory=list)  # each chunk's result as JSON
    examples: dict[int, list[str]] = field(default_factory=dict)  # expectation -> example rows
    shown: dict[int, int] = field(default_factory=dict)  # expectation -> indices looked at

    def run(self, checked: pd.DataFrame, first: int) -> None:
        """Validate one chunk of cleaned rows with check columns (``first``: its first row)."""
        from great_expectations.core.run_identifier import RunIdentifier

        run_id = self.run_id if first == 0 else RunIdentifier(
            run_name=f"rlhf-validate rows {first + 1}-")
        result = self.definition.run(batch_parameters={"dataframe": checked}, run_id=run_id,
                                     result_format={"result_format": "COMPLETE"})
        for j, r in enumerate(result.results):
            if r.success:
                continue
            indices = list(r.result.get("unexpected_index_list") or [])
            room = self.n_examples - self.shown.get(j, 0)
            if room > 0:  # the first n_examples of the set's indices, as one run names them
                self.examples.setdefault(j, []).extend(
                    example_rows(checked, indices[:room], room))
                self.shown[j] = self.shown.get(j, 0) + min(room, len(indices))
        self.results.append(result.to_json_dict())

    def merged(self, repeated: np.ndarray | None, examples: list[str] | None = None) -> dict:
        """The chunks' results as one; ``repeated``: the labels of rows repeated across the set,
        for compound-unique (None: GX saw them all)."""
        if len(self.results) == 1 and repeated is None:
            return self.results[0]
        merged = copy.deepcopy(self.results[0])
        for other in self.results[1:]:
            for mine, theirs in zip(merged["results"], other["results"]):
                mine["success"] = mine["success"] and theirs["success"]
                for key, value in theirs.get("result", {}).items():
                    if key.endswith("_count") and isinstance(value, int):
                        mine["result"][key] = mine["result"].get(key, 0) + value
                    elif isinstance(value, list) and key != "partial_unexpected_counts":
                        mine["result"][key] = (mine["result"].get(key) or []) + value
        for r in merged["results"]:
            res = r.get("result", {})
            if "partial_unexpected_list" in res:
                res["partial_unexpected_list"] = res["partial_unexpected_list"][:20]
            if r["expectation_config"]["type"] == "expect_compound_columns_to_be_unique" \
                    and repeated is not None:
                rows = [int(row) for row in repeated]
                self.examples[merged["results"].index(r)] = list(examples or [])
                r["success"] = not rows
                res.update(unexpected_count=len(rows), unexpected_index_list=rows,
                           partial_unexpected_index_list=rows[:20])
            n, missing = res.get("element_count"), res.get("missing_count") or 0
            if n and "unexpected_count" in res:
                share = 100.0 * res["unexpected_count"]
                res["unexpected_percent_total"] = share / n
                if n - missing:
                    res["unexpected_percent"] = share / (n - missing)
                    res["unexpected_percent_nonmissing"] = share / (n - missing)
        ok = sum(bool(r["success"]) for r in merged["results"])
        stats = merged["statistics"]
        stats.update(successful_expectations=ok,
                     unsuccessful_expectations=stats["evaluated_expectations"] - ok,
                     success_percent=100.0 * ok / max(stats["evaluated_expectations"], 1))
        merged["success"] = ok == stats["evaluated_expectations"]
        return merged

    def failures(self, merged: dict) -> list[str]:
        """The sentence of each failed expectation of ``merged``."""
        out = []
        for j, r in enumerate(merged["results"]):
            if r["success"]:
                continue
            cfg = r["expectation_config"]
            kwargs = {k: v for k, v in cfg["kwargs"].items() if k != "batch_id"}
            res = r.get("result", {})
            indices = list(res.get("unexpected_index_list") or [])
            count = res.get("unexpected_count", len(indices) or "some")
            rows = f": rows {_rows(indices)}" if indices else ""
            out.append(f"{self.label}: {_what(cfg['type'], kwargs, count)}{rows} "
                       f"[{cfg['type']}]" + e_g(self.examples.get(j, [])))
        return out


def one_page_per_set(context, merged: list[tuple[ChunkedSuite, dict]]) -> None:
    """One validation page per data set in GX's Data Docs: its merged result, under its first
    chunk's run."""
    from great_expectations.core.expectation_validation_result import (
        ExpectationSuiteValidationResultSchema,
    )

    store = context.validation_results_store
    by_batch = {f"rlhf-{suite.name}": result for suite, result in merged
                if len(suite.results) > 1}
    for key in store.list_keys():
        _, run_name, _, batch = key.to_tuple()
        if batch not in by_batch:
            continue
        if run_name == "rlhf-validate":
            store.set(key, ExpectationSuiteValidationResultSchema().load(by_batch[batch]))
        else:
            store.remove_key(key)


def suite_for(context, source, run_id, name: str, kind: str, cfg: ValidationConfig,
              label: str) -> ChunkedSuite:
    """The GX validation of data set ``name`` (its kind's suite, added once per context)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    batch_def = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe(name)
    if f"rlhf_{kind}" in [s.name for s in context.suites.all()]:
        suite = context.suites.get(f"rlhf_{kind}")
    else:
        suite = gx.ExpectationSuite(name=f"rlhf_{kind}")
        for col in COLUMNS[kind]:
            for expectation in (gxe.ExpectColumnValuesToNotBeNull(column=col),
                                gxe.ExpectColumnValueLengthsToBeBetween(column=col, min_value=1),
                                gxe.ExpectColumnValuesToNotMatchRegex(column=col, regex=r"^\s*$")):
                suite.add_expectation(expectation)
        suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(
            column="prompt_tokens", min_value=1, max_value=cfg.max_prompt_tokens))
        for col in TEXT_FIELDS[kind]:
            suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(
                column=f"{col}_tokens", min_value=1, max_value=cfg.max_response_tokens))
        if kind == "preference":
            suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(
                column="chosen_equals_rejected", value_set=[False]))
            suite.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(
                column_list=["prompt", "chosen", "rejected"]))
        suite = context.suites.add(suite)
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=name, data=batch_def, suite=suite))
    return ChunkedSuite(name, label, definition, run_id, cfg.example_rows)
