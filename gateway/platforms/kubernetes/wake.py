"""A request held at zero by a follower, told to the leader at once.

Only the Lease holder runs the scaler.  A gateway replica that holds a request for a service
with no ready endpoint (scale from zero) would otherwise wait for the leader's next regular
tick, which sees the request as ``queued`` in this replica's ``/api/signals``.
:class:`LeaderWake` instead sends ``POST /api/wake/<service>`` to the leader's admin server,
and the leader ticks at once (Knative's activator sends its first stat for a revision at zero
to the autoscaler the same way):

* the leader is the Lease's holder as this replica last saw it; its admin address is the ready
  endpoint of the gateway's own Service whose ``targetRef`` names that pod.  When no endpoint
  names it (slices written without ``targetRef``), every gateway replica gets the POST: only
  the leader ticks for it, a follower's tick is frozen;
* at most one POST per service is in flight, and one per ``gap_s`` (the scaler's interval):
  the admission calls :meth:`LeaderWake.held` for every request it holds;
* a failed POST is logged; the request stays held, and the leader's next regular tick still
  sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from urllib.parse import quote

import httpx

log = logging.getLogger(__name__)


class LeaderWake:
    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        leads: Callable[[], bool],
        holder: Callable[[], str | None],
        address_of: Callable[[str], str | None],
        peers: Callable[[], Sequence[str]],
        timeout_s: float = 1.0,
        admin_token: str | None = None,
        gap_s: float = 1.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.client = client
        self._leads = leads
        self._holder = holder
        self._address_of = address_of
        self._peers = peers
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.gap_s = gap_s
        self._clock = clock
        self._sent_at: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        """POSTs sent (one per receiving replica)."""
        self.failed = 0
        """POSTs that got no 2xx answer."""

    def __repr__(self) -> str:
        return f"LeaderWake(sent={self.sent}, failed={self.failed})"

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def targets(self) -> list[str]:
        """Where a wake goes now: the leader's admin address, every replica's when it is not
        found in the slices, none when this replica leads or no leader is known."""
        if self._leads():
            return []
        holder = self._holder()
        if holder is None:
            return []
        address = self._address_of(holder)
        return [address] if address is not None else sorted(set(self._peers()))

    def held(self, service: str) -> None:
        """A request for ``service`` is held here (called per held request: cheap, coalesced)."""
        now = self._now()
        if now < self._sent_at.get(service, -math.inf) + self.gap_s:
            return
        targets = self.targets()
        if not targets:
            return
        self._sent_at[service] = now
        task = asyncio.create_task(self._send(service, targets), name=f"wake {service}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, service: str, targets: list[str]) -> None:
        path = "/api/wake/" + quote(service, safe="/")
        results = await asyncio.gather(
            *(
                self.client.post(f"http://{t}{path}", headers=self._headers, timeout=self.timeout_s)
                for t in targets
            ),
            return_exceptions=True,
        )
        for target, result in zip(targets, results, strict=True):
            self.sent += 1
            if isinstance(result, httpx.Response) and result.is_success:
                continue
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancelled
            self.failed += 1
            why = (
                f"HTTP {result.status_code}"
                if isinstance(result, httpx.Response)
                else f"{type(result).__name__}: {result}"
            )
            log.warning("wake %s: the leader at %s was not told (%s)", service, target, why)

    async def close(self) -> None:
        """Cancel the POSTs still in flight."""
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
