"""Helpers for the tests of the layouts' bound decode-step pricers (expert and pipeline
parallel): the plain decode pool's step shape, and a simulation run with the bound pricer and
the event loop's inner loop, then without both."""

from __future__ import annotations

from planner.core.ops import StepShape


def pool_shape(n: int, attended: int, window) -> StepShape:
    """The plain decode pool's step (``DecodePool.shape``): n sequences adding a token each,
    ``attended`` cached-plus-new tokens in all; the windowed layers see min(attended,
    n x window) of them."""
    past = attended - n
    local = None
    if window is not None:
        w = min(attended, n * window)
        local = StepShape(float(n), float(w), float(w), float(min(past, n * window)), float(w),
                          float(n))
    return StepShape(float(n), float(attended), float(attended), float(past),
                     float(attended), float(n), local)


def assert_the_bound_pricer_changes_nothing(cls, make_coster, reqs, cfg, monkeypatch) -> None:
    """Simulate ``reqs`` on ``make_coster()`` (a ``cls``) with the bound pricer, which must
    take decode steps, then with it and the inner loop (``sim.QUICK_DECODE_RUNS``) taken
    away: every request's first token and finish, and the summary, the same to the bit."""
    from planner.serving import sim
    from planner.serving.metrics import summary

    calls = []
    bound = cls.uniform_decode_pricer

    def counted(self):
        price = bound(self)
        return lambda *a: calls.append(a) or price(*a)

    monkeypatch.setattr(cls, "uniform_decode_pricer", counted)
    fast = sim.simulate(reqs, make_coster(), cfg)
    assert calls  # the bound pricer took the decode steps
    monkeypatch.setattr(cls, "prices_uniform_decodes", False)
    monkeypatch.setattr(sim, "QUICK_DECODE_RUNS", False)
    calls.clear()
    slow = sim.simulate(reqs, make_coster(), cfg)
    assert not calls  # every step through the shapes
    assert [(r.first_token_s, r.finish_s) for r in fast.requests] == \
        [(r.first_token_s, r.finish_s) for r in slow.requests]
    assert summary(fast) == summary(slow)


def assert_the_bound_pricer_is_step_time(make, model: str, gpu: str, weights: str,
                                         engine: str, n: int, per: int) -> None:
    """``make(model, hardware, prepared, options)``'s bound pricer gives, for n sequences of
    ``per`` cached-plus-new tokens each, ``step_time``'s answer for the shape the pool builds,
    exactly: on a coster that meets the kept sums first and on one that ``step_time`` filled.
    ``model`` "deepseek-v3.2" is the fixture's config.json."""
    from pathlib import Path

    from planner.core.estimate import prepare
    from planner.core.specs import Options, Precision
    from planner.io import catalog

    path = Path(__file__).parent / "fixtures" / "hf" / "deepseek-v3.2.json"
    m = catalog.load_model(str(path) if model == "deepseek-v3.2" else model)
    hw, eng = catalog.load_hardware(gpu), catalog.load_engine(engine)
    opts = Options()
    prep = prepare(hw, Precision.of(weights), None, opts, eng)
    attended = n * per
    shape = pool_shape(n, attended, m.attention_window)
    first = make(m, hw, prep, opts)  # the pricer first
    assert first.prices_uniform_decodes
    got = first.uniform_decode_pricer()(n, attended, n)
    fresh = make(m, hw, prep, opts)  # step_time first
    want = fresh.step_time(shape, sequences=n, prefill=False)
    assert got == want
    assert fresh.uniform_decode_pricer()(n, attended, n) == want
    assert first.step_time(shape, sequences=n, prefill=False) == want
