"""Signals merged across gateway replicas found through the gateway's own EndpointSlice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.discovery import KubernetesDiscovery
from gateway.platforms.kubernetes.leader import LeaderElector
from gateway.platforms.kubernetes.peers import PeerSignals
from gateway.platforms.kubernetes.platform import KubernetesControl
from gateway.settings import parse_settings
from scaler.signals import ServiceSignals
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import endpoint_slice
from tests.support.signal_peer import SignalPeer, closed_port_address


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube() as f:
        yield f


def sig(in_flight: int, arrivals: int, p99: float) -> ServiceSignals:
    return ServiceSignals(
        "shop/web",
        at=5.0,
        in_flight=in_flight,
        queued=1,
        arrivals_total=arrivals,
        completions_total=arrivals - in_flight,
        rps=10.0,
        latency_p99_s=p99,
        ready_replicas=3,
    )


async def test_merge_tolerates_a_down_peer_and_freezes_when_all_are_down() -> None:
    with SignalPeer() as a, SignalPeer() as b:
        a.signals, b.signals = [sig(4, 100, 0.2)], [sig(6, 50, 0.5)]
        down = closed_port_address()
        peers = [a.address, b.address]
        async with httpx.AsyncClient() as client:
            merger = PeerSignals(client, lambda: peers, timeout_s=2.0)
            merged, report = await merger.collect(now=42.0)
            web = merged["shop/web"]
            assert (web.in_flight, web.queued, web.rps, web.arrivals_total) == (10, 2, 20.0, 150)
            assert (web.latency_p99_s, web.ready_replicas, web.at) == (0.5, 3, 42.0)
            assert report.answered == tuple(sorted(peers)) and not report.failed

            # one peer goes down, another garbles: merged from the rest, counters stay monotonic
            peers[:] = [a.address, down, b.address]
            b.raw = {"at": 1.0, "signals": {"shop/web": {"service": "shop/web", "at": "soon"}}}
            a.signals = [sig(2, 130, 0.1)]
            merged, report = await merger.collect(now=43.0)
            web = merged["shop/web"]
            assert report.answered == (a.address,)
            assert set(report.failed) == {down, b.address}
            assert "signals['shop/web'].at: must be a number" in report.failed[b.address]
            assert (web.in_flight, web.arrivals_total) == (2, 180)

            # nobody answers: no signals at all -> the engine freezes scaling
            peers[:] = [down]
            merged, report = await merger.collect(now=44.0)
            assert merged == {} and report.answered == ()


async def test_two_gateways_one_leader_merges_signals_from_peers(fake: FakeKube) -> None:
    with SignalPeer() as a, SignalPeer() as b:
        a.signals, b.signals = [sig(3, 10, 0.1)], [sig(5, 20, 0.3)]
        # one slice per replica: the admin port number differs per endpoint on loopback
        for name, peer in (("sluice-a", a), ("sluice-b", b)):
            fake.put(
                endpoint_slice(
                    name,
                    "sluice",
                    [("localhost", {"ready": True})],
                    [("admin", peer.port), ("http", 8080)],
                    namespace="sluice",
                )
            )
        settings = parse_settings({"platform": "kubernetes"})
        api_a, api_b = KubeApi.connect(host=fake.url), KubeApi.connect(host=fake.url)
        kw = {"lease_duration_s": 15, "renew_deadline_s": 10.0, "retry_period_s": 2.0}
        try:
            async with (
                KubernetesDiscovery(api_a, settings) as disco_a,
                KubernetesDiscovery(api_b, settings) as disco_b,
                httpx.AsyncClient() as client,
            ):
                gateways = []
                for api, disco, ident in ((api_a, disco_a, "gw-a"), (api_b, disco_b, "gw-b")):
                    elector = LeaderElector(api, "sluice", "sluice-scaler", ident, **kw)  # type: ignore[arg-type]
                    gateways.append((elector, PeerSignals(client, disco.peer_admin_addresses)))
                async with asyncio.timeout(10):
                    while (
                        len(disco_a.peer_admin_addresses()) < 2
                        or len(disco_b.peer_admin_addresses()) < 2
                    ):
                        await asyncio.sleep(0.02)
                won = [await e.try_acquire_or_renew() for e, _ in gateways]
                assert won == [True, False]
                leader_signals = gateways[0][1]
                merged, report = await leader_signals.collect(now=1.0)
                assert len(report.answered) == 2
                assert merged["shop/web"].in_flight == 8
                assert merged["shop/web"].arrivals_total == 30
        finally:
            await api_a.close()
            await api_b.close()


async def test_a_leader_without_peers_scales_on_its_own_signals(fake: FakeKube) -> None:
    """No gateway replica in the EndpointSlices, or none that ever answered (outside the
    cluster): the leader's own signals, with the reason in the report; once a peer has
    answered, none answering freezes again."""
    own = [sig(7, 70, 0.2)]
    settings = parse_settings({"platform": "kubernetes", "kubernetes": {"identity": "gw-a"}})
    with SignalPeer() as peer:
        peer.signals = [sig(2, 20, 0.1)]
        async with httpx.AsyncClient() as http:
            control = KubernetesControl(
                settings,
                http,
                api=KubeApi.connect(host=fake.url),
                own_signals=lambda now: {s.service: s for s in own},
            )
            async with control:
                async with asyncio.timeout(10):
                    while not control.elector.is_leader():
                        await asyncio.sleep(0.02)
                # nobody in the gateway Service's slices: own signals
                assert (await control.signals(1.0))["shop/web"].in_flight == 7
                assert control.signal_source == "own"

                # a replica is listed but has never answered: own signals still
                down_port = closed_port_address().rsplit(":", 1)[1]
                fake.put(
                    endpoint_slice(
                        "sluice-down",
                        "sluice",
                        [("localhost", {"ready": True})],
                        [("admin", int(down_port))],
                        namespace="sluice",
                    )
                )
                async with asyncio.timeout(10):
                    while not control.discovery.peer_admin_addresses():
                        await asyncio.sleep(0.02)
                assert (await control.signals(2.0))["shop/web"].in_flight == 7
                assert control.signal_source == "own"

                # a peer answers: merged peer signals; then none answers: frozen
                fake.put(
                    endpoint_slice(
                        "sluice-up",
                        "sluice",
                        [("localhost", {"ready": True})],
                        [("admin", peer.port)],
                        namespace="sluice",
                    )
                )
                async with asyncio.timeout(10):
                    while len(control.discovery.peer_admin_addresses()) < 2:
                        await asyncio.sleep(0.02)
                assert (await control.signals(3.0))["shop/web"].in_flight == 2
                assert control.signal_source == "peers"
                fake.remove("endpointslices", "sluice", "sluice-up")
                async with asyncio.timeout(10):
                    while len(control.discovery.peer_admin_addresses()) > 1:
                        await asyncio.sleep(0.02)
                assert await control.signals(4.0) == {}
                assert control.signal_source == "none"
