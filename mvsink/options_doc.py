"""The sink's options as ``help()``, IDEs and docs/options.md show them, made from ``SinkOptions``.

Each option's description is the docstring under its field in ``config.py`` (pydantic's
``use_attribute_docstrings``), its type and default are the field's: this module only renders
them. ``sink.py`` gives ``MVSink.__init__`` the signature (``options_signature``) and ``MVSink``
the docstring section (``options_section``); docs/options.md is ``options_markdown()``, written
by ``COMMAND`` (a script: ``python -m`` of a module the package imports warns).
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from mvsink.config import RetryPolicy, SinkOptions

COMMAND = "python scripts/options_doc.py > docs/options.md"
POSITIONAL = ("target", "name")
"""The options ``MVSink`` takes positionally; every other is keyword-only."""


def type_text(model: type[BaseModel], name: str) -> str:
    """A field's type as written in its class (``str | None``, ``RetryPolicy``)."""
    for cls in model.__mro__:
        annotation = vars(cls).get("__annotations__", {}).get(name)
        if annotation is not None:
            return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return inspect.formatannotation(model.model_fields[name].annotation)


def default_of(field: FieldInfo) -> Any:
    """A field's default (a factory's value); ``inspect.Parameter.empty`` for a required one."""
    if field.is_required():
        return inspect.Parameter.empty
    return field.get_default(call_default_factory=True, validated_data={})


def default_text(field: FieldInfo) -> str:
    """A field's default as docs show it (a model of defaults as ``RetryPolicy()``)."""
    value = default_of(field)
    if isinstance(value, BaseModel) and value == type(value)():
        return f"{type(value).__name__}()"
    return repr(value)


def bounds_text(field: FieldInfo) -> str:
    """A field's numeric bounds (``>= 1, <= 1000``), or ``""``."""
    ops = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return ", ".join(
        f"{op} {getattr(item, attr)}"
        for item in field.metadata
        for attr, op in ops.items()
        if hasattr(item, attr)
    )


def first_sentence(text: str) -> str:
    """The first sentence of a description, on one line: up to the first ``.``, ``!`` or ``?``
    followed by a space that is outside parentheses and ``code`` and ends no ``e.g.`` or ``...``."""
    text = " ".join(text.split())
    depth, code, i = 0, False, 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            run = len(text[i:]) - len(text[i:].lstrip("`"))
            code, i = not code, i + run
            continue
        if not code:
            depth += (ch == "(") - (ch == ")")
            ends = ch in ".!?" and depth <= 0 and text[i + 1 : i + 2] in (" ", "")
            abbreviation = text[: i + 1].endswith(("e.g.", "i.e.", ".."))
            if ends and not abbreviation and not text[i + 2 : i + 3].islower():
                return text[: i + 1]
        i += 1
    return text


def options_signature(model: type[BaseModel] = SinkOptions) -> inspect.Signature:
    """An ``__init__(self, ...) -> None`` signature of the model's fields: ``POSITIONAL``, then
    the others keyword-only, each with its type and default."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD)]
    for name, field in model.model_fields.items():
        kind = P.POSITIONAL_OR_KEYWORD if name in POSITIONAL else P.KEYWORD_ONLY
        params.append(P(name, kind, default=default_of(field), annotation=field.annotation))
    params.sort(key=lambda p: p.kind)  # stable: POSITIONAL first, then the options in the model's order
    return inspect.Signature(params, return_annotation=None)


def options_section(model: type[BaseModel] = SinkOptions, width: int = 92) -> str:
    """A docstring section listing each field with its type, default and first sentence."""
    intro = (
        f"Parameters: {', '.join(f'``{p}``' for p in POSITIONAL)}, then the options, keyword-only; "
        f"``{model.__name__}`` validates them (a wrong name or value is a ``ConfigError``) and "
        "docs/options.md describes each in full:"
    )
    lines = [*textwrap.wrap(intro, width, break_on_hyphens=False), ""]
    for name, field in model.model_fields.items():
        default = "" if field.is_required() else f" = {default_text(field)}"
        lines.append(f"{name}: {type_text(model, name)}{default}")
        summary = first_sentence(field.description or "")
        lines += textwrap.wrap(
            summary, width, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False
        )
    return "\n".join(lines)


def _markdown_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out: list[str] = []
    for name, field in model.model_fields.items():
        default = "required" if field.is_required() else f"default `{default_text(field)}`"
        facts = [f"`{type_text(model, name)}`", default]
        if bounds_text(field):
            facts.append(f"`{bounds_text(field)}`")
        out += [f"### `{prefix}{name}`", "", ", ".join(facts), "", field.description or "", ""]
    return out


def options_markdown() -> str:
    """docs/options.md: every option of ``SinkOptions`` (and of its ``retry``, ``RetryPolicy``)
    with its type, default and whole description."""
    lines = [
        "# Sink options",
        "",
        f"Generated from `SinkOptions` (mvsink/config.py) by `{COMMAND}`: edit the docstrings there.",
        "",
        "`MVSink(target, name, **options)` takes them as keyword arguments (`help(MVSink)` lists them "
        "too); a TOML file holds them under `[sink]` (and `[sink.retry]`). A wrong name or value is a "
        "`ConfigError` naming the option.",
        "",
        "## Options",
        "",
        *_markdown_fields(SinkOptions),
        f"## `retry`: {RetryPolicy.__name__}",
        "",
        " ".join((RetryPolicy.__doc__ or "").split()),
        "",
        *_markdown_fields(RetryPolicy, "retry."),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"
