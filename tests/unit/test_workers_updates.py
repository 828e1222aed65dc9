"""The main process's side of ``workers: N``: a change applied while a worker is still
starting (its Start sent, its Ready not yet received) reaches it too."""

from __future__ import annotations

from gateway.dataplane.updates import EndpointUpdate
from gateway.runtime import Runtime
from gateway.settings import parse_settings
from gateway.workers.ipc import Message, Update
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
