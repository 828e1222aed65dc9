"""RouteTable: Ingress host and path semantics, table-tested."""

from __future__ import annotations

import pytest

from gateway.dataplane.routing import RouteError, RouteTable, normalize_host
from gateway.dataplane.updates import RouteRule, RoutesUpdate


def rule(
    service: str, path: str = "/", path_type: str = "Prefix", host: str | None = None
) -> RouteRule:
    return RouteRule(service=service, host=host, path=path, path_type=path_type)


# The Kubernetes Ingress documentation's path-matching examples.
INGRESS_EXAMPLES = [
    # (path_type, rule path, request path, matches)
    ("Prefix", "/", "/", True),
    ("Prefix", "/", "/anything/at/all", True),
    ("Exact", "/foo", "/foo", True),
    ("Exact", "/foo", "/bar", False),
    ("Exact", "/foo", "/foo/", False),
    ("Exact", "/foo/", "/foo", False),
    ("Prefix", "/foo", "/foo", True),
    ("Prefix", "/foo", "/foo/", True),
    ("Prefix", "/foo/", "/foo", True),
    ("Prefix", "/foo/", "/foo/", True),
    ("Prefix", "/aaa/bb", "/aaa/bbb", False),
    ("Prefix", "/aaa/bbb", "/aaa/bbb", True),
    ("Prefix", "/aaa/bbb/", "/aaa/bbb", True),
    ("Prefix", "/aaa/bbb", "/aaa/bbb/", True),
    ("Prefix", "/aaa/bbb", "/aaa/bbb/ccc", True),
    ("Prefix", "/aaa/bbb", "/aaa/bbbxyz", False),
    ("Prefix", "/foo", "/foobar", False),
    ("ImplementationSpecific", "/foo", "/foo/bar", True),
    ("ImplementationSpecific", "/foo", "/foobar", False),
    ("Exact", "/Foo", "/foo", False),
    ("Prefix", "/Foo", "/foo", False),
]


@pytest.mark.parametrize(("path_type", "rule_path", "request_path", "matches"), INGRESS_EXAMPLES)
def test_path_matching(path_type: str, rule_path: str, request_path: str, matches: bool) -> None:
    table = RouteTable([rule("svc", rule_path, path_type)])
    assert (table.match("h", request_path) == "svc") is matches


def test_longest_path_wins_and_exact_beats_prefix_on_tie() -> None:
    table = RouteTable(
        [
            rule("root", "/"),
            rule("foo", "/foo"),
            rule("foobar", "/foo/bar"),
            rule("foo-exact", "/foo", "Exact"),
            rule("foobar-prefix-slash", "/foo/bar/"),
        ]
    )
    assert table.match("x", "/foo") == "foo-exact"
    assert table.match("x", "/foo/") == "foo"
    assert table.match("x", "/foo/baz") == "foo"
    # "/foo/bar/" is the same prefix as "/foo/bar"; the first listed keeps it (stable sort).
    assert table.match("x", "/foo/bar/baz") == "foobar"
    assert table.match("x", "/other") == "root"


def test_order_of_rules_does_not_matter_for_precedence() -> None:
    rules = [rule("a", "/a"), rule("ab", "/a/b"), rule("exact", "/a/b", "Exact")]
    for perm in (rules, rules[::-1], [rules[1], rules[2], rules[0]]):
        table = RouteTable(perm)
        assert table.match("", "/a/b") == "exact"
        assert table.match("", "/a/b/c") == "ab"
        assert table.match("", "/a/c") == "a"


HOSTS = [
    # (rule host, request host, matches)
    ("foo.bar.com", "foo.bar.com", True),
    ("foo.bar.com", "FOO.Bar.com", True),
    ("foo.bar.com", "foo.bar.com:8080", True),
    ("foo.bar.com", "foo.bar.com.", True),
    ("foo.bar.com", "bar.com", False),
    ("foo.bar.com", "x.foo.bar.com", False),
    ("*.foo.com", "bar.foo.com", True),
    ("*.foo.com", "BAR.foo.com:443", True),
    ("*.foo.com", "foo.com", False),
    ("*.foo.com", "baz.bar.foo.com", False),
    ("*.foo.com", ".foo.com", False),
    ("*.foo.com", "barfoo.com", False),
    (None, "anything.example", True),
    (None, "", True),
    ("foo.bar.com", "", False),
]


@pytest.mark.parametrize(("rule_host", "request_host", "matches"), HOSTS)
def test_host_matching(rule_host: str | None, request_host: str, matches: bool) -> None:
    table = RouteTable([rule("svc", host=rule_host)])
    assert (table.match(request_host, "/x") == "svc") is matches


def test_exact_host_beats_wildcard_beats_any_host() -> None:
    table = RouteTable(
        [
            rule("any", "/"),
            rule("wild", "/", host="*.example.com"),
            rule("exact", "/", host="www.example.com"),
        ]
    )
    assert table.match("www.example.com", "/") == "exact"
    assert table.match("api.example.com", "/") == "wild"
    assert table.match("example.com", "/") == "any"
    assert table.match("other.test", "/") == "any"


def test_host_tier_falls_through_when_its_paths_do_not_match() -> None:
    table = RouteTable(
        [
            rule("any-api", "/api"),
            rule("exact-web", "/web", host="www.example.com"),
            rule("wild-img", "/img", host="*.example.com"),
        ]
    )
    assert table.match("www.example.com", "/web/x") == "exact-web"
    assert table.match("www.example.com", "/img/x") == "wild-img"
    assert table.match("www.example.com", "/api") == "any-api"
    assert table.match("www.example.com", "/nothing") is None


def test_ipv6_host_with_port() -> None:
    assert normalize_host("[::1]:8080") == "[::1]"
    assert normalize_host("[::1]") == "[::1]"
    assert normalize_host("Example.COM:80") == "example.com"


def test_default_backend_and_no_match() -> None:
    table = RouteTable([rule("api", "/api")], default_backend="web")
    assert table.match("x", "/api/v1") == "api"
    assert table.match("x", "/") == "web"
    assert RouteTable([rule("api", "/api")]).match("x", "/") is None
    assert RouteTable().match("x", "/") is None
    assert RouteTable(default_backend="d").match("x", "/") == "d"


def test_from_update_and_services() -> None:
    update = RoutesUpdate(
        rules=(rule("a", "/a"), rule("b", "/b", host="b.test")), default_backend="c"
    )
    table = RouteTable.from_update(update)
    assert table.services == frozenset({"a", "b", "c"})
    assert table.match("b.test", "/b") == "b"
    assert "3" not in repr(table) or "rules" in repr(table)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            rule("s", "/", "prefix"),
            "path_type must be one of Exact, Prefix, ImplementationSpecific, got 'prefix'",
        ),
        (rule("s", "foo"), "path must start with '/', got 'foo'"),
        (rule("s", "/", host="a.*.com"), "a wildcard host must be '*.domain', got 'a.*.com'"),
    ],
)
def test_bad_rules_are_rejected_with_clear_errors(bad: RouteRule, message: str) -> None:
    with pytest.raises(RouteError) as e:
        RouteTable([bad])
    assert str(e.value) == message


def test_table_is_a_snapshot() -> None:
    rules = [rule("a", "/a")]
    table = RouteTable(rules)
    rules.append(rule("b", "/b"))
    assert table.match("", "/b") is None
    with pytest.raises(AttributeError):
        table.extra = 1  # type: ignore[attr-defined]
