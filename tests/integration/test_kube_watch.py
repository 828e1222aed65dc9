"""The reflector (list+watch in a thread) backs off on errors and resumes without relisting."""

from __future__ import annotations

import asyncio

from gateway.platforms.kubernetes.api import KubeApi
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import ingress


async def watch_open(fake: FakeKube, plural: str) -> None:
    """Wait until the reflector's watch is streaming, so faults hit that watch (not a request
    still on its way to the fake server)."""
    async with asyncio.timeout(10):
        while fake.open_watches(plural) < 1:
            await asyncio.sleep(0.02)


async def test_errors_back_off_exponentially_then_list_and_watch_resume() -> None:
    with FakeKube() as fake:
        fake.put(ingress("a", [("a.test", "/", "Prefix", "a", 80)]))
        fake.fail("list", "ingresses", 500, times=3)
        api = KubeApi.connect(host=fake.url)
        try:
            reflector = api.watch_ingresses("shop")
            snapshots = reflector.snapshots()
            async with asyncio.timeout(15):
                first = await anext(snapshots)
            assert list(first) == ["shop/a"]
            waits = list(reflector.backoffs_s)
            assert len(waits) == 3
            for wait_s, ceiling_s in zip(waits, (0.2, 0.4, 0.8), strict=True):
                assert ceiling_s / 2 <= wait_s <= ceiling_s
            assert "500" in (reflector.last_error or "")

            # a failing watch is retried from the same resourceVersion: no relist
            await watch_open(fake, "ingresses")
            fake.fail("watch", "ingresses", 503, times=1)
            fake.drop_watches()
            fake.put(ingress("b", [("b.test", "/", "Prefix", "b", 80)]))
            async with asyncio.timeout(15):
                second = await anext(snapshots)
            assert sorted(second) == ["shop/a", "shop/b"]
            assert reflector.relists == 1
            lists = [c for c in fake.requests if c.verb == "list"]
            assert len(lists) == 4  # three failures and one success
            assert "503" in (reflector.last_error or "")
        finally:
            await api.close()


async def test_close_stops_watch_threads_promptly() -> None:
    with FakeKube() as fake:
        api = KubeApi.connect(host=fake.url)
        reflector = api.watch_ingresses()
        snapshots = reflector.snapshots()
        async with asyncio.timeout(10):
            assert await anext(snapshots) == {}
        await api.close()
        assert reflector._thread is not None
        reflector.join(5)
        assert not reflector._thread.is_alive()
        await snapshots.aclose()


async def test_watches_that_end_at_once_back_off_instead_of_spinning() -> None:
    with FakeKube() as fake:
        api = KubeApi.connect(host=fake.url)
        try:
            reflector = api.watch_ingresses("shop")
            snapshots = reflector.snapshots()
            async with asyncio.timeout(10):
                await anext(snapshots)
            await watch_open(fake, "ingresses")
            fake.watch_lifetime_s = 0  # every watch now ends at once, saying nothing
            fake.drop_watches()
            async with asyncio.timeout(15):
                while len(reflector.backoffs_s) < 4:
                    await asyncio.sleep(0.05)
            waits = list(reflector.backoffs_s)[:4]
            # the first wait follows the dropped connection; then empty watches keep doubling it
            for wait_s, ceiling_s in zip(waits, (0.2, 0.4, 0.8, 1.6), strict=True):
                assert ceiling_s / 2 <= wait_s <= ceiling_s
            assert reflector.relists == 1  # resumed each time, never relisted
            await snapshots.aclose()
        finally:
            await api.close()


async def test_a_watch_survives_an_api_server_restart_that_answers_403_at_first() -> None:
    with FakeKube() as fake:
        fake.put(ingress("a", [("a.test", "/", "Prefix", "a", 80)]))
        api = KubeApi.connect(host=fake.url)
        try:
            reflector = api.watch_ingresses("shop")
            snapshots = reflector.snapshots()
            async with asyncio.timeout(10):
                assert list(await anext(snapshots)) == ["shop/a"]
            await watch_open(fake, "ingresses")
            fake.restart(forbidden_requests=3)
            fake.put(ingress("b", [("b.test", "/", "Prefix", "b", 80)]))
            async with asyncio.timeout(15):
                while "shop/b" not in reflector.items():
                    await asyncio.sleep(0.02)
            assert reflector.last_error is not None and "403" in reflector.last_error
            assert len(reflector.backoffs_s) >= 3  # it backed off, it did not spin
        finally:
            await api.close()
