"""Jobs run from the command line or a config file: a streaming query feeding an ``MVSink``.

A job file is TOML with ``[job]`` (what query, how long, where the checkpoint lives),
``[sink]`` (``SinkOptions``) and ``[spark]`` (session settings). With no file, the embedded
default runs: the demo revenue view of ``mvsink.demo``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mvsink.config import SinkOptions, _config_error, load_toml
from mvsink.epoch.query import output_mode_refusal
from mvsink.errors import ConfigError


class JobOptions(BaseModel):
    """The ``[job]`` table of a job file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    query: str = "mvsink.demo:revenue_query"
    """``module:function`` taking a SparkSession (and ``args``) and returning the streaming
    DataFrame. A job that names none runs the demo's, with its ``feed`` and ``args``."""
    args: dict[str, str | int | float | bool] = {}
    """Keyword arguments of the query function and of ``feed`` (the demo's: its ``orders``
    folder)."""
    feed: str | None = None
    """``module:function`` taking a SparkSession (and ``args``) that writes the query's next
    input: called before the query starts and after every epoch but the last, so each epoch
    has new input and the source holds all of it (the demo's ``mvsink.demo:feed_orders``)."""
    output_mode: Literal["complete", "update", "append"] = "complete"
    """Spark output mode of the query: ``complete`` for the complete sink mode, ``append`` for
    append mode, ``update`` (or the others) for upsert mode (``epoch.query``)."""
    checkpoint: str = "data/checkpoints/revenue"
    """Spark checkpoint folder of the query."""
    trigger_seconds: float = Field(1.0, gt=0)
    """Processing-time trigger interval."""
    epochs: int | None = Field(None, ge=1)
    """Stop after this many epochs (unset: run until stopped; the demo stops after 6)."""
    show: bool = True
    """Print the view and the sink's figures after each epoch."""
    tamper_after_epoch: int | None = None
    """Demo only: after this many epochs less one, corrupt the table (a rogue row in, a real
    row out) to show the next epoch repairing it."""

    @model_validator(mode="before")
    @classmethod
    def _demo_by_default(cls, data: Any) -> Any:
        """A job that names no query is the demo (its query, six epochs); one whose query is
        the demo's gets the demo's feed and orders folder unless it names its own."""
        if not isinstance(data, dict):
            return data
        if "query" not in data:
            data = {"epochs": 6, **data}
        if str(data.get("query", "mvsink.demo:")).startswith("mvsink.demo:") and "feed" not in data:
            data = {"feed": "mvsink.demo:feed_orders", "args": {"orders": "data/orders"}, **data}
        return data

    @field_validator("query", "feed")
    @classmethod
    def _entry_point(cls, v: str | None) -> str | None:
        if v is not None and v.count(":") != 1:
            raise ValueError(f"must look like 'package.module:function' (got {v!r})")
        return v

    def query_of(self, spark: Any) -> Any:
        """The job's streaming DataFrame."""
        return _load("query", self.query, self.args)(spark, **self.args)

    def feed_once(self, spark: Any) -> None:
        """Write the query's next input, if the job has a ``feed``."""
        if self.feed is not None:
            _load("feed", self.feed, self.args)(spark, **self.args)


def _load(option: str, entry: str, args: dict[str, Any]) -> Callable[..., Any]:
    """The function ``entry`` names, checked to take a SparkSession and ``args``."""
    module, func = entry.split(":")
    try:
        fn: Callable[..., Any] = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"option 'job.{option}': cannot load {entry!r}: {exc}") from None
    try:
        inspect.signature(fn).bind(None, **args)
    except TypeError as exc:
        raise ConfigError(f"option 'job.args' does not fit {entry} (job.{option}): {exc}") from None
    except ValueError:
        pass  # no signature to check (a builtin): the call says
    return fn


def importable(job: JobOptions, path: str | Path | None) -> None:
    """Make the job's own modules importable and check its ``query`` and ``feed`` before Spark
    starts: a module found nowhere is a ``ConfigError`` naming where it was looked for.

    A job's modules are looked for on ``sys.path``, then in the working folder and beside the
    job file; those folders go on ``PYTHONPATH`` too, after what it holds, for the Python
    processes Spark starts (its workers unpickle the query's functions by module). Found, a
    module is imported and its function's arguments checked, unless importing it needs a
    running Spark (a UDF made at import): then that check waits for the query."""
    folders = [os.getcwd()] + ([os.path.dirname(os.path.abspath(path))] if path is not None else [])
    sys.path.extend(f for f in folders if f not in sys.path)
    known = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(known + [f for f in folders if f not in known])
    for option, entry in (("query", job.query), ("feed", job.feed)):
        if entry is None:
            continue
        module = entry.split(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its package is missing
            found = False
        if not found:
            raise ConfigError(
                f"option 'job.{option}': no module {module!r} on the Python path, in the working "
                "folder or beside the job file (put its folder on PYTHONPATH)"
            )
        try:
            _load(option, entry, job.args)
        except ConfigError:
            raise
        except Exception:  # it needs a running Spark to import: _load checks it once there is one
            sys.modules.pop(module, None)


class JobConfig(BaseModel):
    """A whole job file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: JobOptions = Field(default_factory=JobOptions)
    sink: SinkOptions
    spark: dict[str, str] = {}

    @model_validator(mode="after")
    def _modes_fit(self) -> JobConfig:
        refusal = output_mode_refusal(self.sink.mode, self.job.output_mode)
        if refusal is not None:
            raise ValueError(f"job.output_mode and sink.mode do not fit: {refusal}")
        return self

    @classmethod
    def load(cls, path: str | Path | None = None) -> JobConfig:
        data = DEFAULT if path is None else load_toml(path)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            file = "the embedded default job" if path is None else f"job file {str(path)!r}"
            raise _config_error(
                exc, data.get("sink", {}) if isinstance(data.get("sink"), dict) else {}, f"invalid {file}"
            ) from None


DEFAULT: dict[str, Any] = {
    "job": {"tamper_after_epoch": 2},
    "sink": {
        "target": "./data/views/revenue",
        "name": "revenue",
        "history_target": "./data/views/revenue_history",
    },
    "spark": {"spark.master": "local[2]"},
}
