"""The main process's side of ``workers: N``: a change applied while a worker is still
starting (its Start sent, its Ready not yet received) reaches it too."""

from __future__ import annotations

import asyncio

from gateway.dataplane.endpoints import Endpoint
from gateway.dataplane.updates import EndpointInfo, EndpointUpdate
from gateway.runtime import Runtime
from gateway.settings import parse_settings
from gateway.workers.ipc import Event, Hooks, Message, Update
from gateway.workers.supervisor import Workers
from gateway.workers.worker import WorkerLink


class Recorded:
    """A channel that keeps what is sent (the worker process is not under test here)."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, message: Message) -> None:
        self.sent.append(message)


def test_an_update_reaches_a_worker_that_is_still_starting() -> None:
    runtime = Runtime(parse_settings({"workers": 2, "services": {"svc": {"endpoints": []}}}))
    workers = Workers(runtime, 2)
    try:
        starting, absent = workers.slots
        channel = Recorded()
        starting.channel = channel  # type: ignore[assignment]
        starting.ready = False  # its Start was sent, its Ready has not come yet
        update = EndpointUpdate("svc", ())
        workers.forward(update)
        assert channel.sent == [Update(1, update)]
        assert absent.channel is None  # not started: its Start will carry the change
        assert workers.endpoints["svc"] == update
    finally:
        workers.close()


def test_an_endpoint_is_busy_while_any_worker_has_a_request_in_flight_to_it() -> None:
    """The endpoints' busy/idle edges (CPU lending per replica on ``local``) are asked of the
    workers with the hooks and relayed to the main runtime's endpoint set: one edge for the
    gateway, not one per worker; a relayed idle edge has had its hold in the worker."""
    runtime = Runtime(parse_settings({"workers": 2, "services": {"svc": {"endpoints": []}}}))
    workers = Workers(runtime, 2)
    try:
        edges: list[tuple[str, bool, bool]] = []

        def on_busy(address: str, busy: bool, held: bool = False, /) -> None:
            edges.append((address, busy, held))

        runtime.services["svc"].endpoints.on_busy = on_busy
        workers.sync_hooks()
        assert workers.hooks.replica_busy == frozenset({"svc"})
        a, b = workers.slots
        workers._relay(a, Event("busy", "svc", "10.0.0.1:80"))
        workers._relay(b, Event("busy", "svc", "10.0.0.1:80"))
        workers._relay(a, Event("idle", "svc", "10.0.0.1:80"))
        assert edges == [("10.0.0.1:80", True, False)]
        workers._relay(b, Event("idle", "svc", "10.0.0.1:80"))
        assert edges == [("10.0.0.1:80", True, False), ("10.0.0.1:80", False, True)]
        assert workers._busy == {}  # a service's own edges are another matter
    finally:
        workers.close()


def worker_link(channel: Recorded, hold_s: float) -> tuple[WorkerLink, Endpoint]:
    """A worker's link with the per-replica hooks on for ``svc``, and one of its endpoints."""
    settings = parse_settings(
        {
            "workers": 2,
            "budget": {"cpu": 2, "enforcement": "limit", "lend_after_idle_s": hold_s},
            "services": {"svc": {"endpoints": ["127.0.0.1:9"]}},
        }
    )
    runtime = Runtime(settings)
    runtime.apply_endpoints(EndpointUpdate("svc", (EndpointInfo("127.0.0.1:9"),)))
    link = WorkerLink(
        channel,  # type: ignore[arg-type]
        runtime,
        lambda _: None,
        lambda: 0,
        applied=0,
        hooks=Hooks(replica_busy=frozenset({"svc"})),
    )
    endpoint = runtime.services["svc"].endpoints.get("127.0.0.1:9")
    assert endpoint is not None
    return link, endpoint


async def test_a_worker_relays_an_endpoint_only_around_gaps_of_the_hold() -> None:
    """Per request nothing crosses to the main process: a replica whose gaps between
    requests are shorter than ``lend_after_idle_s`` is reported busy once."""
    channel = Recorded()
    _link, ep = worker_link(channel, hold_s=0.05)
    for _ in range(100):  # back to back: each gap far shorter than the hold
        ep.acquire()
        ep.release()
    ep.acquire()
    assert channel.sent == [Event("busy", "svc", "127.0.0.1:9")]
    ep.release()
    await asyncio.sleep(0.2)  # the hold's timer (0.05 s) fires first on this loop
    assert channel.sent == [
        Event("busy", "svc", "127.0.0.1:9"),
        Event("idle", "svc", "127.0.0.1:9"),
    ]
    ep.acquire()
    assert channel.sent[-1] == Event("busy", "svc", "127.0.0.1:9")
    assert len(channel.sent) == 3
