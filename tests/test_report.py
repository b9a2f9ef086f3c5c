"""What an epoch reports (``EpochReport``): its JSON record and its one-line summary."""

from __future__ import annotations

from mvsink.report import HELD, EpochReport


def report(**fields: object) -> EpochReport:
    base: dict[str, object] = {
        "view": "v",
        "target": "/t",
        "epoch": 3,
        "outcome": "committed",
        "lower": 2,
        "upper": 3,
        "version": 7,
    }
    return EpochReport(**{**base, **fields})  # type: ignore[arg-type]


def test_the_json_record_holds_every_field_and_its_format() -> None:
    got = report(inserted=4, whole=True, phases={"write": 1.5}).to_json()
    assert got["format"] == 1 and got["inserted"] == 4 and got["whole"] is True
    assert got["phases"] == {"write": 1.5} and got["files_read"] == 0


def test_a_committed_epoch_says_what_it_wrote_and_where_its_time_went() -> None:
    text = str(
        report(inserted=4, retracted=1, bytes_written=2048, whole=True, phases={"write": 2.0, "x": 0.01})
    )
    assert text.startswith("view v epoch 3: committed as version 7 [2 -> 3]: +4 -1 rows")
    assert "2,048 bytes (desired written whole)" in text and text.endswith("(write 2.0s)")
    assert "whole" not in str(report(bytes_written=1))


def test_an_epoch_that_wrote_nothing_says_so() -> None:
    assert (
        str(report(outcome="replay", lower=5))
        == "view v epoch 3: replay (frontier already 5; nothing written)"
    )
    assert str(report(outcome="fenced")).endswith("fenced (nothing written)")
    assert "committed" in HELD and "fenced" not in HELD
