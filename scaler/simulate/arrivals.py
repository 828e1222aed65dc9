"""Random arrivals drawn from a workload: Poisson times and CPU-seconds per request, seeded.

Every run of one simulation (Sluice and its baseline) replays the very same arrivals.
Each service draws from its own stream (seed + service name), so adding a service to a
workload does not change the others' arrivals.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scaler.simulate.workload import Piece, ServiceLoad

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Arrivals:
    """One service's requests, sorted by arrival time."""

    times_s: FloatArray
    cpu_s: FloatArray
    """CPU-seconds each request needs."""

    def __len__(self) -> int:
        return int(self.times_s.size)


def draw_arrivals(name: str, load: ServiceLoad, duration_s: float, seed: int) -> Arrivals:
    """Draw Poisson arrivals for every constant-rate piece of ``load`` in ``[0, duration_s)``."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    pieces = load.pieces(duration_s)
    if not pieces:
        empty = np.zeros(0, dtype=np.float64)
        return Arrivals(empty, empty.copy())
    starts = np.array([p.start_s for p in pieces])
    widths = np.array([p.end_s - p.start_s for p in pieces])
    rates = np.array([p.rps for p in pieces])
    means = np.array([p.cpu_s for p in pieces])
    counts = rng.poisson(rates * widths)
    total = int(counts.sum())
    times = np.repeat(starts, counts) + rng.random(total) * np.repeat(widths, counts)
    mean_cpu = np.repeat(means, counts)
    cv = load.cpu_cv
    if cv > 0:
        shape = 1.0 / (cv * cv)
        work = rng.gamma(shape, 1.0 / shape, total) * mean_cpu
        work = np.maximum(work, 1e-6)
    else:
        work = mean_cpu
    order = np.argsort(times, kind="stable")
    return Arrivals(times[order].astype(np.float64), work[order].astype(np.float64))


def offered_per_tick(
    pieces: list[Piece], ticks: int, tick_s: float
) -> tuple[FloatArray, FloatArray]:
    """Expected (requests per second, CPU cores) offered in each tick, from the workload itself."""
    rps = np.zeros(ticks)
    cores = np.zeros(ticks)
    for p in pieces:
        first = int(p.start_s // tick_s)
        last = min(int(np.ceil(p.end_s / tick_s)), ticks)
        for k in range(first, last):
            overlap = min(p.end_s, (k + 1) * tick_s) - max(p.start_s, k * tick_s)
            if overlap > 0:
                rps[k] += p.rps * overlap / tick_s
                cores[k] += p.rps * p.cpu_s * overlap / tick_s
    return rps, cores
