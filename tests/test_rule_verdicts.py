"""The decisions an append and a sync's merge share (rules/pairing.py): one table each.

Both ``engine.append`` and ``rules.merge.merge`` call these two functions, so a
change to a rule changes both; the spec examples (test_spec_examples.py) and the
sync table (test_sync.py::test_rules_across_a_sync) show them in place.
"""

from __future__ import annotations

import pytest

from flowdrop_local.rules.pairing import judge_result, repeats_known_calls


@pytest.mark.parametrize(
    ("declared", "known", "repeat"),
    [
        pytest.param(["c1"], {"c1"}, True, id="MEM-2: every call declared already: a repeat"),
        pytest.param(["c1", "c2"], {"c1", "c2", "c3"}, True, id="MEM-2: a subset of known"),
        pytest.param(["c1", "c2"], {"c1"}, False, id="MEM-2: one new call id keeps the turn"),
        pytest.param([], {"c1"}, False, id="a turn without calls is never a repeat"),
        pytest.param(["c1"], set(), False, id="nothing known yet"),
    ],
)
def test_repeats_known_calls(declared: list[str], known: set[str], repeat: bool) -> None:
    assert repeats_known_calls(declared, known) is repeat


@pytest.mark.parametrize(
    ("standing", "incoming_healed", "verdict"),
    [
        pytest.param(None, False, "new", id="the call's first result"),
        pytest.param(None, True, "new", id="a first placeholder"),
        pytest.param(True, False, "replaces", id="MEM-10: a real result over a placeholder"),
        pytest.param(True, True, "duplicate", id="MEM-10: a placeholder never replaces"),
        pytest.param(False, False, "duplicate", id="MEM-1: a second real result"),
        pytest.param(False, True, "duplicate", id="MEM-1: a placeholder after a real result"),
    ],
)
def test_judge_result(standing: bool | None, incoming_healed: bool, verdict: str) -> None:
    assert judge_result(standing, incoming_healed) == verdict
