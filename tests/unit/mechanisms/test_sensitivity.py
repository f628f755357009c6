"""A noise step carries its sensitivity as a number with its derivation, and every draw is
scaled to that number (issue 19, item 3): mechanisms/sensitivity.py."""

import inspect
import sys

import numpy as np
import pytest

import mechanisms as M
from mechanisms import intervals as CI
from mechanisms import median, noise
from mechanisms.batch import TractBatch
from mechanisms.privacy import Relation
from mechanisms.registry import REGISTRY
from mechanisms.sensitivity import NORMS, Sensitivity, constant
from mechanisms.sufficient_stats import noisy_stats_release

from tests.support.inputs import line_tract

N = 30  # one tract of N records: every public n a sensitivity reads is N

# Each sampler, the argument that takes the sensitivity, and the norms it may be scaled to.
SAMPLERS = {noise.laplace_mechanism: ("l1_sensitivity", ("L1",)),
            noise.gaussian_mechanism: ("l2_sensitivity", ("L2",)),
            median.exp_median: ("k", ("utility",)),
            median.smooth_sensitivity: ("k", ("values moved",))}


def _mechanisms_modules():
    return [m for name, m in list(sys.modules.items())
            if m is not None and (name == "mechanisms" or name.startswith("mechanisms."))]


class SensitivitySpy:
    """Records, in order, every ``Sensitivity.value`` call and every sampler's sensitivity
    argument, wherever the sampler is called from (replaced in each module holding it)."""

    def __init__(self, monkeypatch):
        self.events = []
        real_value = Sensitivity.value

        def value(sensitivity, **public):
            out = real_value(sensitivity, **public)
            self.events.append(("value", sensitivity, out))
            return out

        monkeypatch.setattr(Sensitivity, "value", value)
        for original, (argument, norms) in SAMPLERS.items():
            wrapped = self._wrapper(original, argument, norms)
            holders = [(module, attr) for module in _mechanisms_modules()
                       for attr, held in vars(module).items() if held is original]
            assert holders, original
            for module, attr in holders:
                monkeypatch.setattr(module, attr, wrapped)

    def _wrapper(self, original, argument, norms):
        signature = inspect.signature(original)

        def wrapped(*args, **kwargs):
            drawn = signature.bind(*args, **kwargs).arguments[argument]
            self.events.append(("draw", norms, drawn))
            return original(*args, **kwargs)

        return wrapped

    def draws(self):
        """Each draw as (its norms, the sensitivity it was scaled to, the Sensitivity whose
        value() was read last since the previous draw, that value), in order: a draw that
        read no Sensitivity of its own gets (None, None)."""
        out, last = [], None
        for event in self.events:
            if event[0] == "value":
                last = event[1:]
            else:
                out.append((event[1], event[2]) + (last or (None, None)))
                last = None
        return out


def _same_numbers(drawn, value) -> bool:
    drawn, value = np.asarray(drawn, dtype=float), np.asarray(value, dtype=float)
    return np.broadcast(drawn, value).shape == drawn.shape and bool(np.all(drawn == value))


def _budget(name):
    return 2.0, (1e-6 if M.get(name).needs_delta else None)


def _with_steps():
    return [name for name in REGISTRY if M.get(name).private]


@pytest.mark.parametrize("name", _with_steps())
def test_every_noise_step_carries_a_sensitivity_with_its_derivation(name):
    steps = M.get(name).noise_steps(*_budget(name))
    assert steps
    for step in steps:
        s = step.sensitivity
        assert isinstance(s, Sensitivity) and s.function is not None, step.name
        assert s.norm in NORMS and s.formula and s.derivation.strip()
        assert step.relation is s.relation  # the guarantee is stated for the derivation's
        assert s.value(**{k: np.array([N]) for k in s.inputs if k == "n"},
                       **{k: 0.0 for k in s.inputs if k != "n"}) is not None
        d = step.as_dict()
        assert d["sensitivity"] == s.statement and d["sensitivity_derivation"] == s.derivation


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_draw_is_scaled_to_its_steps_sensitivity(name, monkeypatch):
    eps, delta = _budget(name)
    est = M.get(name)
    steps = est.noise_steps(eps, delta) if est.private else []
    spy = SensitivitySpy(monkeypatch)
    x, y = line_tract(N, seed=2)
    M.estimate_batch(name, TractBatch.single(x, y), eps, delta, seed=1)
    draws = spy.draws()
    if not draws:  # the non-private baselines draw nothing
        assert not est.private and est.sampler == "none", name
        return
    used = _checked_draws(name, draws, N)
    if est.private:  # every draw is one of its steps', and every step is drawn
        _assert_exactly_the_steps(name, used, steps)


def _checked_draws(name, draws, n):
    """The Sensitivity of each draw, after checking the draw was scaled to its number."""
    used = []
    for norms, drawn, sensitivity, value in draws:
        # the number drawn with is the one the Sensitivity just gave, of the sampler's norm
        assert sensitivity is not None and sensitivity.derivation.strip(), name
        assert sensitivity.norm in norms, (name, sensitivity.formula, norms)
        assert _same_numbers(drawn, value), (name, sensitivity.formula, drawn, value)
        # and, where it reads only the public n (or nothing), recomputed here from n
        if set(sensitivity.inputs) <= {"n"}:
            public = {"n": np.array([n])} if sensitivity.inputs else {}
            assert _same_numbers(drawn, sensitivity.value(**public)), (name, drawn)
        used.append(sensitivity)
    return used


def _assert_exactly_the_steps(name, used, steps):
    assert all(s in [step.sensitivity for step in steps] for s in used), name
    assert all(step.sensitivity in used for step in steps), name


@pytest.mark.parametrize("mechanism", [CI.NOISY_STATS, CI.EXP_THEIL_SEN])
def test_each_interval_draw_is_scaled_to_its_steps_sensitivity(mechanism, monkeypatch):
    n, eps = 200, 8.0  # large enough that the Theil-Sen ends are drawn (2r < n(n - 1)/2)
    x, y = line_tract(n, seed=3)
    batch, rand = TractBatch.single(x, y), noise.SeededRandomness(5)
    if mechanism == CI.NOISY_STATS:
        third = eps / 3
        out = noisy_stats_release(batch, third, third, third, rand, 1)
        released = CI.Released(out.p25, out.p75, out.extras["noisy_nvar"], third, third, third)
    else:
        out = M.estimate_batch("DPExpTheilSen", batch, eps, rand=rand, reps=1)
        released = CI.Released(out.p25, out.p75, eps_theil_sen=eps)
    spy = SensitivitySpy(monkeypatch)
    CI.intervals(mechanism, batch, released, eps, rand)
    used = _checked_draws(mechanism, spy.draws(), n)
    _assert_exactly_the_steps(mechanism, used, CI.interval_noise_steps(mechanism, eps))


def test_a_changed_sensitivity_changes_the_draw(monkeypatch):
    # The draw reads the step's number: a step built with twice the sensitivity draws on a
    # grid twice as coarse (its noise, in data units, doubles), same seed, same integers.
    from mechanisms import sufficient_stats as S

    x, y = line_tract(N, seed=2)
    before = M.estimate_batch("NoisyIntercept", TractBatch.single(x, y), 1.0, seed=4).p25
    doubled = Sensitivity("L1", "2/n", "2/n (L1, replace-one, child ranks on [0, 1])",
                          "a test's deliberately doubled sensitivity", lambda n: 2.0 / n,
                          ("n",))
    monkeypatch.setattr(S, "YBAR_SENSITIVITY", doubled)
    after = M.estimate_batch("NoisyIntercept", TractBatch.single(x, y), 1.0, seed=4).p25
    ybar = y.mean()
    # (each rounds ȳ to its own grid: at most a unit apart, u = (1/N)/4096 before)
    assert after - ybar == pytest.approx(2 * (before - ybar), abs=4.0 / N / 4096)
    assert after != pytest.approx(before)


def test_a_sensitivity_takes_exactly_its_named_public_inputs():
    s = M.get("NoisyStats").noise_steps(1.0)[2].sensitivity  # the intercept's
    assert s.inputs == ("n", "noisy_slope")
    assert s.value(n=np.array([10, 20]), noisy_slope=np.array([-1.0, 0.5])) == pytest.approx(
        [0.2, 0.075])
    with pytest.raises(ValueError, match="public inputs"):
        s.value(n=np.array([10]))
    one = constant(1.0, "L2", "1", "1 (L2)", "a count moves by 1", Relation.ADD_REMOVE)
    assert one.value() == 1.0 and one.relation is Relation.ADD_REMOVE
    with pytest.raises(ValueError, match="norm"):
        Sensitivity("Linf", "1", "1", "why")
    with pytest.raises(ValueError, match="no derivation"):
        Sensitivity("L1", "1", "1", " ", lambda: 1.0)
