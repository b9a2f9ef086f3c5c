"""The running streaming query (``epoch/query.py``): which output modes each sink mode reads
right, and what a batch outside any query is."""

from __future__ import annotations

import pytest

from mvsink.epoch.query import (
    FITTING_OUTPUT_MODES,
    Query,
    check_output_mode,
    output_mode_refusal,
    running_query,
)
from mvsink.errors import ConfigError, Where

WHERE = Where("v", "/t", 0)


@pytest.mark.parametrize("mode", sorted(FITTING_OUTPUT_MODES))
@pytest.mark.parametrize("output_mode", ["append", "complete", "update", "Update"])
def test_a_sink_mode_takes_exactly_its_fitting_output_modes(mode, output_mode):
    refusal = output_mode_refusal(mode, output_mode)
    if output_mode.lower() in FITTING_OUTPUT_MODES[mode]:
        assert refusal is None
    else:
        assert refusal is not None and f"mode='{mode}'" in refusal
        assert f'outputMode("{output_mode.lower()}")' in refusal


def test_update_batches_into_complete_mode_are_pointed_to_upsert():
    assert "mode='upsert' with a key" in (output_mode_refusal("complete", "update") or "")
    assert "upsert" not in (output_mode_refusal("append", "complete") or "")


def test_without_a_query_or_its_output_mode_nothing_is_checked():
    unused = object()  # desired is not even looked at
    check_output_mode(unused, "complete", None, WHERE)  # type: ignore[arg-type]
    check_output_mode(unused, "complete", Query("q", "r", None), WHERE)  # type: ignore[arg-type]


def test_a_desired_not_made_from_the_batch_is_not_checked(spark):
    # The whole view read again from elsewhere is whatever the code made it.
    check_output_mode(spark.range(3), "complete", Query("q", "r", "update"), WHERE)


def test_a_direct_call_has_no_query_and_another_sessions_frame_must_be_named(spark):
    assert running_query(spark.range(1), named=False, where=WHERE) is None
    other = spark.newSession().range(1)
    with pytest.raises(ConfigError, match="pass option 'checkpoint'"):
        running_query(other, named=False, where=WHERE)
    assert running_query(other, named=True, where=WHERE) is None
