"""Route lookup with Kubernetes Ingress semantics: ``RouteTable.match(host, path) -> service``.

Pure and immutable: a table is built once from ``RouteRule``s (plus an optional default
backend) and swapped whole when routes change, so the data plane reads it without locks.

Semantics (networking.k8s.io/v1 Ingress):

* host: an exact host (case-insensitive, any ``:port`` ignored), a wildcard ``*.foo.com``
  matching exactly one more label (``bar.foo.com``, not ``foo.com`` nor ``a.bar.foo.com``),
  or no host (any host).  An exact host beats a wildcard, which beats no host: the first
  tier with a matching path decides.
* path: ``Exact`` compares the whole path, case-sensitively.  ``Prefix`` matches whole
  ``/``-separated elements (``/foo`` matches ``/foo``, ``/foo/``, ``/foo/bar``, not
  ``/foobar``), a trailing slash on the rule or the request is ignored.
  ``ImplementationSpecific`` is treated as ``Prefix``.
* within a tier the longest path wins; on a tie ``Exact`` beats ``Prefix``.
* nothing matches: the default backend, else ``None`` (the data plane answers 404).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gateway.dataplane.updates import RouteRule, RoutesUpdate

PATH_TYPES = frozenset({"Exact", "Prefix", "ImplementationSpecific"})


class RouteError(ValueError):
    """A rule that cannot be put in a table (bad host, path or path type)."""


@dataclass(frozen=True, slots=True)
class _PathRule:
    exact: bool
    path: str
    """Exact: the path as given.  Prefix: without its trailing slash ('' for '/')."""
    service: str

    def matches(self, path: str) -> bool:
        if self.exact:
            return path == self.path
        p = self.path
        if not p:
            return True
        return path.startswith(p) and (len(path) == len(p) or path[len(p)] == "/")

    @property
    def sort_key(self) -> tuple[int, int]:
        # Longest first; on equal length Exact (0) before Prefix (1).
        return (-len(self.path), 0 if self.exact else 1)


def _compile(rules: Iterable[_PathRule]) -> tuple[_PathRule, ...]:
    return tuple(sorted(rules, key=lambda r: r.sort_key))


def _first(rules: tuple[_PathRule, ...], path: str) -> str | None:
    for rule in rules:
        if rule.matches(path):
            return rule.service
    return None


def normalize_host(host: str) -> str:
    """``Example.COM:8080`` -> ``example.com``; ``[::1]:80`` -> ``[::1]``; a trailing dot dropped."""
    if host.startswith("["):
        end = host.find("]")
        host = host[: end + 1] if end != -1 else host
    else:
        colon = host.rfind(":")
        if colon != -1:
            host = host[:colon]
    return host.rstrip(".").lower()


class RouteTable:
    """An immutable route table; ``match`` is the data plane's per-request lookup."""

    __slots__ = ("_any", "_exact", "_wildcard", "default_backend", "rules")

    def __init__(self, rules: Iterable[RouteRule] = (), default_backend: str | None = None) -> None:
        exact: dict[str, list[_PathRule]] = {}
        wildcard: dict[str, list[_PathRule]] = {}
        any_host: list[_PathRule] = []
        kept: list[RouteRule] = []
        for rule in rules:
            compiled = _compile_rule(rule)
            kept.append(rule)
            if rule.host is None or rule.host == "":
                any_host.append(compiled)
                continue
            host = rule.host.lower()
            if host.startswith("*."):
                wildcard.setdefault(host[2:], []).append(compiled)
            elif "*" in host:
                raise RouteError(f"a wildcard host must be '*.domain', got {rule.host!r}")
            else:
                exact.setdefault(host, []).append(compiled)
        self._exact = {h: _compile(r) for h, r in exact.items()}
        self._wildcard = {h: _compile(r) for h, r in wildcard.items()}
        self._any = _compile(any_host)
        self.default_backend = default_backend
        self.rules: tuple[RouteRule, ...] = tuple(kept)

    @classmethod
    def from_update(cls, update: RoutesUpdate) -> RouteTable:
        return cls(update.rules, update.default_backend)

    def match(self, host: str, path: str) -> str | None:
        """The service for a request, or None (-> 404).

        ``host`` is the Host header as received (port and case are normalised here);
        ``path`` is the request path without its query string.
        """
        if host:
            host = normalize_host(host)
            rules = self._exact.get(host)
            if rules is not None:
                found = _first(rules, path)
                if found is not None:
                    return found
            if self._wildcard:
                dot = host.find(".")
                if dot > 0:
                    rules = self._wildcard.get(host[dot + 1 :])
                    if rules is not None:
                        found = _first(rules, path)
                        if found is not None:
                            return found
        found = _first(self._any, path)
        if found is not None:
            return found
        return self.default_backend

    @property
    def services(self) -> frozenset[str]:
        """Every service a rule or the default backend names."""
        names = {r.service for r in self.rules}
        if self.default_backend is not None:
            names.add(self.default_backend)
        return frozenset(names)

    def __repr__(self) -> str:
        return f"RouteTable({len(self.rules)} rules, default_backend={self.default_backend!r})"


def _compile_rule(rule: RouteRule) -> _PathRule:
    if rule.path_type not in PATH_TYPES:
        raise RouteError(
            f"path_type must be one of Exact, Prefix, ImplementationSpecific, got {rule.path_type!r}"
        )
    if not rule.path.startswith("/"):
        raise RouteError(f"path must start with '/', got {rule.path!r}")
    if rule.path_type == "Exact":
        return _PathRule(True, rule.path, rule.service)
    return _PathRule(False, rule.path.rstrip("/"), rule.service)
