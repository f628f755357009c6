"""NoisyStats' budget split is decided in one place (issue 19, item 3)."""

import pytest

import mechanisms as M
from mechanisms.privacy_maps import GridLaplace
from mechanisms.sufficient_stats import noisy_stats_split


@pytest.mark.parametrize("eps", [0.3, 1.0, 8.0])
def test_thirds_and_the_halves_after_a_drawn_nvar(eps):
    assert noisy_stats_split(eps) == (eps / 3.0,) * 3
    assert noisy_stats_split(eps, nvar_drawn=True) == (0.0, eps / 2, eps / 2)


def test_the_mechanism_and_the_rule_read_the_split():
    from dpatlas.release.selection import Rule

    steps = M.get("NoisyStats").noise_steps(1.5)
    assert [s.noise for s in steps] == [GridLaplace.calibrate(e) for e in noisy_stats_split(1.5)]
    _, (_, rest, alts) = Rule("dp", threshold=3.0).noise(2.0)
    assert [s.noise for s in alts["NoisyStats"]] == [
        GridLaplace.calibrate(e) for e in noisy_stats_split(rest, nvar_drawn=True)[1:]]
