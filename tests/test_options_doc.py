"""Every option of ``SinkOptions`` shows in ``help(MVSink)``, ``inspect.signature(MVSink)`` and
docs/options.md, all made from the model's fields (their attribute docstrings are the descriptions)."""

from __future__ import annotations

import ast
import inspect
import itertools
import pydoc
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import mvsink.config
from mvsink import ConfigError, MVSink, RetryPolicy, SinkOptions
from mvsink.options_doc import COMMAND, first_sentence, options_markdown

ROOT = Path(__file__).resolve().parent.parent
TARGET = "/lake/views/v"


def default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].get_default(call_default_factory=True, validated_data={})


def attribute_docstrings(cls: str) -> dict[str, str]:
    """The string under each annotated field of class ``cls`` in config.py, read with ``ast``."""
    tree = ast.parse(Path(mvsink.config.__file__).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    docs = {}
    for field, after in itertools.pairwise(body):
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
            assert isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant), field.target.id
            docs[field.target.id] = inspect.cleandoc(after.value.value)
    return docs


@pytest.mark.parametrize("model", [SinkOptions, RetryPolicy])
def test_each_description_is_the_docstring_under_its_field(model: type[BaseModel]) -> None:
    docs = attribute_docstrings(model.__name__)
    assert set(docs) == set(model.model_fields)
    for name, field in model.model_fields.items():
        assert field.description == docs[name], name


def test_docs_options_md_is_what_the_generator_writes_now() -> None:
    written = (ROOT / "docs" / "options.md").read_text()
    assert written == options_markdown(), f"docs/options.md is stale: run `{COMMAND}`"
    assert COMMAND in written.splitlines()[2]
    for model, prefix in ((SinkOptions, ""), (RetryPolicy, "retry.")):
        for name, field in model.model_fields.items():
            assert f"### `{prefix}{name}`" in written
            assert field.description and field.description in written


def test_the_signature_has_every_option_with_its_type_and_default() -> None:
    params = list(inspect.signature(MVSink).parameters.values())
    assert [p.name for p in params[:2]] == ["target", "name"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params[:2])
    assert {p.name for p in params} == set(SinkOptions.model_fields)
    for p in params[2:]:
        field = SinkOptions.model_fields[p.name]
        assert p.kind is p.KEYWORD_ONLY, p.name
        assert p.annotation == field.annotation, p.name
        assert p.default == default(SinkOptions, p.name), p.name
    assert inspect.signature(MVSink.__init__).return_annotation is None


def test_the_signature_defaults_are_the_options_defaults() -> None:
    given = {p.name: p.default for p in list(inspect.signature(MVSink).parameters.values())[2:]}
    assert MVSink(TARGET, "v", **given).options == MVSink(TARGET, "v").options


def test_the_docstring_lists_every_option_with_its_first_sentence() -> None:
    doc = inspect.getdoc(MVSink)
    assert doc is not None and doc.startswith("Keep the Delta table at ``target`` equal")
    flat = " ".join(doc.split())
    for name, field in SinkOptions.model_fields.items():
        assert any(line.startswith(f"{name}: ") for line in doc.splitlines()), name
        assert first_sentence(field.description or "") in flat, name
    assert "retry: RetryPolicy = RetryPolicy()" in doc
    assert "clock: Literal['batch_id', 'source_offsets'] | Callable[[Any, int], Any] = 'batch_id'" in doc


def test_help_renders() -> None:
    text = pydoc.render_doc(MVSink, renderer=pydoc.plaintext)
    assert (
        "MVSink(target: str, name: str, *, mode: Literal['complete', 'upsert', 'append'] = 'complete'" in text
    )
    assert "retry: mvsink.config.RetryPolicy = RetryPolicy(max_attempts=8" in text
    assert "Callable[[Any, int], Any]" in text
    assert "schema_changes: Literal['refuse', 'evolve'] = 'refuse'" in text
    html = pydoc.HTMLDoc().docclass(MVSink)  # pydoc -w / the browser
    assert all(name in html for name in SinkOptions.model_fields)


def test_the_constructor_still_takes_options_as_keywords() -> None:
    sink = MVSink(TARGET, "v", mode="upsert", key=["k"], retry={"max_attempts": 3})
    assert sink.options == SinkOptions.build(
        target=TARGET, name="v", mode="upsert", key=("k",), retry=RetryPolicy(max_attempts=3)
    )
    assert MVSink.from_options(sink.options).options == sink.options
    with pytest.raises(TypeError):
        MVSink(TARGET, "v", "upsert")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        inspect.signature(MVSink).bind(TARGET, "v", "upsert")


def test_a_wrong_option_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="option 'nosuch': Extra inputs are not permitted") as err:
        MVSink("p", "v", nosuch=1)
    assert "view 'v'" in str(err.value)


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("One. Two.", "One."),
        ("Keys, e.g. ``A``, and more. Next.", "Keys, e.g. ``A``, and more."),
        ("A (see ``x.py``. Yes.) b. C.", "A (see ``x.py``. Yes.) b."),
        ("Region ... (the keys). Next.", "Region ... (the keys)."),
        ("A\n``x. Y``\nthen. Z", "A ``x. Y`` then."),
        ("No end", "No end"),
    ],
)
def test_first_sentence(text: str, first: str) -> None:
    assert first_sentence(text) == first
