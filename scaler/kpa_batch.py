"""KPA windows and decisions for many services at once, on numpy arrays (pure).

The engine keeps every KPA-mode service in one :class:`KpaBatch`, so a tick over a thousand
services costs a few dozen array operations instead of a thousand Python objects' worth of
work.  :class:`scaler.horizontal.KpaRecommender` is a batch of one, so the table tests and
the engine run the same code.

Windows: all services share the clock, so they share whole-second buckets.  A ring of
``ring_buckets`` columns keeps, per service, the sum and count of the values recorded in each
bucket; each service's stable and panic windows are running sums of the *bucket means* of
its last ``stable_window_s`` / ``panic_window_s`` buckets, and an average is that sum over
the number of buckets *with data* (missing data is not zero load).  See
``scaler.horizontal`` for the decision rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scaler.explanation import Trace
from scaler.policy import ScalingPolicy

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Floats = FloatArray
"""Per-service values of a tick; readers index them one service at a time."""
Ints = IntArray
Bools = BoolArray

_EPS = 1e-9

RULES = ("stable", "panic", "scale-to-zero", "idle-grace", "no-data")


def reference_max(policy: ScalingPolicy) -> int:
    """The most reference replicas (of ``cpu.request``) a service can run: ``max_replicas``
    replicas at ``cpu.max`` — the bound on the horizontal recommendation."""
    return max(
        policy.max_replicas,
        math.floor(policy.max_replicas * policy.cpu.max / policy.cpu.initial_cores + 1e-9),
    )


STABLE, PANIC, TO_ZERO, IDLE_GRACE, NO_DATA = range(5)


@dataclass(slots=True)
class KpaTick:
    """One tick's KPA results for a batch (arrays indexed like the batch's policies).

    Kept read-only after the tick: decisions render their reasons from it on demand.
    """

    replicas: Ints
    load: Ints
    """Reference replicas the load needs now: the larger of the panic-window want and this
    tick's instant want (CPU follows this)."""
    want_instant: Ints
    """Reference replicas this tick's metric snapshot alone needs."""
    rule: Ints
    """Index into :data:`RULES`."""
    stable: Floats
    panic: Floats
    ready: Floats
    want_stable: Ints
    want_panic: Ints
    desired_stable: Ints
    """want_stable after the scale-up/down rate limits."""
    unclamped: Ints
    entered_panic: Bools
    left_panic: Bools
    held_in_panic: Bools
    """In panic and the recommendation would have gone down: kept up."""
    surged: Bools
    """A burst after a panic window without load: ``want_panic`` is this tick's want."""
    woke_for: Floats
    """Seconds since the service had load again after a panic window without any."""
    max_panic: Ints
    rate_limited: Bools
    gated: Bools
    """Not in panic, the stable window wants more replicas than run, the panic window does
    not: none added (``adds_need_panic``)."""
    idle_for: Floats
    active: Bools


class KpaBatch:
    """Knative-style stable/panic windows and decisions for ``len(policies)`` services."""

    def __init__(
        self,
        policies: Sequence[ScalingPolicy],
        granularity_s: float = 1.0,
        *,
        adds_need_panic: bool = False,
        surge_panics: bool = False,
    ) -> None:
        """``adds_need_panic``: a replica is added only when the panic window wants it too
        (Sluice's engine); off, Knative's rule as it is (the stable window alone adds, and
        panic goes back up to the most it wanted).  ``surge_panics``: a tick whose own
        metric (``instant``) wants ``panic_threshold ×`` the ready capacity panics at once,
        wanting that (Sluice's engine: the gateway sees a burst whole, where the panic window
        reads its first second as a sixth of it); off, only the panic window panics."""
        self.adds_need_panic = adds_need_panic
        self.surge_panics = surge_panics
        self.policies = list(policies)
        n = len(self.policies)

        def arr(values: list[float]) -> FloatArray:
            return np.array(values, dtype=np.float64).reshape(n)

        ps = self.policies
        self.n = n
        self.granularity_s = granularity_s
        self.target_value = arr([p.target * p.target_utilization for p in ps])
        self.stable_s = arr([p.stable_window_s for p in ps])
        self.panic_s = arr([p.panic_window_s for p in ps])
        self.threshold = arr([p.panic_threshold for p in ps])
        self.up_rate = arr([p.max_scale_up_rate for p in ps])
        self.down_rate = arr([p.max_scale_down_rate for p in ps])
        self.min_r = np.array([p.min_replicas for p in ps], dtype=np.int64).reshape(n)
        self.max_r = np.array([reference_max(p) for p in ps], dtype=np.int64).reshape(n)
        """The most *reference* replicas: max_replicas replicas at cpu.max."""
        self.zero_after_s = arr([p.stable_window_s + p.scale_to_zero_grace_s for p in ps])
        self.stable_b = np.array(
            [max(1, math.ceil(p.stable_window_s / granularity_s - _EPS)) for p in ps],
            dtype=np.int64,
        ).reshape(n)
        self.panic_b = np.array(
            [max(1, math.ceil(p.panic_window_s / granularity_s - _EPS)) for p in ps],
            dtype=np.int64,
        ).reshape(n)
        width = int(self.stable_b.max()) + 1 if n else 1
        self.width = width
        self._rows = np.arange(n)
        self._sum = np.zeros((n, width))
        self._count = np.zeros((n, width), dtype=np.int64)
        self._col_bucket = np.full(width, -(2**62), dtype=np.int64)
        self._bucket: int | None = None
        # running window state
        self._stable_sum = np.zeros(n)
        self._stable_n = np.zeros(n, dtype=np.int64)
        self._stable_nz = np.zeros(n, dtype=np.int64)
        self._panic_sum = np.zeros(n)
        self._panic_n = np.zeros(n, dtype=np.int64)
        self._panic_nz = np.zeros(n, dtype=np.int64)
        # decision state
        self.panic_since = np.full(n, np.nan)
        self.max_panic = np.zeros(n, dtype=np.int64)
        self.last_active = np.full(n, -np.inf)
        self.woke_at = np.full(n, -np.inf)
        """When each service last had load after a whole panic window without any."""
        self.first_at = np.full(n, np.inf)
        """When each service was first observed (inf: never)."""

    def __repr__(self) -> str:
        return f"KpaBatch(services={self.n}, panicking={int((~np.isnan(self.panic_since)).sum())})"

    # -- windows ---------------------------------------------------------------------

    def _leave(
        self, bucket: int, depth: IntArray, total: FloatArray, n: IntArray, nz: IntArray
    ) -> None:
        """Bucket ``bucket - depth`` leaves each window (per service)."""
        leaving = bucket - depth
        cols = leaving % self.width
        valid = self._col_bucket[cols] == leaving
        counts = self._count[self._rows, cols]
        has = valid & (counts > 0)
        if not has.any():
            return
        means = np.where(has, self._sum[self._rows, cols] / np.maximum(counts, 1), 0.0)
        total -= means
        n -= has
        nz -= has & (means != 0.0)

    def _advance(self, bucket: int) -> None:
        last = self._bucket
        if last is not None and bucket <= last:
            return
        start = bucket if last is None else last + 1
        if bucket - start >= self.width:  # a long silence: everything has left every window
            self._sum[:] = 0.0
            self._count[:] = 0
            self._col_bucket[:] = -(2**62)
            for a in (self._stable_sum, self._panic_sum):
                a[:] = 0.0
            for counts in (self._stable_n, self._stable_nz, self._panic_n, self._panic_nz):
                counts[:] = 0
            start = bucket
        for b in range(start, bucket + 1):
            self._leave(b, self.stable_b, self._stable_sum, self._stable_n, self._stable_nz)
            self._leave(b, self.panic_b, self._panic_sum, self._panic_n, self._panic_nz)
            col = b % self.width
            self._sum[:, col] = 0.0
            self._count[:, col] = 0
            self._col_bucket[col] = b
        self._bucket = bucket
        # An all-zero window averages to exactly 0: drop float dust.
        self._stable_sum[self._stable_nz == 0] = 0.0
        self._panic_sum[self._panic_nz == 0] = 0.0

    def observe(self, now: float, values: FloatArray, fresh: BoolArray) -> None:
        """Record ``values`` for the services where ``fresh`` is set."""
        bucket = math.floor(now / self.granularity_s)
        self._advance(bucket)
        if not fresh.any():
            return
        col = (self._bucket if self._bucket is not None else bucket) % self.width
        s = self._sum[:, col]
        c = self._count[:, col]
        had = c > 0
        old = np.where(had, s / np.maximum(c, 1), 0.0)
        s_new = np.where(fresh, s + values, s)
        c_new = c + fresh
        new = np.where(c_new > 0, s_new / np.maximum(c_new, 1), 0.0)
        delta = np.where(fresh, new - old, 0.0)
        added = fresh & ~had
        nz_delta = np.where(fresh, (new != 0.0).astype(np.int64) - (had & (old != 0.0)), 0)
        self._sum[:, col] = s_new
        self._count[:, col] = c_new
        self._stable_sum += delta
        self._panic_sum += delta
        self._stable_n += added
        self._panic_n += added
        self._stable_nz += nz_delta
        self._panic_nz += nz_delta
        self.first_at = np.where(fresh & (self.first_at == np.inf), now, self.first_at)
        woke = fresh & (values > 0) & (now - self.last_active >= self.panic_s)
        self.woke_at = np.where(woke, now, self.woke_at)
        self.last_active = np.where(fresh & (values > 0), now, self.last_active)

    def averages(self, now: float) -> tuple[FloatArray, FloatArray]:
        """Stable and panic window averages at ``now`` (NaN where a window has no data)."""
        self._advance(math.floor(now / self.granularity_s))
        stable_n = self._stable_n
        panic_n = self._panic_n
        stable = np.where(self._stable_nz > 0, self._stable_sum / np.maximum(stable_n, 1), 0.0)
        panic = np.where(self._panic_nz > 0, self._panic_sum / np.maximum(panic_n, 1), 0.0)
        stable = np.where(stable_n > 0, np.maximum(stable, 0.0), np.nan)
        panic = np.where(panic_n > 0, np.maximum(panic, 0.0), np.nan)
        return stable, panic

    # -- decisions -------------------------------------------------------------------

    def recommend(
        self,
        now: float,
        ready: FloatArray,
        current: IntArray,
        active: BoolArray,
        instant: FloatArray | None = None,
        *,
        size: FloatArray | None = None,
        surging: BoolArray | None = None,
    ) -> KpaTick:
        """Replicas wanted for every service; state changes only where ``active`` is set.

        ``size`` (optional): reference replicas per replica, when ``ready`` is in reference
        replicas of replicas that large.  ``surging`` (optional, with ``surge_panics``): the
        services the surge rule applies to (default: all).  ``instant`` is the metric right now (this tick's snapshot, not a window average):
        CPU follows the larger of its want and the panic window's, so a burst gets CPU the
        tick it is seen and a backlog keeps its CPU until it has drained.  Replicas follow
        the windows, and with ``surge_panics`` also a burst ``instant`` shows on a service
        idle for a whole panic window.
        """
        stable, panic = self.averages(now)
        has_stable = ~np.isnan(stable)
        valid = active & has_stable & ~np.isnan(panic)
        st = np.where(has_stable, stable, 0.0)
        pa = np.where(valid, panic, 0.0)
        tv = self.target_value
        ready_count = np.maximum(ready, 1.0)
        if size is None:
            max_up = np.ceil(self.up_rate * ready_count - _EPS).astype(np.int64)
            max_down = np.floor(ready_count / self.down_rate + _EPS).astype(np.int64)
        else:
            # ``ready`` counts replicas of ``size`` reference replicas each: the rates apply
            # to replicas (1 ready replica at rate 2 may go to 0), the result in references.
            pods = np.maximum(np.round(ready / size), 1.0)
            max_up = (np.ceil(self.up_rate * pods - _EPS) * size).astype(np.int64)
            max_down = (np.floor(pods / self.down_rate + _EPS) * size).astype(np.int64)
            ready_count = pods * size
        want_s = np.maximum(np.ceil(st / tv - _EPS), 0).astype(np.int64)
        want_p = np.maximum(np.ceil(pa / tv - _EPS), 0).astype(np.int64)
        want_i = np.zeros_like(want_p)
        surge = np.zeros(self.n, dtype=bool)
        if instant is not None:
            want_i = np.where(valid, np.maximum(np.ceil(instant / tv - _EPS), 0), 0)
            want_i = want_i.astype(np.int64)
            if self.surge_panics:
                # a burst after a whole panic window without load: until it fills the window
                # the zeros before it dilute the average, so a surge seen now (this tick's
                # want at the panic threshold of the ready capacity) panics at once
                waking = now - self.woke_at < self.panic_s
                surge = valid & waking & (want_i / ready_count >= self.threshold)
                if surging is not None:
                    surge &= surging
                surge &= want_i > want_p
                want_p = np.where(surge, want_i, want_p)
        des_s = np.minimum(np.maximum(want_s, max_down), max_up)
        des_p = np.minimum(np.maximum(want_p, max_down), max_up)

        over = valid & (want_p / ready_count >= self.threshold)
        was_panicking = ~np.isnan(self.panic_since)
        entered = over & ~was_panicking
        left = valid & ~over & was_panicking & (now - self.panic_since > self.stable_s)
        panic_since = np.where(over, now, np.where(left, np.nan, self.panic_since))
        max_panic = np.where(left, 0, self.max_panic)
        in_panic = valid & ~np.isnan(panic_since)

        # A replica is added only when the panic window wants it too: the stable window alone
        # (a minute that may still hold a drained backlog) holds replicas, never adds them.
        have = current if size is None else current * size
        rate_limited = des_s != want_s
        limited_s = des_s
        gated = np.zeros_like(rate_limited)
        keep = max_panic
        if self.adds_need_panic:
            gated = des_s > np.maximum(have, des_p)
            des_s = np.where(des_s > have, np.maximum(have, np.minimum(des_s, des_p)), des_s)
        desired = np.where(in_panic, np.maximum(des_s, des_p), des_s)
        if self.adds_need_panic:
            # Panic never scales down from the most it wanted; it adds only what the panic
            # window wants now (a want the budget deferred is not acted on once it passed).
            keep = np.minimum(max_panic, np.maximum(have, desired))
        held = in_panic & (desired < keep)
        max_panic = np.where(in_panic, np.maximum(max_panic, desired), max_panic)
        desired = np.where(in_panic, np.maximum(desired, keep), desired)
        rate_limited = ~in_panic & rate_limited
        gated = ~in_panic & gated

        # CPU follows the load now (the panic window); the replicas the windows, rate limits
        # and panic keep beyond that are held, and their CPU is only lent spare CPU.
        load = np.minimum(np.maximum(want_p, want_i), self.max_r)
        zero = desired == 0
        idle_for = now - self.last_active
        covered = now - self.first_at
        to_zero = (
            zero
            & (self.min_r == 0)
            & (idle_for >= self.zero_after_s)
            & (covered >= self.zero_after_s)
        )
        hold = zero & ~to_zero & (current > 0) & (self.min_r == 0)
        desired = np.where(hold, 1, desired)
        unclamped = desired
        desired = np.minimum(np.maximum(desired, self.min_r), self.max_r)

        rule = np.where(in_panic, PANIC, STABLE)
        rule = np.where(to_zero, TO_ZERO, np.where(hold, IDLE_GRACE, rule))
        rule = np.where(valid, rule, NO_DATA)
        desired = np.where(valid, desired, current)

        # commit state only where the service was evaluated with data
        self.panic_since = np.where(valid, panic_since, self.panic_since)
        self.max_panic = np.where(valid, max_panic, self.max_panic)
        return KpaTick(
            replicas=desired,
            load=np.where(valid, load, current),
            want_instant=want_i,
            rule=rule,
            stable=stable,
            panic=panic,
            ready=ready,
            want_stable=want_s,
            want_panic=want_p,
            desired_stable=limited_s,
            gated=gated & valid,
            unclamped=unclamped,
            entered_panic=entered & valid,
            left_panic=left & valid,
            held_in_panic=held & valid,
            surged=surge,
            woke_for=now - self.woke_at,
            max_panic=max_panic,
            rate_limited=rate_limited & valid,
            idle_for=idle_for,
            active=valid,
        )

    def explain(self, tick: KpaTick, i: int, trace: Trace) -> None:
        """Add service ``i``'s KPA steps and clamps for ``tick`` to ``trace``."""
        p = self.policies[i]
        if tick.rule[i] == NO_DATA:
            trace.step("no_data")
            return
        tv = float(self.target_value[i])
        ready = float(tick.ready[i])
        trace.step(
            "kpa.windows",
            metric=p.metric,
            stable=float(tick.stable[i]),
            stable_window_s=p.stable_window_s,
            panic=float(tick.panic[i]),
            panic_window_s=p.panic_window_s,
            target=p.target,
            target_utilization=p.target_utilization,
            target_value=tv,
            capacity=ready,
        )
        if tick.entered_panic[i] and not tick.surged[i]:
            trace.step(
                "kpa.panic_entered",
                want_panic=int(tick.want_panic[i]),
                threshold=p.panic_threshold,
                capacity=max(ready, 1.0),
            )
        if tick.left_panic[i]:
            trace.step("kpa.panic_over", stable_window_s=p.stable_window_s)
        rule = int(tick.rule[i])
        if rule == PANIC:
            if tick.held_in_panic[i]:
                trace.step("kpa.panic_hold", replicas=int(tick.replicas[i]))
            if tick.surged[i]:
                trace.step(
                    "kpa.surge",
                    metric=p.metric,
                    want=int(tick.want_panic[i]),
                    threshold=p.panic_threshold,
                    capacity=max(ready, 1.0),
                    woke_s=float(tick.woke_for[i]),
                    panic_window_s=p.panic_window_s,
                )
            else:
                trace.step(
                    "kpa.panic",
                    panic=float(tick.panic[i]),
                    target_value=tv,
                    want=int(tick.want_panic[i]),
                )
        else:
            trace.step(
                "kpa.stable",
                stable=float(tick.stable[i]),
                target_value=tv,
                want=int(tick.want_stable[i]),
            )
            if tick.rate_limited[i]:
                wanted = int(tick.want_stable[i])
                got = int(tick.desired_stable[i])
                bound = "max_scale_up_rate" if got < wanted else "max_scale_down_rate"
                trace.clamp("replicas", wanted, got, bound)
            if tick.gated[i]:
                trace.step(
                    "kpa.stable_gated",
                    want=int(tick.desired_stable[i]),
                    panic_want=int(tick.want_panic[i]),
                    panic_window_s=p.panic_window_s,
                )
        if rule == TO_ZERO:
            trace.step(
                "kpa.to_zero",
                idle_s=float(tick.idle_for[i]),
                stable_window_s=p.stable_window_s,
                grace_s=p.scale_to_zero_grace_s,
            )
        elif rule == IDLE_GRACE:
            trace.step("kpa.idle_grace", zero_after_s=float(self.zero_after_s[i]))
        windows = max(int(tick.want_panic[i]), int(tick.want_stable[i]))
        if tick.want_instant[i] > windows:
            trace.step(
                "kpa.instant", metric=p.metric, want=int(tick.want_instant[i]), windows=windows
            )
        unclamped = int(tick.unclamped[i])
        top = int(self.max_r[i])
        if unclamped > top:
            name = (
                "max_replicas" if top == p.max_replicas else "max_replicas × cpu.max / cpu.request"
            )
            trace.clamp("replicas", unclamped, top, name)
        elif unclamped < p.min_replicas:
            trace.clamp("replicas", unclamped, p.min_replicas, "min_replicas")
