"""Reading spec files: YAML in, a validated pydantic model out, or one SpecError line.

The line always starts with the file name, then the dotted field path, then what is wrong
and, where it helps, the accepted values: `lab.yaml: topology.n: must be >= 2 (got 1)`.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import SpecError

Model = TypeVar("Model", bound=BaseModel)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file, or a SpecError naming the file and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, expected a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise SpecError(f"{where}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: YAML error: {exc}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{path}: expected a mapping of keys (name:, topology:, ...), got {got}")
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice (YAML would silently keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def validate(model: type[Model], data: dict[str, Any], source: str) -> Model:
    """Validate `data` against `model`; the first problem becomes a one-line SpecError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {describe(model, exc)}") from None


def load(model: type[Model], path: str | Path) -> Model:
    return validate(model, read_yaml(path), str(path))


def describe(model: type[BaseModel], exc: ValidationError) -> str:
    """One line for the first error: `field.path: problem`."""
    # A misspelt required key shows up twice: as unknown and as missing. The unknown one
    # carries the better message ("did you mean ..."), so it goes first.
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    error = errors[0]
    owner, loc = _walk(model, error["loc"])
    field = ".".join(str(part) for part in loc)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = error.get("input")
    if kind == "extra_forbidden":
        known = list(owner.model_fields) if _is_model(owner) else []
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
        return f"{field}: unknown key{suggestion} (known: {', '.join(known)})"
    if kind == "missing":
        return f"{field}: required but missing"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = ", ".join(sorted(_tags(owner, loc[-1]))) if loc else ""
        what = f"unknown kind {ctx.get('tag')!r}" if kind == "union_tag_invalid" else "missing"
        return f"{field}.kind: {what}: use one of {tags}"
    if kind == "literal_error":
        return f"{field}: {got!r} is not allowed: use {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        described = _field(owner, loc[-1]) if loc else None
        why = described.description if described is not None and described.description else ""
        return f"{field}: {got!r} is not a valid value: {why or 'see the documentation'}"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    message = message[0].lower() + message[1:] if message else message
    scalar = not isinstance(got, (dict, list))
    shown = f" (got {got!r})" if scalar and repr(got) not in message and str(got) not in message else ""
    # Checks across fields (model validators) name their fields in the message itself.
    return f"{field}: {message}{shown}" if field else f"{message}{shown}"


def _is_model(thing: Any) -> bool:
    return isinstance(thing, type) and issubclass(thing, BaseModel)


def _field(owner: Any, name: Any) -> Any:
    return owner.model_fields.get(str(name)) if _is_model(owner) else None


def _walk(model: type[BaseModel], loc: tuple) -> tuple[Any, tuple]:
    """The model that holds the last key of `loc`, and `loc` without union tags.

    Pydantic puts the chosen tag into the location (`topology.bcube.n`); users wrote
    `topology.n`, so the tag is dropped and the tagged model is followed instead.
    """
    owner: Any = model
    current: Any = model
    cleaned: list = []
    for part in loc:
        if isinstance(current, dict):  # a discriminated union: this part is the tag
            current = current.get(part)
            continue
        if current is None:  # below a plain field: the rest are union-member tags
            break
        owner = current
        cleaned.append(part)
        field = _field(current, part)
        current = _models_of(field.annotation) if field is not None else None
    return owner, tuple(cleaned)


def _tags(owner: Any, name: Any) -> list[str]:
    field = _field(owner, name)
    models = _models_of(field.annotation) if field is not None else None
    return list(models) if isinstance(models, dict) else []


def _models_of(annotation: Any) -> Any:
    """A model class, or a {tag: model} dict for a discriminated union, or None."""
    if _is_model(annotation):
        return annotation
    models = [a for a in _flatten(typing.get_args(annotation)) if _is_model(a)]
    tagged = {}
    for candidate in models:
        kind = candidate.model_fields.get("kind")
        if kind is not None:
            for value in typing.get_args(kind.annotation):
                tagged[value] = candidate
    if tagged:
        return tagged
    return models[0] if len(models) == 1 else None


def _flatten(args: tuple) -> list:
    out: list = []
    for arg in args:
        inner = typing.get_args(arg)
        out.extend(_flatten(inner) if inner else [arg])
    return out
