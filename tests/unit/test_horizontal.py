"""KPA-style recommendation, stepped second by second (Knative autoscaler semantics)."""

from __future__ import annotations

from scaler.horizontal import KpaRecommender
from scaler.policy import ScalingPolicy


def kpa(adds_need_panic: bool = False, **kw: object) -> KpaRecommender:
    # cpu.max = cpu.request: one replica is one reference replica (pure horizontal scaling)
    base: dict[str, object] = {
        "target": 10,
        "target_utilization": 1.0,
        "max_replicas": 100,
        "cpu": {"min": 0.1, "max": 0.1},
    }
    base.update(kw)
    return KpaRecommender(ScalingPolicy.model_validate(base), adds_need_panic=adds_need_panic)


def drive(
    rec: KpaRecommender, loads: list[float], ready: float = 1.0, start: int = 0
) -> list[tuple[int, str]]:
    """Feed one value per second; the platform applies every recommendation at once."""
    out = []
    for i, load in enumerate(loads):
        now = float(start + i)
        rec.observe(now, load)
        r = rec.recommend(now, ready, int(ready))
        out.append((r.replicas, r.rule))
        ready = float(r.replicas)
    return out


def test_stable_mode_aims_at_target_times_utilization() -> None:
    rec = kpa(target_utilization=0.7, panic_threshold=10)
    rec.observe(0.0, 30.0)
    r = rec.recommend(0.0, ready=3.0, current=3)
    assert (r.replicas, r.rule) == (5, "stable"), "ceil(30 / (10 × 0.7)) = 5"
    assert r.inputs["target_value"] == 7.0
    assert "stable: ceil(30.00/7) = 5" in r.reasons.render()


def test_knative_scale_up_rate_still_grows_by_one_pod() -> None:
    # Knative's own example: MSUR=1.1, observed 3, ready 2, target 1 -> 3 (ceil(1.1 × 2) = 3).
    rec = kpa(target=1, max_scale_up_rate=1.1)
    rec.observe(0.0, 3.0)
    assert rec.recommend(0.0, ready=2.0, current=2).replicas == 3


def test_rate_limits_name_the_bound() -> None:
    rec = kpa(max_scale_up_rate=2, panic_threshold=100)
    rec.observe(0.0, 100.0)
    r = rec.recommend(0.0, ready=2.0, current=2)
    assert r.replicas == 4
    assert "rate-limited 10 -> 4 by max_scale_up_rate" in r.reasons.render()
    down = kpa(max_scale_down_rate=2)
    down.observe(0.0, 10.0)
    r = down.recommend(0.0, ready=8.0, current=8)
    assert r.replicas == 4
    assert "rate-limited 1 -> 4 by max_scale_down_rate" in r.reasons.render()


def test_panic_starts_at_threshold_and_uses_the_panic_window() -> None:
    rec = kpa()
    steps = drive(rec, [10.0] * 60, ready=1.0)
    assert steps[-1] == (1, "stable")
    # A burst: the 6 s panic window sees it long before the 60 s stable window does.
    rec.observe(60.0, 130.0)
    r = rec.recommend(60.0, ready=1.0, current=1)
    # panic window: (5 × 10 + 130) / 6 = 30 -> 3 pods = 3× capacity >= 2 -> panic
    assert r.rule == "panic"
    assert r.replicas == 3
    assert rec.panicking


def test_no_scale_down_in_panic_and_panic_lasts_a_stable_window_after_the_last_trigger() -> None:
    rec = kpa(stable_window_s=60, panic_window_s=6)
    rec.observe(0.0, 100.0)
    first = rec.recommend(0.0, ready=1.0, current=1)
    assert (first.replicas, first.rule) == (10, "panic")
    # The load vanishes; in panic the recommendation never goes down.
    replicas = 10
    for t in range(1, 61):
        rec.observe(float(t), 0.0)
        r = rec.recommend(float(t), ready=float(replicas), current=replicas)
        assert r.rule == "panic", t
        assert r.replicas == 10, t
    # 61 s after the last tick over the threshold: back to stable mode.
    rec.observe(61.0, 0.0)
    r = rec.recommend(61.0, ready=10.0, current=10)
    assert r.rule == "stable"
    assert r.replicas == 5, "stable average 100/61 -> 1 pod, limited to 10 / max_scale_down_rate 2"


def test_panic_is_extended_while_still_over_the_threshold() -> None:
    rec = kpa()
    for t in range(0, 100):
        rec.observe(float(t), 100.0 if t < 50 else 0.0)
        r = rec.recommend(float(t), ready=1.0, current=1)
    # over the threshold until the panic window empties (t = 55), then 60 s more
    assert r.rule == "panic"
    rec.observe(116.0, 0.0)
    assert rec.recommend(116.0, ready=1.0, current=1).rule == "stable"


def test_scale_to_zero_only_after_an_idle_stable_window_plus_grace() -> None:
    rec = kpa(min_replicas=0, stable_window_s=60, scale_to_zero_grace_s=30)
    results = drive(rec, [10.0] * 10 + [0.0] * 100, ready=1.0)
    # last active at t = 9: zero allowed from t = 9 + 60 + 30 = 99
    assert results[98] == (1, "idle-grace")
    assert results[99] == (0, "scale-to-zero")
    assert all(r[0] >= 1 for r in results[:99])


def test_never_scale_to_zero_with_min_replicas() -> None:
    rec = kpa(min_replicas=2)
    results = drive(rec, [0.0] * 200, ready=2.0)
    assert results[-1][0] == 2


def test_at_zero_stays_at_zero_without_load_and_wakes_on_load() -> None:
    rec = kpa(min_replicas=0)
    results = drive(rec, [0.0] * 5 + [35.0], ready=0.0)
    assert [r[0] for r in results[:5]] == [0] * 5
    # the first load is averaged over the panic window like any other: (5 × 0 + 35) / 6 -> 1
    assert results[5] == (1, "stable")


def test_clamps_say_which_bound() -> None:
    rec = kpa(max_replicas=3)
    rec.observe(0.0, 100.0)
    r = rec.recommend(0.0, ready=3.0, current=3)
    assert r.replicas == 3
    assert "clamped replicas 10 -> 3 by max_replicas" in r.reasons.render()
    low = kpa(min_replicas=4)
    low.observe(0.0, 1.0)
    r = low.recommend(0.0, ready=4.0, current=4)
    assert r.replicas == 4
    assert "clamped replicas 2 -> 4 by min_replicas" in r.reasons.render()


def test_no_data_is_a_value_not_an_error() -> None:
    r = kpa().recommend(5.0, ready=2.0, current=2)
    assert not r.valid and r.rule == "no-data" and r.replicas == 2


def test_a_stale_stable_window_alone_adds_no_replica_in_sluices_rule() -> None:
    # 30 s at 25 (3 replicas' worth at target 10), then 11 s at 7: the 60 s window still
    # wants 3, the last 6 s want 1.  The budget kept the service at 2 replicas meanwhile.
    for adds_need_panic, expected in ((False, 3), (True, 2)):
        rec = kpa(adds_need_panic=adds_need_panic, panic_threshold=10)
        for t in range(30):
            rec.observe(float(t), 25.0)
        for t in range(30, 41):
            rec.observe(float(t), 7.0)
        r = rec.recommend(40.0, ready=2.0, current=2)
        assert (r.replicas, r.rule) == (expected, "stable"), adds_need_panic
        assert r.inputs["stable"] > 20.0 and r.inputs["panic"] < 10.0
    assert any("a replica is added only when the panic window wants it too" in line
               for line in r.reasons.render())  # fmt: skip
    # both windows wanting more: added as before
    rec = kpa(adds_need_panic=True, panic_threshold=10)
    for t in range(10):
        rec.observe(float(t), 25.0)
    assert rec.recommend(9.0, ready=2.0, current=2).replicas == 3


def test_a_deferred_panic_want_is_not_acted_on_once_the_burst_has_passed() -> None:
    # A panic burst wants 15; the budget lets the service run 3.  Once the burst is over,
    # Knative's rule still asks for the 15 it wanted (panic never scales down); Sluice's
    # keeps the 3 it runs and asks only for what the panic window wants now.
    for adds_need_panic, expected in ((False, 15), (True, 3)):
        rec = kpa(adds_need_panic=adds_need_panic)
        for t in range(5):
            rec.observe(float(t), 150.0)
            first = rec.recommend(float(t), ready=1.0, current=1)
        assert (first.replicas, first.rule) == (15, "panic")
        for t in range(5, 12):
            rec.observe(float(t), 10.0)
        r = rec.recommend(11.0, ready=3.0, current=3)
        assert (r.replicas, r.rule) == (expected, "panic"), adds_need_panic
