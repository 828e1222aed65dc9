"""Ingress ``spec.tls`` -> the certificates the TLS listener serves (Secrets of type
``kubernetes.io/tls``, keys ``tls.crt``/``tls.key``), and the hosts that fall back to the
default certificate, each with its reason.

:func:`resolve` is the pure rule. :class:`IngressCertificates` feeds it from a watch of the
TLS Secrets (a field selector: no other Secret reaches the gateway) and the Ingresses the
discovery sees, and streams :class:`~gateway.dataplane.updates.CertificatesUpdate`. A Secret
is only ever looked up in its Ingress's namespace.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.dataplane.tls import TlsError, covers, load_pem_certificate
from gateway.dataplane.updates import CertificatesUpdate, PemCertificate
from gateway.platforms.kubernetes.api import KubeApi, Reflector
from gateway.platforms.kubernetes.ingress_rules import Problem, is_ours
from gateway.platforms.kubernetes.model import (
    TLS_SECRET_TYPE,
    Ingress,
    KubeError,
    NotFound,
    Secret,
)

log = logging.getLogger(__name__)

REASON = "TLSCertificate"
"""The reason of the Warning Events recorded for a host served with the default certificate."""
CERT_KEY, KEY_KEY = "tls.crt", "tls.key"


@dataclass(frozen=True, slots=True)
class Checked:
    """A TLS Secret's content as checked once per resourceVersion: the certificate's own DNS
    names, or why it cannot be served."""

    hosts: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TlsResolution:
    certificates: tuple[PemCertificate, ...] = ()
    hosts: Mapping[str, str] = field(default_factory=dict)
    """Every Ingress host of ours -> ``secret ns/name``, or ``default: <why>``."""
    problems: tuple[Problem, ...] = ()


def check_secret(secret: Secret) -> Checked:
    """Whether ``secret`` holds a usable certificate and key (PEM, matching)."""
    missing = [k for k in (CERT_KEY, KEY_KEY) if not secret.data.get(k)]
    if missing:
        return Checked(error=f"has no {' or '.join(missing)}")
    try:
        cert = load_pem_certificate(
            f"secret {secret.meta.key}", secret.data[CERT_KEY], secret.data[KEY_KEY]
        )
    except TlsError as e:
        return Checked(error=str(e).partition(": ")[2] or str(e))
    return Checked(hosts=cert.hosts)


def resolve(
    ingresses: Iterable[Ingress],
    ingress_class: str,
    secrets: Mapping[str, Secret],
    checked: Mapping[str, Checked],
    absent: Mapping[str, str] | None = None,
) -> TlsResolution:
    """Which certificate serves each host of our Ingresses.

    ``secrets``: the TLS Secrets by ``namespace/name``; ``checked``: each one's
    :func:`check_secret`; ``absent``: why a referenced Secret is not among them (``not
    found``, or its other type). The older Ingress (creationTimestamp, then name) wins a host
    two of them claim. A host is reported when its entry's Secret cannot be served, when the
    certificate does not name it, or when its Ingress has ``spec.tls`` but no entry names it;
    an Ingress without ``spec.tls`` is plain HTTP (its hosts get the default certificate,
    unreported)."""
    absent = absent or {}
    ours = sorted(
        (i for i in ingresses if is_ours(i, ingress_class)), key=lambda i: (i.created, i.meta.key)
    )
    claimed: dict[str, str] = {}
    served: dict[str, list[str]] = {}
    fallback: dict[str, str] = {}
    problems: list[Problem] = []

    def fall_back(ing: Ingress, host: str, why: str, report: bool = True) -> None:
        if host not in claimed:
            fallback.setdefault(host, why)
        if report:
            problems.append(
                Problem(
                    ing.meta.key,
                    f"host {host}: {why}; served with the default certificate",
                    REASON,
                )
            )

    for ing in ours:
        rule_hosts = [r.host for r in ing.rules if r.host]
        named: set[str] = set()
        for i, entry in enumerate(ing.tls):
            hosts = list(entry.hosts)
            named.update(hosts)
            if entry.secret_name is None:
                for host in hosts:
                    fall_back(ing, host, f"spec.tls[{i}] names no secretName", report=False)
                continue
            if "/" in entry.secret_name:
                for host in hosts or rule_hosts:
                    fall_back(
                        ing,
                        host,
                        f"spec.tls[{i}].secretName {entry.secret_name!r}: only Secrets of the "
                        f"Ingress's namespace ({ing.meta.namespace}) are read",
                    )
                continue
            key = f"{ing.meta.namespace}/{entry.secret_name}"
            secret, verdict = secrets.get(key), checked.get(key)
            why = None
            if secret is None:
                why = f"secret {key} {absent.get(key, 'not found')}"
            elif verdict is None or verdict.error is not None:
                why = f"secret {key}: {verdict.error if verdict else 'not checked yet'}"
            if why is not None:
                for host in hosts or rule_hosts:
                    fall_back(ing, host, why)
                continue
            assert secret is not None and verdict is not None
            if not hosts:  # an entry without hosts serves the certificate's own names
                hosts = [h for h in rule_hosts if covers(verdict.hosts, h)] or list(verdict.hosts)
                named.update(hosts)
            for host in hosts:
                if not covers(verdict.hosts, host):
                    fall_back(
                        ing,
                        host,
                        f"the certificate in secret {key} does not name it (it names "
                        f"{', '.join(verdict.hosts) or 'no host'})",
                    )
                    continue
                owner = claimed.get(host)
                if owner is None:
                    claimed[host] = key
                    served.setdefault(key, []).append(host)
                    fallback.pop(host, None)
                elif owner != key:
                    problems.append(
                        Problem(
                            ing.meta.key,
                            f"host {host}: served with secret {owner} (an older Ingress's); "
                            f"secret {key} is not used for it",
                            REASON,
                        )
                    )
        for host in rule_hosts:
            if host in named:
                continue
            if ing.tls:
                fall_back(ing, host, "no spec.tls entry names it")
            else:
                fall_back(ing, host, "the Ingress has no spec.tls", report=False)
    certificates = tuple(
        PemCertificate(
            f"secret {key}", tuple(hosts), secrets[key].data[CERT_KEY], secrets[key].data[KEY_KEY]
        )
        for key, hosts in sorted(served.items())
    )
    report = {h: f"secret {k}" for h, k in claimed.items()}
    for host, why in fallback.items():
        report.setdefault(host, f"default: {why}")
    return TlsResolution(certificates, dict(sorted(report.items())), tuple(problems))


class IngressCertificates:
    """The TLS Secrets of ``namespaces`` (empty: all) from a watch, resolved against the
    Ingresses :meth:`set_ingresses` is given; :meth:`certificates` streams the result."""

    def __init__(self, api: KubeApi, namespaces: Sequence[str], ingress_class: str) -> None:
        self.api = api
        self.ingress_class = ingress_class
        scopes: list[str | None] = list(namespaces) or [None]
        self._watches: list[Reflector[Secret]] = [api.watch_tls_secrets(ns) for ns in scopes]
        self._secrets: list[dict[str, Secret]] = [{} for _ in scopes]
        self._synced = [False] * len(scopes)
        self._ingresses: list[Ingress] | None = None
        self._checked: dict[str, tuple[str, Checked]] = {}
        """Secret key -> (resourceVersion, verdict): each version is parsed once."""
        self._absent: dict[str, str] = {}
        """Referenced Secrets the watch does not hold -> why (one GET each, until seen)."""
        self.resolution = TlsResolution()
        self._version = 0
        self._changed = asyncio.Condition()
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return (
            f"IngressCertificates(certificates={len(self.resolution.certificates)}, "
            f"problems={len(self.resolution.problems)}, synced={self.synced})"
        )

    @property
    def synced(self) -> bool:
        return self._ingresses is not None and all(self._synced)

    def watches(self) -> list[Reflector[Secret]]:
        """The Secret watches, for the discovery to follow (:meth:`follow`) under supervision."""
        return list(self._watches)

    async def follow(self, i: int, watch: Reflector[Secret]) -> AsyncIterator[bool]:
        """Consume one watch's snapshots; after each, whether the problems changed."""
        async for snapshot in watch.snapshots():
            self._secrets[i] = snapshot
            self._synced[i] = True
            yield await self.recompute()

    async def set_ingresses(self, ingresses: list[Ingress]) -> bool:
        """The Ingresses changed; whether the problems changed."""
        self._ingresses = ingresses
        return await self.recompute()

    async def recompute(self) -> bool:
        """Resolve again; True when the problems changed (the caller reports them)."""
        if not self.synced:
            return False
        async with self._lock:
            secrets = {k: v for part in self._secrets for k, v in part.items()}
            checked = {key: self._check(secret) for key, secret in secrets.items()}
            self._checked = {k: v for k, v in self._checked.items() if k in secrets}
            await self._probe_absent(secrets)
            assert self._ingresses is not None
            new = resolve(self._ingresses, self.ingress_class, secrets, checked, self._absent)
            old, self.resolution = self.resolution, new
            if new.certificates != old.certificates or not self._version:
                async with self._changed:
                    self._version += 1
                    self._changed.notify_all()
            return new.problems != old.problems

    def _check(self, secret: Secret) -> Checked:
        seen = self._checked.get(secret.meta.key)
        if seen is not None and seen[0] == secret.meta.resource_version:
            return seen[1]
        verdict = check_secret(secret)
        self._checked[secret.meta.key] = (secret.meta.resource_version, verdict)
        return verdict

    def _referenced(self) -> set[str]:
        out = set()
        for ing in self._ingresses or ():
            if is_ours(ing, self.ingress_class):
                for entry in ing.tls:
                    if entry.secret_name and "/" not in entry.secret_name:
                        out.add(f"{ing.meta.namespace}/{entry.secret_name}")
        return out

    async def _probe_absent(self, secrets: Mapping[str, Secret]) -> None:
        """One GET per referenced Secret the watch does not hold: missing, or of another
        type (the watch only sees ``kubernetes.io/tls``)."""
        wanted = self._referenced() - secrets.keys()
        self._absent = {k: v for k, v in self._absent.items() if k in wanted}
        for key in sorted(wanted - self._absent.keys()):
            namespace, _, name = key.partition("/")
            try:
                found = await self.api.get_secret(namespace, name)
            except NotFound:
                self._absent[key] = "not found"
                continue
            except KubeError as e:
                log.warning("secret %s: cannot read it to tell why it is not usable: %s", key, e)
                self._absent[key] = "not found among the kubernetes.io/tls Secrets"
                continue
            if found.type != TLS_SECRET_TYPE:
                self._absent[key] = f"is of type {found.type}, not {TLS_SECRET_TYPE}"
            else:  # created since the watch's last event: it will arrive through it
                self._absent[key] = "not seen by the watch yet"

    async def certificates(self) -> AsyncIterator[CertificatesUpdate]:
        """The whole certificate set once Secrets and Ingresses are known, then on change."""
        seen = 0
        while True:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._newer, seen))
                seen = self._version
            yield CertificatesUpdate(self.resolution.certificates)

    def _newer(self, seen: int) -> bool:
        return self._version > seen

    def report(self) -> dict[str, object]:
        """For the platform's report: each host's certificate and the problems."""
        return {
            "synced": self.synced,
            "watch_errors": [w.last_error for w in self._watches if w.last_error],
            "hosts": dict(self.resolution.hosts),
            "problems": [f"ingress {p.ingress}: {p.message}" for p in self.resolution.problems],
        }
