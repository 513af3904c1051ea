"""Reading spec files: YAML in, a validated pydantic model out, or one SpecError line.

The line always starts with the file name, then the dotted field path, then what is wrong
and, where it helps, the accepted values: `lab.yaml: topology.n: must lie between 2 and 64
(got 1): switch port count`. YAML problems name the line: `lab.yaml:3:7: YAML syntax error: ...`.

Whatever the file holds, the line is short: input is read only from regular files of at most
MAX_FILE_BYTES, YAML nesting and alias expansion are bounded while composing (before anything
is built from them), and values are quoted cut to a few dozen characters.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode
from yaml.parser import ParserError
from yaml.scanner import ScannerError

from orchestrator import files
from orchestrator.errors import SpecError
from orchestrator.units import shown

Model = TypeVar("Model", bound=BaseModel)

# Lab files are a few hundred bytes and experiment files a few KiB: these limits only stop a
# wrong or hostile file before it costs time or memory (a 388-byte file of nested aliases
# once expanded to 351 MB in an error message).
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 64  # nesting levels, also once aliases are expanded
MAX_NODES = 10_000  # values (scalars, lists, mappings) once aliases are expanded
MAX_NUMBER_DIGITS = 100  # Python refuses to convert ints of more than 4,300 digits
MAX_MESSAGE = 400  # characters of an error line
_MAX_SHOWN_PATH = 120



def read_yaml(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file, or a SpecError naming the file and line.

    The one entry point for spec files (lab and experiment): only a regular file of at most
    MAX_FILE_BYTES is read, and YAML nesting and aliases are bounded.
    """
    path = Path(path)
    where = display_path(path)
    text = _read_text(path, where)
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem and isinstance(exc, ComposerError) and "anchor" in exc.context:
            problem = exc.context.removesuffix("; first occurrence")  # "found duplicate anchor 'a'"
        what = "YAML syntax error" if isinstance(exc, (ScannerError, ParserError)) else "YAML error"
        raise SpecError(one_line(f"{at}: {what}: {problem}")) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow, e.g. NUL
        line = text.count("\n", 0, exc.position) + 1
        raise SpecError(one_line(f"{where}:{line}: YAML error: unacceptable character #x{exc.character:04x}: "
                                 "a spec file is plain text")) from None
    except yaml.YAMLError as exc:
        raise SpecError(one_line(f"{where}: YAML error: {str(exc).splitlines()[0]}")) from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{where}: expected a mapping of keys (name:, topology:, ...), got {got}")
    return data


def _read_text(path: Path, where: str) -> str:
    """The file's text: refused, in one line, unless a regular file of at most MAX_FILE_BYTES."""
    try:
        raw = files.read_regular(path, MAX_FILE_BYTES)
    except files.NotRegular as exc:
        if exc.kind == "a directory":
            raise SpecError(f"{where}: is a directory, expected a YAML file") from None
        raise SpecError(f"{where}: is {exc.kind}, not a regular file: give the path of a YAML file") from None
    except files.TooLarge:
        raw = b"x" * (MAX_FILE_BYTES + 1)  # said below, as for a file that grew while read
    except FileNotFoundError:
        raise SpecError(f"{where}: no such file") from None
    except OSError as exc:
        raise SpecError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the path
        raise SpecError(f"{where}: not a valid file name") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(
            f"{where}: larger than {MAX_FILE_BYTES >> 20} MiB: a lab or experiment file is a few KiB; "
            "is this the right file?"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): save it as UTF-8"
        ) from None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that bounds nesting, alias expansion and number length while composing, and
    refuses a key given twice (YAML would silently keep the last).

    PyYAML shares an aliased node rather than copying it, so loading nested aliases is cheap;
    what explodes is everything that walks the result (validation, an error message quoting
    it). So every node's expanded size and depth are counted as it is composed (an alias
    costs what its anchor costs) and the file is refused once either is past its limit.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0  # of the document so far, aliases expanded
        self._measured: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) once composed

    def _count(self, values: int, mark: Any) -> None:
        # Counted as events arrive, not when a list ends: PyYAML takes ~70 us per value (measured), so
        # waiting for the end of a 500,000-item list would take half a minute.
        self._values += values
        if self._values > MAX_NODES:
            raise ComposerError(None, None, f"more than {MAX_NODES:,} values (aliases expanded): "
                                "a spec file needs a few dozen", mark)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                if id(target) not in self._measured:
                    raise ComposerError(None, None, f"alias *{one_line(event.anchor, 30)} is used inside its "
                                        "own anchor: a value cannot contain itself", event.start_mark)
                self._count(self._measured[id(target)][0], event.start_mark)
            return super().compose_node(parent, index)  # the anchored node, or "undefined alias"
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
        self._count(1, mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [child for pair in node.value for child in pair]
        values, depth = 1, 0
        for child in children:
            child_values, child_depth = self._measured[id(child)]
            values, depth = values + child_values, max(depth, child_depth)
        if depth + 1 > MAX_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded",
                                node.start_mark)
        self._measured[id(node)] = (values, depth + 1)
        return node

    def construct_yaml_int(self, node: Node) -> int:
        if len(node.value) > MAX_NUMBER_DIGITS:
            raise ConstructorError(None, None, f"a number of {len(node.value):,} characters is too long",
                                   node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults` may repeat; later keys override
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # a list or mapping as a key
                raise ConstructorError(None, None, "a list or mapping cannot be a key", key_node.start_mark) from None
            if duplicate:
                raise ConstructorError(None, None, f"duplicate key {shown(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def one_line(message: str, width: int = MAX_MESSAGE) -> str:
    """`message` as one line of at most about `width` characters: control characters escaped."""
    if len(message) > 4 * width:
        message = message[: 4 * width]
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    return text if len(text) <= width else text[: width - 3] + "..."


def display_path(path: str | Path) -> str:
    """A file name as error messages show it: one line, its end kept if it is long."""
    text = str(path)
    if len(text) > _MAX_SHOWN_PATH:
        text = text[:30] + "..." + text[-(_MAX_SHOWN_PATH - 33):]
    return one_line(text, 4 * _MAX_SHOWN_PATH)


def validate(model: type[Model], data: dict[str, Any], source: str) -> Model:
    """Validate `data` against `model`; the first problem becomes a one-line SpecError."""
    try:  # files a spec names (a graph's `file:`) are relative to the one that names them
        return model.model_validate(data, context={"directory": Path(source).parent})
    except ValidationError as exc:
        raise SpecError(one_line(f"{display_path(source)}: {describe(model, exc)}")) from None


def load(model: type[Model], path: str | Path) -> Model:
    return validate(model, read_yaml(path), str(path))


def describe(model: type[BaseModel], exc: ValidationError) -> str:
    """One line for the first error: `field.path: problem`."""
    # A misspelt required key shows up twice: as unknown and as missing. The unknown one
    # carries the better message ("did you mean ..."), so it goes first.
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
    error = errors[0]
    owner, loc = _walk(model, error["loc"])
    field = ".".join(one_line(str(part), 40) for part in loc)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = error.get("input")
    described = _field(owner, loc[-1]) if loc else None
    about = described.description if described is not None and described.description else ""
    if kind == "extra_forbidden":
        known = [f.alias or name for name, f in owner.model_fields.items()] if _is_model(owner) else []
        hint = difflib.get_close_matches(str(loc[-1])[:40], known, n=1)
        suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
        return f"{field}: unknown key{suggestion} (known: {', '.join(known)})"
    if kind == "missing":
        return f"{field}: required but missing"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = ", ".join(sorted(_tags(owner, loc[-1]))) if loc else ""
        what = f"unknown kind {shown(ctx.get('tag'))}" if kind == "union_tag_invalid" else "missing"
        return f"{field}.kind: {what}: use one of {tags}"
    if kind == "literal_error":
        return f"{field}: {shown(got)} is not allowed: use {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        return f"{field}: {shown(got)} is not a valid value: {about or 'see the documentation'}"
    if kind in _BOUND_ERRORS and described is not None:
        low, high = _bounds(described)
        if low is not None and high is not None:
            return f"{field}: must lie between {low} and {high} (got {shown(got)}){': ' + about if about else ''}"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    message = message[0].lower() + message[1:] if message else message
    quoted = "" if isinstance(got, (dict, list)) else shown(got)
    plain = str(got) if isinstance(got, (str, float)) or (isinstance(got, int) and got.bit_length() < 200) else None
    if quoted and "(got " not in message and quoted not in message and (plain is None or plain not in message):
        message += f" (got {quoted})"
    # Checks across fields (model validators) name their fields in the message itself.
    return f"{field}: {message}" if field else message


_BOUND_ERRORS = ("greater_than_equal", "less_than_equal")


def _bounds(field: Any) -> tuple[Any, Any]:
    """(lowest, highest) a numeric field accepts, from its ge and le constraints."""
    low = high = None
    for constraint in field.metadata:
        low = getattr(constraint, "ge", low)
        high = getattr(constraint, "le", high)
    return low, high


def _is_model(thing: Any) -> bool:
    return isinstance(thing, type) and issubclass(thing, BaseModel)


def _field(owner: Any, name: Any) -> Any:
    """The field a location part names: by its name, or by its alias (`for` in a file)."""
    if not _is_model(owner):
        return None
    fields = owner.model_fields
    return fields.get(str(name)) or next((f for f in fields.values() if f.alias == name), None)


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
        if isinstance(part, int):  # a list's index: the items are of the list's model
            cleaned.append(part)
            continue
        if part == getattr(current, "__name__", None):  # a union member's class name: not in the file
            continue
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
    flat = _flatten((annotation,))
    for arg in flat:
        if hasattr(arg, "tagged_models"):  # a union made from a table (spec/lab.TopologySpec)
            return arg.tagged_models()
    models = [a for a in flat if _is_model(a)]
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
