"""How Prefect's Custom run form draws a config section and reads it back, so an optional
field is a plain input that reads back as None when left empty. The sections know no form."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from rlhf_core.section import Section


def _without_null(schema: dict[str, Any]) -> None:
    """``X | None`` drawn as X: the null option dropped, a single option left taken in."""
    options = [o for o in schema.pop("anyOf", []) if o.get("type") != "null"]
    if len(options) == 1:
        schema.update(options[0])
    elif options:
        schema["anyOf"] = options


def defaults_in_words(schema: dict[str, Any]) -> None:
    """Move a section's defaults into its descriptions, so an untouched optional section
    stays None instead of being filled in and turned on."""
    for prop in schema.get("properties", {}).values():
        if "default" in prop:
            prop["description"] = f"{prop.get('description', '')} Empty: {prop.pop('default')}."


# the sections drawn otherwise, by class name; nothing is required in a data section's form
# (the validators name what is missing)
FORM_RULES = {"LoraSettings": defaults_in_words, "ScheduleConfig": defaults_in_words,
              **dict.fromkeys(("DataSource", "DataConfig"), lambda s: s.pop("required", None))}


def draw_form(schema: dict[str, Any], handler, seen: set[int] | None = None) -> None:
    """Draw every section ``schema`` reaches through its ``$ref``s: each ``X | None`` field
    defaulting to None as X's own input, not a choice with a 'Property is type "None"' side (a
    field with a value default keeps its None choice), then its ``FORM_RULES``."""
    seen = set() if seen is None else seen
    node = handler.resolve_ref_schema(schema) if "$ref" in schema else schema
    if id(node) in seen:
        return
    seen.add(id(node))
    for option in schema.get("anyOf", []):
        draw_form(option, handler, seen)
    if "properties" not in node:
        return
    for prop in node["properties"].values():
        options = prop.get("anyOf", [])
        if prop.get("default", 0) is None and any(o.get("type") == "null" for o in options):
            del prop["default"]
            _without_null(prop)
    FORM_RULES.get(node.get("title", ""), lambda _: None)(node)
    for prop in node["properties"].values():
        for part in (prop, *prop.get("anyOf", []), prop.get("items") or {},
                     prop.get("additionalProperties") or {}):
            if isinstance(part, dict) and ("$ref" in part or "properties" in part):
                draw_form(part, handler, seen)


def _blank(value: Any) -> bool:
    """Empty as a form leaves it: "", None, an empty list, or a section with nothing in it."""
    if isinstance(value, Mapping):
        return all(_blank(v) for v in value.values())
    return value is None or value == "" or value == []


def _section_of(annotation: Any) -> type[Section] | None:
    """The section class a field holds (``X`` or ``X | None``), else None."""
    found = [a for a in (annotation, *getattr(annotation, "__args__", ()))
             if isinstance(a, type) and issubclass(a, Section)]
    return found[0] if len(found) == 1 else None


def blanks_as_none(section: type[BaseModel], value: Any) -> Any:
    """A section as a form sends it, with each empty field whose default is None set to None,
    recursively."""
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
    """A section as JSON for a form, leaving out fields at their None default (the server
    refuses a null for a plain input)."""
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
    read back as the form does."""

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
        _without_null(drawn)
        draw_form(drawn, handler)
        return drawn


