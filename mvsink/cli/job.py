"""Jobs run from the command line or a config file: a streaming query feeding an ``MVSink``.

A job file is TOML with ``[job]`` (what query, how long, where the checkpoint lives),
``[sink]`` (``SinkOptions``) and ``[spark]`` (session settings). With no file, the embedded
default runs: the demo revenue view of ``mvsink.demo``.
"""

from __future__ import annotations

import importlib
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
    """``module:function`` taking a SparkSession and returning the streaming DataFrame."""
    output_mode: Literal["complete", "update", "append"] = "complete"
    """Spark output mode of the query: ``complete`` for the complete sink mode, ``append`` for
    append mode, ``update`` (or the others) for upsert mode (``epoch.query``)."""
    checkpoint: str = "data/checkpoints/revenue"
    """Spark checkpoint folder of the query."""
    trigger_seconds: float = Field(1.0, gt=0)
    """Processing-time trigger interval."""
    epochs: int | None = Field(6, ge=1)
    """Stop after this many epochs (None: run until stopped)."""
    show: bool = True
    """Print the view and the sink's figures after each epoch."""
    tamper_after_epoch: int | None = None
    """Demo only: after this many epochs less one, corrupt the table (a rogue row in, a real
    row out) to show the next epoch repairing it."""

    @field_validator("query")
    @classmethod
    def _entry_point(cls, v: str) -> str:
        if v.count(":") != 1:
            raise ValueError(f"must look like 'package.module:function' (got {v!r})")
        return v

    def load_query(self) -> Callable[..., Any]:
        module, func = self.query.split(":")
        try:
            return getattr(importlib.import_module(module), func)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"option 'job.query': cannot load {self.query!r}: {exc}") from None


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
            raise _config_error(
                exc, data.get("sink", {}) if isinstance(data.get("sink"), dict) else {}
            ) from None


DEFAULT: dict[str, Any] = {
    "job": {"tamper_after_epoch": 2},
    "sink": {"target": "./data/views/revenue", "name": "revenue"},
    "spark": {"spark.master": "local[2]"},
}
