"""The sink's options (``mvsink.config``): each field checked and named when wrong, the options
checked against each other, loaded from keyword arguments and from TOML alike; cadences and
retry backoff. No Spark, no table."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mvsink import ConfigError, MVSink, MVSinkError, RetryPolicy, SinkOptions
from mvsink.config import Cadence, load_toml


@pytest.fixture
def path(tmp_path) -> str:
    """A table location on local disk (nothing is read or written there)."""
    return str(tmp_path / "view")


@pytest.mark.parametrize(
    "options, option",
    [
        ({"name": "has space"}, "name"),
        ({"name": ""}, "name"),
        ({"target": "hdfs://namenode/x"}, "target"),
        ({"as_of": -1}, "as_of"),
        ({"max_rows_per_file": 0}, "max_rows_per_file"),
        ({"retry": {"max_attempts": 0}}, "retry.max_attempts"),
        ({"mode": "merge"}, "mode"),
        ({"placement": "cluster"}, "placement"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_invalid_options_name_the_option(path, options, option):
    kwargs = {"target": path, "name": "v", **options}
    with pytest.raises(ConfigError) as info:
        MVSink(**kwargs)
    assert f"option {option!r}" in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, MVSinkError)


def test_options_load_from_toml(tmp_path, path):
    conf = tmp_path / "view.toml"
    conf.write_text(f'[sink]\ntarget = "{path}"\nname = "v"\nas_of = 3\n[sink.retry]\nmax_attempts = 4\n')
    opts = SinkOptions.from_toml(conf)
    assert (opts.as_of, opts.retry.max_attempts) == (3, 4)
    sink = MVSink.from_options(opts)
    assert sink.options == opts
    conf.write_text('[sink]\ntarget = "x"\nname = "v"\nretry = { max_attempts = "many" }\n')
    with pytest.raises(ConfigError, match=r"retry\.max_attempts"):
        SinkOptions.from_toml(conf)
    with pytest.raises(ConfigError, match="does not exist"):
        SinkOptions.from_toml(tmp_path / "missing.toml")


def test_options_are_frozen(path):
    opts = SinkOptions.build(target=path, name="v")
    with pytest.raises(ValidationError):
        opts.as_of = 4  # type: ignore[misc]


def test_toml_overrides_win_and_a_file_without_a_sink_table_or_valid_toml_is_refused(tmp_path, path):
    conf = tmp_path / "view.toml"
    conf.write_text(f'[sink]\ntarget = "{path}"\nname = "v"\nmode = "upsert"\nkey = ["id"]\n')
    opts = SinkOptions.from_toml(conf, name="w", max_rows_per_file=7)
    assert (opts.name, opts.mode, opts.key, opts.max_rows_per_file) == ("w", "upsert", ("id",), 7)
    assert opts == SinkOptions.build(target=path, name="w", mode="upsert", key=["id"], max_rows_per_file=7)
    conf.write_text('[job]\nquery = "a:b"\n')
    with pytest.raises(ConfigError, match=r"no \[sink\] table"):
        SinkOptions.from_toml(conf)
    conf.write_text("[sink\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_toml(conf)
    conf.write_text('a = 1\n[b]\nc = "d"\n')
    assert load_toml(conf) == {"a": 1, "b": {"c": "d"}}


def test_strings_are_stripped_and_names_may_hold_dots_and_dashes(path):
    opts = SinkOptions.build(target=f"  {path} ", name=" a.b-c_1 ")
    assert (opts.target, opts.name) == (path, "a.b-c_1")
    for bad in (".hidden", "-dash", "x" * 129, "a/b"):
        with pytest.raises(ConfigError, match="option 'name'"):
            SinkOptions.build(target=path, name=bad)


@pytest.mark.parametrize(
    "target",
    [
        "/tmp/v",
        "./v",
        "file:///tmp/v",
        "s3://b/v",
        "gs://b/v",
        "az://c/v",
        "abfss://c@a.dfs.core.windows.net/v",
    ],
)
def test_paths_and_object_store_uris_are_targets(target):
    assert SinkOptions.build(target=target, name="v").target == target


def test_a_local_target_with_a_percent_sign_or_an_unknown_scheme_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"option 'target'.*percent-escape"):
        SinkOptions.build(target=str(tmp_path / "a%41b"), name="v")
    with pytest.raises(ConfigError, match=r"option 'target'.*unknown scheme 'ftp'"):
        SinkOptions.build(target="ftp://host/v", name="v")
    with pytest.raises(ConfigError, match="option 'target'"):
        SinkOptions.build(target="", name="v")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"mode": "upsert"}, "option 'key': upsert mode needs at least one key column"),
        ({"mode": "upsert", "key": ["id", "id"]}, "option 'key': names a column twice"),
        (
            {"mode": "upsert", "key": ["id"], "delete_column": "id"},
            "option 'delete_column': 'id' is a key column",
        ),
        (
            {"mode": "upsert", "key": ["id"], "delete_column": "d", "sequence_column": "d"},
            "option 'sequence_column': it is the delete column too",
        ),
        (
            {"mode": "upsert", "key": ["id"], "sequence_column": "s", "tombstone_retention": "7d"},
            "option 'tombstone_retention': tombstones are kept only with both",
        ),
        ({"key": ["id"]}, "option 'key': only upsert mode takes it (mode is 'complete')"),
        ({"mode": "append", "sequence_column": "s"}, "option 'sequence_column': only upsert mode takes it"),
        (
            {"mode": "append", "clock": "source_offsets", "checkpoint": "/c"},
            "append mode needs the batch_id clock",
        ),
        ({"clock": "source_offsets"}, "'source_offsets' needs the 'checkpoint' option"),
        (
            {"mode": "upsert", "key": ["id"], "on_error": "table"},
            "option 'on_error': 'table' takes complete or append",
        ),
        ({"errors_target": "/elsewhere/errors"}, "only on_error = 'table' writes an errors table"),
        ({"metrics_table": "db.metrics"}, "option 'metrics_table': 'db.metrics' must be a path or URI"),
        (
            {"mode": "append", "allow_late_start": True},
            "option 'allow_late_start': only complete mode takes it",
        ),
        ({"mode": "append", "refresh_every": 3}, "option 'refresh_every': only complete mode takes it"),
        ({"partition_by": ["a", "a"]}, "option 'partition_by': names a column twice"),
        ({"cluster_by": ["a", "b", "a"]}, "option 'cluster_by'"),
        ({"heartbeat": "soon"}, "option 'heartbeat'"),
        ({"refresh_every": -1}, "option 'refresh_every'"),
        ({"mode": "upsert", "key": ["k"], "tombstone_retention": "0s"}, "option 'tombstone_retention'"),
        ({"take_over": "not a name"}, "option 'take_over'"),
        ({"retry": {"jitter": 2}}, "option 'retry.jitter'"),
    ],
)
def test_options_that_do_not_fit_together_are_refused_naming_the_option(path, options, message):
    with pytest.raises(ConfigError) as info:
        SinkOptions.build(target=path, name="v", **options)
    assert message in str(info.value)


def test_a_metrics_or_errors_table_inside_the_target_is_refused(path):
    for option, extra in (("metrics_table", {}), ("errors_target", {"on_error": "table"})):
        for other in (path, f"{path}/inner", path.rsplit("/", 1)[0]):
            with pytest.raises(ConfigError, match=f"option '{option}'.*lies inside it"):
                SinkOptions.build(target=path, name="v", **{option: other}, **extra)
        assert getattr(SinkOptions.build(target=path, name="v", **{option: f"{path}-x"}, **extra), option)


def test_the_defaults_that_depend_on_the_mode(path):
    assert SinkOptions.build(target=path, name="v").new_lineage_policy == "adopt"
    assert SinkOptions.build(target=path, name="v", mode="append").new_lineage_policy == "fail"
    assert SinkOptions.build(
        target=path, name="v", mode="append", on_new_lineage="adopt"
    ).new_lineage_policy == ("adopt")
    opts = SinkOptions.build(target=path, name="v", heartbeat=5, refresh_every="2h")
    assert (opts.heartbeat_cadence, opts.refresh) == (Cadence(epochs=5), Cadence(seconds=7200.0))
    assert SinkOptions.build(target=path, name="v").refresh is None
    assert SinkOptions.build(target=path, name="a").app_id != SinkOptions.build(target=path, name="b").app_id


@pytest.mark.parametrize(
    "value, cadence",
    [
        (3, Cadence(epochs=3)),
        ("12", Cadence(epochs=12)),
        (0, Cadence(epochs=1)),  # 0: every epoch
        ("250ms", Cadence(seconds=0.25)),
        (" 30s ", Cadence(seconds=30.0)),
        ("1.5m", Cadence(seconds=90.0)),
        ("2h", Cadence(seconds=7200.0)),
        ("1d", Cadence(seconds=86400.0)),
        ("0s", Cadence(seconds=0.0)),
    ],
)
def test_a_cadence_is_a_number_of_epochs_or_a_duration(value, cadence):
    assert Cadence.parse(value) == cadence


@pytest.mark.parametrize("value", [True, -1, "-2", "10 minutes", "m", "", "1w"])
def test_anything_else_is_no_cadence(value):
    with pytest.raises(ValueError, match="epochs"):
        Cadence.parse(value)


def test_a_cadence_is_due_after_its_epochs_or_its_time_and_when_unknown():
    every = Cadence.parse(0)
    assert every.always and every.due(epochs_since=0, last_at_ms=0, now=0)
    three = Cadence.parse(3)
    assert [three.due(epochs_since=n, last_at_ms=None) for n in (0, 2, 3, 4)] == [False, False, True, True]
    assert three.due(epochs_since=None, last_at_ms=0)
    minute = Cadence.parse("1m")
    assert not minute.always
    assert not minute.due(epochs_since=99, last_at_ms=1_000, now=60_999)
    assert minute.due(epochs_since=0, last_at_ms=1_000, now=61_000)
    assert minute.due(epochs_since=0, last_at_ms=None, now=0)
    assert Cadence.parse("0s").due(epochs_since=0, last_at_ms=5, now=5)


def test_retry_backoff_grows_by_the_multiplier_up_to_the_bound_less_jitter():
    policy = RetryPolicy(initial_backoff_s=0.5, multiplier=3.0, max_backoff_s=10.0, jitter=0.5)
    assert [policy.backoff(n, 0.0) for n in (1, 2, 3, 4)] == [0.5, 1.5, 4.5, 10.0]
    assert policy.backoff(2, 1.0) == pytest.approx(0.75)
    assert policy.backoff(4, 0.5) == pytest.approx(7.5)
    assert RetryPolicy(jitter=0.0).backoff(1, 1.0) == RetryPolicy().initial_backoff_s
