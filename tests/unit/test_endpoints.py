"""EndpointSet: joins, draining, ready/terminating selection, ejection."""

from __future__ import annotations

import pytest

from gateway.dataplane.endpoints import Endpoint, EndpointSet, EndpointState, split_address
from gateway.dataplane.updates import EndpointInfo, EndpointUpdate


def update(*infos: EndpointInfo | str, service: str = "svc") -> EndpointUpdate:
    return EndpointUpdate(
        service=service,
        endpoints=tuple(EndpointInfo(i) if isinstance(i, str) else i for i in infos),
    )


def addresses(eps: tuple[Endpoint, ...]) -> list[str]:
    return sorted(ep.address for ep in eps)


class ClosablePool:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_new_endpoints_join_and_are_routable() -> None:
    s = EndpointSet("svc")
    s.apply(update("10.0.0.1:80", "10.0.0.2:80"))
    assert addresses(s.routable) == ["10.0.0.1:80", "10.0.0.2:80"]
    first = s.get("10.0.0.1:80")
    s.apply(update("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"))
    assert s.get("10.0.0.1:80") is first  # kept, with its counters
    assert len(s) == 3


def test_removed_idle_endpoint_drains_at_once() -> None:
    drained: list[str] = []
    s = EndpointSet("svc", on_drained=lambda ep: drained.append(ep.address))
    s.apply(update("a:1", "b:2"))
    pool = ClosablePool()
    b = s.get("b:2")
    assert b is not None
    b.pool = pool
    s.apply(update("a:1"))
    assert drained == ["b:2"]
    assert s.get("b:2") is None
    assert s.is_drained("b:2")
    assert pool.closed


def test_removed_busy_endpoint_drains_after_its_last_request() -> None:
    drained: list[str] = []
    s = EndpointSet("svc", on_drained=lambda ep: drained.append(ep.address))
    s.apply(update("a:1", "b:2"))
    b = s.get("b:2")
    assert b is not None
    b.acquire()
    b.acquire()
    s.apply(update("a:1"))
    assert b.state is EndpointState.DRAINING
    assert addresses(s.routable) == ["a:1"]  # no new requests
    assert not s.is_drained("b:2")
    assert drained == []
    b.release()
    assert drained == []
    b.release()
    assert drained == ["b:2"]
    assert s.is_drained("b:2")
    assert "b:2" not in [ep.address for ep in s.endpoints]


def test_a_draining_endpoint_listed_again_is_ready_again() -> None:
    s = EndpointSet("svc")
    s.apply(update("a:1"))
    a = s.get("a:1")
    assert a is not None
    a.acquire()
    s.apply(update())
    assert s.routable == ()
    s.apply(update("a:1"))
    assert s.routable == (a,)
    a.release()
    assert s.get("a:1") is a


def test_terminating_endpoints_only_when_nothing_is_ready() -> None:
    s = EndpointSet("svc")
    term = EndpointInfo("t:1", ready=False, serving=True, terminating=True)
    unready = EndpointInfo("u:1", ready=False, serving=False, terminating=False)
    s.apply(update("r:1", term, unready))
    assert addresses(s.routable) == ["r:1"]
    s.apply(update(term, unready))
    assert addresses(s.routable) == ["t:1"]
    s.apply(update(unready))
    assert s.routable == ()
    assert s.is_drained("u:1")  # listed but not routable and idle
    gone = EndpointInfo("t:1", ready=False, serving=False, terminating=True)
    s.apply(update(gone))
    assert s.routable == ()


def test_ejected_endpoints_get_no_requests() -> None:
    s = EndpointSet("svc")
    s.apply(update("a:1", "b:2"))
    s.eject("a:1")
    assert addresses(s.routable) == ["b:2"]
    s.eject("a:1", ejected=False)
    assert addresses(s.routable) == ["a:1", "b:2"]


def test_bad_updates_change_nothing() -> None:
    s = EndpointSet("svc")
    s.apply(update("a:1"))
    with pytest.raises(ValueError, match="update for service 'other' applied to 'svc'"):
        s.apply(update("b:2", service="other"))
    with pytest.raises(ValueError, match="an endpoint address must be 'host:port', got 'nope'"):
        s.apply(update("b:2", "nope"))
    assert addresses(s.routable) == ["a:1"]


def test_split_address() -> None:
    assert split_address("127.0.0.1:80") == ("127.0.0.1", 80)
    assert split_address("[::1]:8080") == ("::1", 8080)
    assert split_address("svc.ns.svc:9000") == ("svc.ns.svc", 9000)
    for bad in ("x", ":80", "h:0", "h:70000", "h:p"):
        with pytest.raises(ValueError):
            split_address(bad)


def test_reprs_show_state() -> None:
    s = EndpointSet("svc")
    s.apply(update("a:1"))
    assert repr(s) == "EndpointSet(svc, 1 endpoints, 1 routable)"
    assert repr(s.get("a:1")) == "Endpoint(a:1, ready, in_flight=0)"
