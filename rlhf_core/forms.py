"""How a config section is drawn in Prefect's Custom run form and read back from it: an
``X | None`` field whose default is None is X's own input, left empty it is None."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def empty_input_for_none(schema: dict[str, Any]) -> None:
    """The JSON schema of a section (what Prefect's Custom run form draws): each ``X | None``
    field whose default is None becomes X's own input, ``anyOf: [X, null]`` -> X with no
    default; left empty it is None (:meth:`Section._form_blanks`). A form otherwise draws a
    choice whose None side reads 'Property is type "None"'. A field whose default is a value
    keeps its None choice: None means something there (ppo.missing_eos_penalty)."""
    for prop in schema.get("properties", {}).values():
        options = prop.get("anyOf", [])
        if prop.get("default", 0) is not None or not any(o.get("type") == "null"
                                                          for o in options):
            continue
        rest = [o for o in prop.pop("anyOf") if o.get("type") != "null"]
        del prop["default"]
        if len(rest) == 1:
            prop.update(rest[0])
        else:
            prop["anyOf"] = rest


def defaults_in_words(schema: dict[str, Any]) -> None:
    """A section the form may leave empty as a whole (``model.lora``, a schedule): its
    fields drawn without defaults (the description says them), so an untouched section
    stays empty, i.e. None, instead of being filled with its defaults and turned on."""
    empty_input_for_none(schema)
    for prop in schema.get("properties", {}).values():
        if "default" in prop:
            prop["description"] = f"{prop.get('description', '')} Empty: {prop.pop('default')}."


def _blank(value: Any) -> bool:
    """What a form leaves empty: "", None or an empty list, or a section with nothing filled
    in."""
    if isinstance(value, Mapping):
        return all(_blank(v) for v in value.values())
    return value is None or value == "" or value == []


class Section(BaseModel):
    """A frozen, strict config section, drawn for forms by :func:`empty_input_for_none`."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False,
                              json_schema_extra=empty_input_for_none)

    def form_values(self) -> dict[str, Any]:
        """The section as a form holds it (a deployment's stored parameters): a field that is
        None where None is its default is left out, as its empty input leaves it (the
        server refuses a null for an input that is X's own); the rest as JSON."""
        dump = self.model_dump(mode="json")
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value is None and field.default is None:
                dump.pop(name)
            elif isinstance(value, Section):
                dump[name] = value.form_values()
        return dump

    @model_validator(mode="before")
    @classmethod
    def _form_blanks(cls, value: Any) -> Any:
        """A field whose default is None, left empty by a form ("" or a section with nothing
        filled in): None."""
        if not isinstance(value, Mapping):
            return value
        return {k: None if k in cls.model_fields and cls.model_fields[k].default is None
                and _blank(v) else v for k, v in value.items()}
