"""How Prefect's Custom run form draws a config section and reads it back: an ``X | None``
field whose default is None is X's own input, left empty it is None; a section the form may
leave empty as a whole is drawn without defaults. The sections themselves know no form."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from rlhf_core.section import Section


def empty_input_for_none(schema: dict[str, Any]) -> None:
    """A section's JSON schema as the form draws it: each ``X | None`` field whose default is
    None becomes X's own input, ``anyOf: [X, null]`` -> X with no default; left empty it is
    None (:func:`blanks_as_none`). A form otherwise draws a choice whose None side reads
    'Property is type "None"'. A field whose default is a value keeps its None choice: None
    means something there (ppo.missing_eos_penalty)."""
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
    """A section the form may leave empty as a whole (``model.lora``, a schedule): its fields
    drawn without defaults (the description says them), so an untouched section stays
    empty, i.e. None, instead of being filled with its defaults and turned on."""
    for prop in schema.get("properties", {}).values():
        if "default" in prop:
            prop["description"] = f"{prop.get('description', '')} Empty: {prop.pop('default')}."


def _no_required(schema: dict[str, Any]) -> None:
    """Nothing the form must fill in: a data source's path and the data's sources are
    checked by their validators, which name what is missing."""
    schema.pop("required", None)


# the sections drawn otherwise beside empty_input_for_none, by class name
FORM_RULES = {"LoraSettings": defaults_in_words, "ScheduleConfig": defaults_in_words,
              "DataSource": _no_required, "DataConfig": _no_required}


def draw_form(schema: dict[str, Any], handler, seen: set[int] | None = None) -> None:
    """Each section ``schema`` reaches (through ``$ref``s the JSON-schema ``handler``
    resolves) drawn as the form draws it: :func:`empty_input_for_none`, then its
    ``FORM_RULES`` entry."""
    seen = set() if seen is None else seen
    node = handler.resolve_ref_schema(schema) if "$ref" in schema else schema
    if id(node) in seen:
        return
    seen.add(id(node))
    for option in schema.get("anyOf", []):
        draw_form(option, handler, seen)
    if "properties" not in node:
        return
    empty_input_for_none(node)
    FORM_RULES.get(node.get("title", ""), lambda _: None)(node)
    for prop in node["properties"].values():
        for part in (prop, *prop.get("anyOf", []), prop.get("items") or {},
                     prop.get("additionalProperties") or {}):
            if isinstance(part, dict) and ("$ref" in part or "properties" in part):
                draw_form(part, handler, seen)


def _blank(value: Any) -> bool:
    """What a form leaves empty: "", None or an empty list, or a section with nothing filled
    in."""
    if isinstance(value, Mapping):
        return all(_blank(v) for v in value.values())
    return value is None or value == "" or value == []


def _section_of(annotation: Any) -> type[Section] | None:
    """The section class a field holds (``X`` or ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    found = [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type)
             and issubclass(a, Section)]
    return found[0] if len(found) == 1 else None


def blanks_as_none(section: type[BaseModel], value: Any) -> Any:
    """A section as a form sends it: each field whose default is None and that the form left
    empty ("" or a section with nothing filled in) is None, in the sections inside too."""
    if not isinstance(value, Mapping):
        return value
    out = {}
    for key, given in value.items():
        field = section.model_fields.get(key)
        inner = None if field is None else _section_of(field.annotation)
        if field is not None and field.default is None and _blank(given):
            out[key] = None
        elif inner is not None:
            out[key] = blanks_as_none(inner, given)
        else:
            out[key] = given
    return out


def form_values(section: BaseModel) -> dict[str, Any]:
    """A section as a form holds it (a deployment's stored parameters): a field that is None
    where None is its default is left out, as its empty input leaves it (the server refuses
    a null for an input that is X's own); the rest as JSON."""
    dump = section.model_dump(mode="json")
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        if value is None and field.default is None:
            dump.pop(name)
        elif isinstance(value, Section):
            dump[name] = form_values(value)
    return dump


class Form:
    """``Annotated[X, Form()]``: section X (or ``X | None``) as a flow parameter, drawn and
    read as the form does (:func:`draw_form`, :func:`blanks_as_none`); an optional one is
    drawn as X's own fields, not a choice of None."""

    def __get_pydantic_core_schema__(self, source: Any, handler) -> Any:
        from pydantic_core import core_schema

        schema = handler(source)
        section = _section_of(source)
        if section is None:
            return schema
        return core_schema.no_info_before_validator_function(
            lambda value: blanks_as_none(section, value), schema)

    def __get_pydantic_json_schema__(self, schema: Any, handler) -> dict[str, Any]:
        drawn = handler(schema)
        options = [o for o in drawn.pop("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            drawn.update(options[0])
        elif options:
            drawn["anyOf"] = options
        draw_form(drawn, handler)
        return drawn


