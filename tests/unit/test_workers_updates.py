"""The main process's side of ``workers: N``: a change applied while a worker is still
starting (its Start sent, its Ready not yet received) reaches it too."""

from __future__ import annotations

from gateway.dataplane.updates import EndpointUpdate
from gateway.runtime import Runtime
from gateway.settings import parse_settings
from gateway.workers.ipc import Event, Message, Update
from gateway.workers.supervisor import Workers


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
    gateway, not one per worker."""
    runtime = Runtime(parse_settings({"workers": 2, "services": {"svc": {"endpoints": []}}}))
    workers = Workers(runtime, 2)
    try:
        edges: list[tuple[str, bool]] = []
        runtime.services["svc"].endpoints.on_busy = lambda address, busy: edges.append(
            (address, busy)
        )
        workers.sync_hooks()
        assert workers.hooks.replica_busy == frozenset({"svc"})
        a, b = workers.slots
        workers._relay(a, Event("busy", "svc", "10.0.0.1:80"))
        workers._relay(b, Event("busy", "svc", "10.0.0.1:80"))
        workers._relay(a, Event("idle", "svc", "10.0.0.1:80"))
        assert edges == [("10.0.0.1:80", True)]
        workers._relay(b, Event("idle", "svc", "10.0.0.1:80"))
        assert edges == [("10.0.0.1:80", True), ("10.0.0.1:80", False)]
        assert workers._busy == {}  # a service's own edges are another matter
    finally:
        workers.close()
