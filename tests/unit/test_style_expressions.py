"""The browser tests' evaluator of the web map's style expressions
(tests/support/style_expressions.py) follows MapLibre's semantics where the map relies on
them: step takes the last stop at or below the input, to-number falls back, a missing feature
state is null, case and match take their default."""

from tests.support.style_expressions import drawn, evaluate

STEP = ["step", ["to-number", ["feature-state", "p25"], 0], "c0", 0.2, "c1", 0.4, "c2"]


def test_step_takes_the_last_stop_at_or_below_the_input():
    assert [evaluate(STEP, {}, {"p25": v}) for v in (0.0, 0.2, 0.39, 0.4, 0.9)] == [
        "c0", "c1", "c1", "c2", "c2"]
    assert evaluate(STEP, {}, {}) == "c0"  # no state: to-number's fallback, 0


def test_a_missing_state_is_null_and_has_is_about_properties():
    assert evaluate(["!=", ["feature-state", "p25"], None], {}, {}) is False
    assert evaluate(["!=", ["feature-state", "p25"], None], {}, {"p25": 0}) is True
    assert evaluate(["has", "p25"], {"p25": None}, {}) is True
    assert evaluate(["has", "p25"], {}, {"p25": 1}) is False


def test_case_match_and_comparisons():
    expr = ["case", ["all", True, [">", ["abs", ["to-number", ["get", "z"], 0]], 2.58]], 1, 0]
    assert [evaluate(expr, {"z": z}, {}) for z in (-3, 2.58, 2.6, None)] == [1, 0, 1, 0]
    match = ["match", ["feature-state", "status"], "suppressed", "grey", "failed", "dark", "x"]
    assert [evaluate(match, {}, {"status": s}) for s in ("suppressed", "failed", "released")] \
        == ["grey", "dark", "x"]


def test_drawn_keeps_what_the_filter_passes_and_the_opacity_shows():
    features = [[{"geoid": "a", "cell": "1"}, {"status": "released"}],
                [{"geoid": "b", "cell": "2"}, {"status": "released"}],
                [{"geoid": "c", "cell": "1"}, {}]]
    opacity = ["case", ["!=", ["feature-state", "status"], None], 1, 0]
    assert [f["geoid"] for f in drawn(features, None, opacity)] == ["a", "b"]
    assert [f["geoid"] for f in drawn(features, ["==", ["get", "cell"], "1"], None)] == ["a", "c"]
