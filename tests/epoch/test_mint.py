"""Mint (``epoch/mint.py``): a description advances the frontier, unless a takeover or a
shared clock's time decides (I1)."""

from __future__ import annotations

import pytest

from mvsink.epoch.mint import BatchDescription, mint
from mvsink.errors import InvariantViolation, Where

WHERE = Where("v", "/t", 4)


def test_a_description_runs_from_the_frontier_to_the_epoch_after():
    assert mint(4, 2, where=WHERE) == BatchDescription(2, 5)
    assert mint(0, None, where=WHERE) == BatchDescription(None, 1)  # a view never committed to


def test_a_plain_description_must_advance_the_frontier():
    with pytest.raises(InvariantViolation, match="must advance the frontier") as info:
        mint(4, 5, where=WHERE)
    assert info.value.where == WHERE  # says where it was minted
    with pytest.raises(InvariantViolation):
        BatchDescription(5, 5)


def test_a_takeover_or_a_clocked_description_may_set_the_frontier_lower():
    taken = mint(0, 9, takeover=True, where=WHERE)
    assert (taken.lower, taken.upper, taken.takeover, taken.clocked) == (9, 1, True, False)
    clocked = mint(2, 9, clocked=True, where=WHERE)
    assert (clocked.lower, clocked.upper, clocked.takeover, clocked.clocked) == (9, 3, False, True)
