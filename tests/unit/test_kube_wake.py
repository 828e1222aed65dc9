"""LeaderWake: where a follower's wake goes, and how often (coalesced per service)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.platforms.kubernetes.wake import LeaderWake


class Peers:
    """What the wake reads: who leads, each pod's admin address; the POSTs that reached a
    replica's admin server (an httpx transport: the peers' side is not under test here)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.leads = False
        self.holder: str | None = "gw-a"
        self.addresses = {"gw-a": "10.0.0.1:9901", "gw-b": "10.0.0.2:9901"}
        self.posts: list[tuple[str, str | None]] = []
        self.status = 202

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.posts.append((str(request.url), request.headers.get("authorization")))
        return httpx.Response(self.status, json={"ok": self.status == 202})

    def wake(self, client: httpx.AsyncClient, token: str | None = None) -> LeaderWake:
        return LeaderWake(
            client,
            leads=lambda: self.leads,
            holder=lambda: self.holder,
            address_of=self.addresses.get,
            peers=lambda: list(self.addresses.values()),
            admin_token=token,
            clock=lambda: self.now,
        )


async def settle(wake: LeaderWake) -> None:
    while wake._tasks:
        await asyncio.sleep(0)


async def test_a_wake_goes_to_the_leader_once_per_gap_per_service() -> None:
    peers = Peers()
    async with httpx.AsyncClient(transport=httpx.MockTransport(peers.handler)) as client:
        wake = peers.wake(client, token="t" * 32)
        for _ in range(50):  # every held request calls it
            wake.held("shop/web")
        wake.held("shop/api")
        await settle(wake)
        assert sorted(peers.posts) == [
            ("http://10.0.0.1:9901/api/wake/shop/api", "Bearer " + "t" * 32),
            ("http://10.0.0.1:9901/api/wake/shop/web", "Bearer " + "t" * 32),
        ]
        peers.now += 0.99
        wake.held("shop/web")
        await settle(wake)
        assert len(peers.posts) == 2
        peers.now += 0.02
        wake.held("shop/web")
        await settle(wake)
        assert len(peers.posts) == 3
        assert (wake.sent, wake.failed) == (3, 0)


async def test_no_wake_while_leading_or_with_no_leader_known() -> None:
    peers = Peers()
    async with httpx.AsyncClient(transport=httpx.MockTransport(peers.handler)) as client:
        wake = peers.wake(client)
        peers.leads = True
        wake.held("shop/web")
        peers.leads, peers.holder = False, None
        wake.held("shop/web")
        await settle(wake)
        assert peers.posts == []
        # nothing was sent, so nothing is coalesced: the first wake with a leader goes out
        peers.holder = "gw-b"
        wake.held("shop/web")
        await settle(wake)
        assert peers.posts == [("http://10.0.0.2:9901/api/wake/shop/web", None)]


async def test_a_leader_not_found_in_the_slices_gets_it_through_every_replica() -> None:
    peers = Peers()
    peers.holder = "gw-old"  # e.g. slices without targetRef
    async with httpx.AsyncClient(transport=httpx.MockTransport(peers.handler)) as client:
        wake = peers.wake(client)
        wake.held("shop/web")
        await settle(wake)
        assert sorted(u for u, _ in peers.posts) == [
            "http://10.0.0.1:9901/api/wake/shop/web",
            "http://10.0.0.2:9901/api/wake/shop/web",
        ]


async def test_a_refused_wake_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    peers = Peers()
    peers.status = 401
    async with httpx.AsyncClient(transport=httpx.MockTransport(peers.handler)) as client:
        wake = peers.wake(client)
        wake.held("shop/web")
        await settle(wake)
        assert (wake.sent, wake.failed) == (1, 1)
    assert "wake shop/web: the leader at 10.0.0.1:9901 was not told (HTTP 401)" in caplog.text
