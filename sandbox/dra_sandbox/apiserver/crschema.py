"""Custom resources checked against their CRD's structural OpenAPI v3 schema, as the apiextensions server
does on create, update and status update: unknown fields are pruned (unless
`x-kubernetes-preserve-unknown-fields`), then types, enums, bounds, lengths, item counts, patterns and
required fields are validated, each failure a FieldError at the field's path with the apiserver's wording
(`spec.x in body should be less than or equal to 100`).

Not covered: defaults, `x-kubernetes-validations` (CEL rules), `format`, `nullable` beyond accepting null,
`oneOf`/`allOf`/`not`, list types and map keys (`x-kubernetes-list-type`), and metadata (checked elsewhere).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .validation.fielderrors import INVALID, NOT_SUPPORTED, REQUIRED, TOO_LONG, TOO_MANY, FieldError

_TOP_LEVEL = ("apiVersion", "kind", "metadata")


# The JSON type of a decoded value, as a structural schema's `type` names it; bool before int (a bool is an int).
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"), (Mapping, "object"),
)


def _type_of(value: Any) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "null")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune(value: Any, schema: Mapping[str, Any], path: str = "") -> tuple[Any, list[str]]:
    """`value` without the fields `schema` does not declare, and the paths of those dropped."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(schema, Mapping):
        return value, []
    dropped: list[str] = []
    if isinstance(value, Mapping) and _type_of(value) == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out: dict[str, Any] = {}
        for key, sub in value.items():
            if path == "" and key in _TOP_LEVEL:
                out[key] = sub
            elif props is not None and key in props:
                out[key], more = prune(sub, props[key], _join(path, key))
                dropped += more
            elif isinstance(extra, Mapping):
                out[key], more = prune(sub, extra, _join(path, key))
                dropped += more
            elif extra is True:
                out[key] = sub
            else:
                dropped.append(_join(path, key))
        return out, dropped
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        items = []
        for i, item in enumerate(value):
            kept, more = prune(item, schema["items"], f"{path}[{i}]")
            items.append(kept)
            dropped += more
        return items, dropped
    return value, []


def _bound(path: str, value: Any, schema: Mapping[str, Any]) -> list[FieldError]:
    out: list[FieldError] = []
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and (value <= low if schema.get("exclusiveMinimum") is True else value < low):
        word = "greater than" if schema.get("exclusiveMinimum") is True else "greater than or equal to"
        out.append(FieldError(path, INVALID, f"{path} in body should be {word} {low}", value))
    if high is not None and (value >= high if schema.get("exclusiveMaximum") is True else value > high):
        word = "less than" if schema.get("exclusiveMaximum") is True else "less than or equal to"
        out.append(FieldError(path, INVALID, f"{path} in body should be {word} {high}", value))
    return out


def validate(value: Any, schema: Mapping[str, Any], path: str = "") -> list[FieldError]:
    """Every schema violation in `value` (already pruned), in document order."""
    if value is None:
        return [] if schema.get("nullable") or not path else [
            FieldError(path, INVALID, f"{path} in body must be of type {schema.get('type', 'object')}: \"null\"",
                       value)]
    if schema.get("x-kubernetes-int-or-string"):
        if _type_of(value) not in ("integer", "string"):
            return [FieldError(path, INVALID, f"{path} in body must be of type integer-or-string: "
                               f"\"{_type_of(value)}\"", value)]
        return []
    wanted, actual = schema.get("type"), _type_of(value)
    if wanted and not (wanted == actual or (wanted == "number" and actual == "integer")):
        return [FieldError(path, INVALID, f"{path} in body must be of type {wanted}: \"{actual}\"", value)]
    errors: list[FieldError] = []
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(f'"{v}"' for v in schema["enum"])
        errors.append(FieldError(path, NOT_SUPPORTED, f"supported values: {supported}", value))
    if actual in ("integer", "number"):
        errors += _bound(path, value, schema)
    elif actual == "string":
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(FieldError(path, TOO_LONG, f"may not be more than {schema['maxLength']} bytes"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(FieldError(path, INVALID, f"{path} in body should be at least {schema['minLength']} "
                                     "chars long", value))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(FieldError(path, INVALID, f"{path} in body should match '{schema['pattern']}'", value))
    elif actual == "array":
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(FieldError(path, TOO_MANY, f"must have at most {schema['maxItems']} items", len(value)))
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(FieldError(path, INVALID, f"{path} in body should have at least {schema['minItems']} "
                                     "items", len(value)))
        if isinstance(schema.get("items"), Mapping):
            for i, item in enumerate(value):
                errors += validate(item, schema["items"], f"{path}[{i}]")
    elif actual == "object":
        for name in schema.get("required") or []:
            if name not in value:
                errors.append(FieldError(_join(path, name), REQUIRED))
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for key, sub in value.items():
            if not path and key in _TOP_LEVEL:
                continue
            if key in props:
                errors += validate(sub, props[key], _join(path, key))
            elif isinstance(extra, Mapping):
                errors += validate(sub, extra, f"{path}[{key}]")
    return errors


def check(obj: Mapping[str, Any], schema: Mapping[str, Any], *, only: str | None = None,
          skip: tuple[str, ...] = ()) -> list[FieldError]:
    """Validate a custom resource: all of it but the top-level fields in `skip` (status, when a subresource
    owns it), or only its top-level field `only` (a status update)."""
    if only is not None:
        sub = (schema.get("properties") or {}).get(only)
        return validate(obj.get(only), sub, only) if isinstance(sub, Mapping) and only in obj else []
    body = {k: v for k, v in obj.items() if k not in _TOP_LEVEL and k not in skip}
    required = [r for r in schema.get("required") or [] if r not in _TOP_LEVEL]
    return validate(body, {**schema, "required": required})
