"""EndpointConnections: LIFO reuse, idle expiry, bounded size, closing (no sockets: no transports)."""

from __future__ import annotations

from gateway.dataplane import upstream
from gateway.dataplane.upstream import EndpointConnections, UpstreamConnection


def conns(pool: EndpointConnections, n: int) -> list[UpstreamConnection]:
    return [UpstreamConnection(pool) for _ in range(n)]


def test_take_returns_the_most_recently_used_live_connection() -> None:
    pool = EndpointConnections("127.0.0.1", 80, "127.0.0.1:80")
    a, b, c = conns(pool, 3)
    pool.put(a, 1.0)
    pool.put(b, 2.0)
    pool.put(c, 3.0)
    c.closed = True  # the upstream closed it while idle
    assert pool.take(3.5) is b
    assert pool.take(3.5) is a
    assert pool.take(3.5) is None


def test_take_skips_connections_idle_too_long() -> None:
    pool = EndpointConnections("h", 1, "h:1")
    (a,) = conns(pool, 1)
    pool.put(a, 0.0)
    assert pool.take(upstream.IDLE_TIMEOUT_S + 0.1) is None
    assert a.closed


def test_expire_closes_the_oldest_idle_connections() -> None:
    pool = EndpointConnections("h", 1, "h:1")
    a, b, c = conns(pool, 3)
    pool.put(a, 0.0)
    pool.put(b, 1.0)
    pool.put(c, 10.0)
    pool.expire(upstream.IDLE_TIMEOUT_S + 0.5)  # idle since before 0.5: only a
    assert a.closed and not b.closed and not c.closed
    assert pool.idle == [b, c]


def test_put_is_bounded_and_a_closed_pool_keeps_nothing() -> None:
    pool = EndpointConnections("h", 1, "h:1")
    extra = conns(pool, upstream.MAX_IDLE_PER_ENDPOINT + 1)
    for conn in extra:
        pool.put(conn, 0.0)
    assert len(pool.idle) == upstream.MAX_IDLE_PER_ENDPOINT
    assert extra[-1].closed
    pool.close()
    assert pool.idle == []
    assert all(c.closed for c in extra)
    (late,) = conns(pool, 1)
    pool.put(late, 0.0)
    assert late.closed and pool.idle == []
