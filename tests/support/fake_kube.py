"""An HTTP-level fake Kubernetes API server for tests, driven by the real ``kubernetes`` client.

It follows the API's semantics where Sluice depends on them:

* every object carries ``metadata.resourceVersion`` from one global counter; lists carry the
  collection's resourceVersion;
* ``?watch=true`` streams newline-delimited JSON events (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR)
  with chunked encoding, from a resourceVersion; a resourceVersion older than the compacted
  history gets an ERROR event carrying a ``Status`` with code 410, reason ``Expired``;
* 404 ``NotFound``, 409 ``Conflict`` for a stale ``metadata.resourceVersion`` on update/patch
  and ``AlreadyExists`` on create, 415 for patch types it does not speak, 422 ``Invalid``;
* subresources ``/status`` (only status changes), ``/scale`` (autoscaling/v1 Scale of a
  Deployment/StatefulSet), ``/resize`` (only container resources of a Pod may change there, the
  QoS class may not change; a plain Pod update that changes resources is 422);
* merge-patch and strategic-merge-patch (lists of named objects merged by ``name``), json-patch;
* ``metrics.k8s.io/v1beta1`` PodMetrics as metrics-server serves them (``fake_kube_metrics``:
  404 when not installed, 503 when down, new pods absent);
* Secrets (``type`` defaulted and immutable, ``stringData``, base64 ``data``, TLS keys) and
  ``fieldSelector`` on list/watch (``fake_kube_secrets``).

The rules themselves (patch types, QoS, resize, validation) are in ``fake_kube_rules``.
The test control API is plain Python on :class:`FakeKube` (the server runs in a thread of the
test process): put/remove objects, drop watch connections, compact history, play the kubelet
for resizes, and ``requests`` records every call as (verb, apiGroup, resource[/sub]).
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support import fake_kube_metrics
from tests.support.fake_kube_crd import CustomResource, register, table, validate_object
from tests.support.fake_kube_rules import (
    ApiError,
    Obj,
    check_pod_update,
    check_resize,
    check_resize_admission,
    cpu_millis,
    json_patch,
    labels_match,
    merge_patch,
    qos_class,
    validate,
)
from tests.support.fake_kube_secrets import (
    check_field_selector,
    check_secret_update,
    fields_match,
    secret_stored,
)

__all__ = ["Call", "FakeKube", "qos_class"]

# (group/version path prefix, plural) -> (kind, apiGroup)
RESOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("apis/networking.k8s.io/v1", "ingresses"): ("Ingress", "networking.k8s.io"),
    ("apis/discovery.k8s.io/v1", "endpointslices"): ("EndpointSlice", "discovery.k8s.io"),
    ("apis/apps/v1", "deployments"): ("Deployment", "apps"),
    ("apis/apps/v1", "statefulsets"): ("StatefulSet", "apps"),
    ("apis/coordination.k8s.io/v1", "leases"): ("Lease", "coordination.k8s.io"),
    ("api/v1", "pods"): ("Pod", ""),
    ("api/v1", "services"): ("Service", ""),
    ("api/v1", "secrets"): ("Secret", ""),
    ("api/v1", "events"): ("Event", ""),
    ("api/v1", "nodes"): ("Node", ""),
    ("apis/apiextensions.k8s.io/v1", "customresourcedefinitions"): (
        "CustomResourceDefinition",
        "apiextensions.k8s.io",
    ),
}
CLUSTER_SCOPED = ("nodes", "customresourcedefinitions")
"""Served only without a namespace in the path (``/api/v1/nodes``), as the API server does."""
_PATH = re.compile(
    r"^/(?P<gv>api/v1|apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


@dataclass(frozen=True)
class Call:
    """One request as RBAC sees it."""

    verb: str
    api_group: str
    resource: str
    """``plural`` or ``plural/subresource``."""
    namespace: str | None
    name: str | None
    content_type: str | None = None
    resource_version: str | None = None
    """The ``resourceVersion`` query parameter of a list/watch."""
    authorization: str | None = None
    field_manager: str | None = None
    """The ``fieldManager`` query parameter of a write."""


class FakeKube:
    """The fake API server's state plus its test control API.  Use as a context manager."""

    def __init__(self, bookmark_interval_s: float = 60.0) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.objects: dict[tuple[str, str | None, str], Obj] = {}
        self.history: list[tuple[int, str, str, Obj]] = []
        self.compacted_rv = 0
        self.watch_epoch = 0
        self.stopping = False
        self.bookmark_interval_s = bookmark_interval_s
        self.requests: list[Call] = []
        self.failures: dict[tuple[str, str], list[ApiError]] = {}
        self.streaming: dict[str, int] = {}
        self.node_cpu: dict[str, str] = {}
        """Allocatable CPU per node name: a resize that does not fit is refused with 403."""
        self.forbidden_left = 0
        """Requests still answered 403 (as right after an API-server restart)."""
        self.metrics_server = "absent"
        """``metrics.k8s.io``: ``absent`` (404), ``down`` (503) or ``up``."""
        self.pod_cpu: dict[tuple[str, str], dict[str, str]] = {}
        """What metrics-server measured: (namespace, pod) -> container -> cpu quantity; a
        Running pod without an entry is new (absent from PodMetrics lists)."""
        self.watch_lifetime_s: float | None = None
        """When set, every watch ends cleanly after this long (0: at once, with no events)."""
        handler = type("Handler", (_Handler,), {"fake": self})
        self.resources = dict(RESOURCES)
        """(group/version path, plural) -> (kind, group): built-ins plus installed CRDs'."""
        self.custom: dict[str, CustomResource] = {}
        """plural -> the custom resource a CRD serves."""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeKube:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    # ---- control API -------------------------------------------------------------------------

    def put(self, obj: Obj) -> Obj:
        """Create or replace an object as a controller would (status included)."""
        plural = self.plural_of(obj)
        meta = obj.setdefault("metadata", {})
        key = (plural, meta.get("namespace"), meta["name"])
        obj = self.validated(plural, obj)
        with self.cond:
            old = self.objects.get(key)
            if old is not None and plural == "secrets":
                check_secret_update(old, obj)
            return self._store(key, copy.deepcopy(obj), "MODIFIED" if old else "ADDED", old)

    def get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        with self.cond:
            obj = self.objects.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def remove(self, plural: str, namespace: str | None, name: str) -> None:
        with self.cond:
            obj = self.objects.pop((plural, namespace, name))
            self._record("DELETED", plural, obj, bump=True)

    def list(self, plural: str) -> list[Obj]:
        with self.cond:
            return [copy.deepcopy(o) for (p, _, _), o in self.objects.items() if p == plural]

    def fail(self, verb: str, resource: str, code: int = 500, times: int = 1) -> None:
        """Answer the next ``times`` requests of ``verb`` on ``resource`` with an error Status."""
        reason = {500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests"}.get(
            code, "Failure"
        )
        with self.cond:
            self.failures.setdefault((verb, resource), []).extend(
                ApiError(code, reason, f"injected failure {code}") for _ in range(times)
            )

    def restart(self, forbidden_requests: int = 3) -> None:
        """Play an API-server restart: every watch is cut, and the next ``forbidden_requests``
        requests get 403 Forbidden (the authorizer's caches are not warm yet)."""
        with self.cond:
            self.forbidden_left = forbidden_requests
        self.drop_watches()

    def drop_watches(self) -> None:
        """Cut every open watch connection without a clean end (as a network failure does)."""
        with self.cond:
            self.watch_epoch += 1
            self.cond.notify_all()

    def compact(self) -> None:
        """Compact history past every resourceVersion handed out so far: open watches and any
        watch from an older resourceVersion get an ERROR event with 410 Expired; a relist works."""
        with self.cond:
            self.rv += 1
            self.compacted_rv = self.rv
            self.history.clear()
            self.cond.notify_all()

    def open_watches(self, plural: str) -> int:
        """Watches of ``plural`` currently streaming."""
        with self.cond:
            return self.streaming.get(plural, 0)

    def kubelet_resize(self, namespace: str, name: str, outcome: str = "apply") -> None:
        """Play the kubelet: ``apply`` the desired resources to status, or mark the resize
        ``Infeasible``/``Deferred`` with a PodResizePending condition."""
        with self.cond:
            key = ("pods", namespace, name)
            pod = copy.deepcopy(self.objects[key])
            status = pod.setdefault("status", {})
            conditions = [
                c
                for c in status.get("conditions", [])
                if c["type"] not in ("PodResizePending", "PodResizeInProgress")
            ]
            if outcome == "apply":
                by_name = {c["name"]: c for c in pod["spec"]["containers"]}
                for cs in status.setdefault("containerStatuses", []):
                    if cs["name"] in by_name:
                        cs["resources"] = copy.deepcopy(by_name[cs["name"]].get("resources", {}))
            else:
                conditions.append(
                    {
                        "type": "PodResizePending",
                        "status": "True",
                        "reason": outcome,
                        "message": f"Node didn't have enough capacity: cpu ({outcome})",
                    }
                )
            status["conditions"] = conditions
            self._store(key, pod, "MODIFIED", self.objects[key])

    def plural_of(self, obj: Obj) -> str:
        kind = obj["kind"]
        for (_, plural), (k, _) in self.resources.items():
            if k == kind:
                return plural
        raise ValueError(f"fake API does not serve kind {kind}")

    def gv_of(self, plural: str) -> tuple[str, str, str]:
        for (gv, p), (kind, group) in self.resources.items():
            if p == plural:
                api_version = gv.removeprefix("apis/").removeprefix("api/")
                return api_version, kind, group
        raise KeyError(plural)

    def validated(self, plural: str, obj: Obj) -> Obj:
        """``obj`` as stored: checked, and for a custom resource pruned and typed by its schema;
        installing a CRD serves its resources from then on."""
        validate(plural, obj)
        if plural == "secrets":
            return secret_stored(obj)
        cr = self.custom.get(plural)
        if cr is not None:
            return validate_object(cr, obj)
        if plural == "customresourcedefinitions":
            for served in register(obj):
                with self.cond:
                    self.custom[served.plural] = served
                    self.resources[(f"apis/{served.group}/{served.version}", served.plural)] = (
                        served.kind,
                        served.group,
                    )
        return obj

    # ---- internals (cond held) ---------------------------------------------------------------

    def _store(self, key: tuple[str, str | None, str], obj: Obj, kind: str, old: Obj | None) -> Obj:
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4()))
        meta.setdefault(
            "creationTimestamp",
            (old or {}).get("metadata", {}).get("creationTimestamp")
            or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        if key[1] is not None:
            meta["namespace"] = key[1]
        if key[0] in _GENERATION or key[0] in self.custom:
            old_gen = int((old or {}).get("metadata", {}).get("generation") or 0)
            if old is None:
                meta["generation"] = int(meta.get("generation") or 1)
            elif old.get("spec") != obj.get("spec"):
                meta["generation"] = old_gen + 1  # a spec change (a resize too) bumps it
            else:
                meta["generation"] = old_gen
        self.objects[key] = obj
        self._record(kind, key[0], obj, bump=False)
        return copy.deepcopy(obj)

    def _record(self, kind: str, plural: str, obj: Obj, bump: bool) -> None:
        if bump:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, plural, kind, copy.deepcopy(obj)))
        self.cond.notify_all()


_GENERATION = ("pods", "deployments", "statefulsets", "ingresses")
"""Kinds whose metadata.generation counts spec changes."""


class _Handler(BaseHTTPRequestHandler):
    fake: FakeKube
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # ------------------------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        m = _PATH.match(url.path)
        if m and m["gv"] == "apis/metrics.k8s.io/v1beta1":
            self._metrics(m["ns"], m["plural"], m["name"], query)
            return
        if not m or (m["gv"], m["plural"]) not in self.fake.resources:
            self._send(
                404, ApiError(404, "NotFound", f"the server could not find {url.path}").status()
            )
            return
        gv, ns, plural, name, sub = m["gv"], m["ns"], m["plural"], m["name"], m["sub"]
        custom = self.fake.custom.get(plural)
        if (ns is not None and plural in CLUSTER_SCOPED) or (
            custom is not None and custom.namespaced and ns is None and method != "GET"
        ):
            self._send(
                404, ApiError(404, "NotFound", f"the server could not find {url.path}").status()
            )
            return
        _, group = self.fake.resources[(gv, plural)]
        watch = query.get("watch") in ("true", "1")
        verb = {
            "GET": "get" if name else ("watch" if watch else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete",
        }[method]
        call = Call(
            verb,
            group,
            f"{plural}/{sub}" if sub else plural,
            ns,
            name,
            self.headers.get("Content-Type"),
            query.get("resourceVersion"),
            self.headers.get("Authorization"),
            query.get("fieldManager"),
        )
        fake = self.fake
        with fake.cond:
            fake.requests.append(call)
            queued = fake.failures.get((verb, call.resource))
            injected = queued.pop(0) if queued else None
            if injected is None and fake.forbidden_left > 0:
                fake.forbidden_left -= 1
                injected = ApiError(
                    403,
                    "Forbidden",
                    f'{call.resource} is forbidden: User "system:serviceaccount:sluice:sluice" '
                    "cannot "
                    f'{verb} resource "{call.resource}" in API group "{group}"',
                )
        try:
            if injected:
                raise injected
            body = json.loads(raw) if raw else None
            if verb == "watch":
                self._watch(plural, ns, query)
                return
            code, out = self._handle(verb, plural, ns, name, sub, body, query)
        except ApiError as e:
            self._send(e.code, e.status())
            return
        except (ValueError, KeyError, TypeError, IndexError) as e:
            self._send(400, ApiError(400, "BadRequest", f"bad request: {e}").status())
            return
        self._send(code, out)

    def _metrics(
        self, ns: str | None, plural: str, name: str | None, query: dict[str, str]
    ) -> None:
        fake = self.fake
        watch = query.get("watch") in ("true", "1")
        with fake.cond:
            fake.requests.append(
                Call(
                    "get" if name else ("watch" if watch else "list"),
                    "metrics.k8s.io",
                    plural,
                    ns,
                    name,
                )
            )
            pods = [copy.deepcopy(o) for (p, _, _), o in fake.objects.items() if p == "pods"]
            usage = copy.deepcopy(fake.pod_cpu)
            state = fake.metrics_server
        try:
            if plural != "pods" and state == "up":
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            body = fake_kube_metrics.answer(state, pods, usage, ns, name, query)
        except ApiError as e:
            self._send(e.code, e.status())
            return
        self._send(200, body)

    def _send(self, code: int, obj: Obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(
        self,
        verb: str,
        plural: str,
        ns: str | None,
        name: str | None,
        sub: str | None,
        body: Any,
        query: dict[str, str],
    ) -> tuple[int, Obj]:
        fake = self.fake
        api_version, kind, _ = fake.gv_of(plural)
        custom = fake.custom.get(plural)
        with fake.cond:
            if verb == "list":
                check_field_selector(plural, query.get("fieldSelector"))
                items = [
                    copy.deepcopy(o)
                    for (p, n, _), o in sorted(fake.objects.items(), key=lambda kv: kv[0][2])
                    if p == plural
                    and (ns is None or n == ns)
                    and labels_match(o, query.get("labelSelector"))
                    and fields_match(o, query.get("fieldSelector"))
                ]
                if custom is not None and "as=Table" in (self.headers.get("Accept") or ""):
                    return 200, table(custom, items, str(fake.rv))
                return 200, {
                    "kind": f"{kind}List",
                    "apiVersion": api_version,
                    "metadata": {"resourceVersion": str(fake.rv)},
                    "items": items,
                }
            if verb == "create":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "body must be an object")
                meta = body.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                if not meta.get("name"):
                    raise ApiError(422, "Invalid", f"{kind}: metadata.name: Required value")
                key = (plural, ns, meta["name"])
                if key in fake.objects:
                    raise ApiError(
                        409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists'
                    )
                meta.pop("resourceVersion", None)
                body.setdefault("kind", kind)
                body.setdefault("apiVersion", api_version)
                if custom is not None and custom.status_subresource:
                    body.pop("status", None)  # set only through /status
                body = fake.validated(plural, body)
                return 201, fake._store(key, body, "ADDED", None)
            assert name is not None
            key = (plural, ns, name)
            current = fake.objects.get(key)
            if current is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            if sub == "scale":
                return self._scale(verb, key, current, body)
            if verb == "get":
                return 200, copy.deepcopy(current)
            if verb == "delete":
                del fake.objects[key]
                fake._record("DELETED", plural, current, bump=True)
                return 200, copy.deepcopy(current)
            new = self._updated(verb, current, body)
            if sub == "status":
                new = {**copy.deepcopy(current), "status": new.get("status", {})}
            elif sub == "resize":
                if plural != "pods":
                    raise ApiError(404, "NotFound", "resize is a pod subresource")
                check_resize(current, new)
                node = (current.get("spec") or {}).get("nodeName")
                allocatable = fake.node_cpu.get(node) if node else None
                node_obj = fake.objects.get(("nodes", None, node)) if node else None
                if allocatable is None and node_obj is not None:
                    allocatable = (node_obj.get("status") or {}).get("allocatable", {}).get("cpu")
                others = sum(
                    cpu_millis(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
                    for (p, _, n), o in fake.objects.items()
                    if p == "pods" and n != name and (o.get("spec") or {}).get("nodeName") == node
                    for c in (o.get("spec") or {}).get("containers", [])
                )
                check_resize_admission(
                    current, new, cpu_millis(allocatable) if allocatable else None, others
                )
                new = {**copy.deepcopy(current), "spec": new["spec"]}
            elif sub is None:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                elif custom is not None and custom.status_subresource:
                    new.pop("status", None)
                if plural == "pods":
                    check_pod_update(current, new)
            else:
                raise ApiError(404, "NotFound", f"no subresource {sub}")
            new = fake.validated(plural, new)
            if plural == "secrets":
                check_secret_update(current, new)
            return 200, fake._store(key, new, "MODIFIED", current)

    def _updated(self, verb: str, current: Obj, body: Any) -> Obj:
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if verb == "update":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "body must be an object")
            new = copy.deepcopy(body)
        elif ctype == "application/merge-patch+json":
            new = merge_patch(current, body)
        elif ctype == "application/strategic-merge-patch+json":
            new = merge_patch(current, body, strategic=True)
        elif ctype == "application/json-patch+json":
            new = json_patch(current, body)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {ctype}",
            )
        sent_rv = (new.get("metadata") or {}).get("resourceVersion")
        if verb == "update" and sent_rv is None:
            sent_rv = current["metadata"]["resourceVersion"]
        if sent_rv is not None and sent_rv != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {current["kind"]} "{current["metadata"]["name"]}": '
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        new["metadata"] = {**new.get("metadata", {}), "uid": current["metadata"].get("uid")}
        new["kind"], new["apiVersion"] = current["kind"], current["apiVersion"]
        return new

    def _scale(
        self, verb: str, key: tuple[str, str | None, str], current: Obj, body: Any
    ) -> tuple[int, Obj]:
        if key[0] not in ("deployments", "statefulsets"):
            raise ApiError(404, "NotFound", "scale is served for deployments and statefulsets")

        def scale_of(obj: Obj) -> Obj:
            sel = obj["spec"].get("selector", {}).get("matchLabels", {})
            return {
                "kind": "Scale",
                "apiVersion": "autoscaling/v1",
                "metadata": {
                    "name": obj["metadata"]["name"],
                    "namespace": obj["metadata"]["namespace"],
                    "resourceVersion": obj["metadata"]["resourceVersion"],
                    "uid": obj["metadata"]["uid"],
                },
                "spec": {"replicas": obj["spec"].get("replicas", 1)},
                "status": {
                    "replicas": obj.get("status", {}).get("replicas", 0),
                    "selector": ",".join(f"{k}={v}" for k, v in sorted(sel.items())),
                },
            }

        scale = scale_of(current)
        if verb == "get":
            return 200, scale
        if verb not in ("patch", "update"):
            raise ApiError(405, "MethodNotAllowed", f"{verb} is not allowed on scale")
        new_scale = self._updated(verb, {**scale, "kind": "Scale"}, body)
        replicas = new_scale.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, "Invalid", f"Scale.spec.replicas: Invalid value: {replicas!r}")
        new = copy.deepcopy(current)
        new["spec"]["replicas"] = replicas
        stored = self.fake._store(key, new, "MODIFIED", current)
        return 200, scale_of(stored)

    def _watch(self, plural: str, ns: str | None, query: dict[str, str]) -> None:
        fake = self.fake
        selector = query.get("labelSelector")
        field_selector = query.get("fieldSelector")
        check_field_selector(plural, field_selector)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        timeout_s = float(query.get("timeoutSeconds") or 1800)
        if fake.watch_lifetime_s is not None:
            timeout_s = min(timeout_s, fake.watch_lifetime_s)
        deadline = time.monotonic() + timeout_s
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True

        def matches(p: str, obj: Obj) -> bool:
            return (
                p == plural
                and (ns is None or obj["metadata"].get("namespace") == ns)
                and labels_match(obj, selector)
                and fields_match(obj, field_selector)
            )

        with fake.cond:
            epoch = fake.watch_epoch
            rv_param = query.get("resourceVersion") or "0"
            pending: list[Obj] = []
            if rv_param == "0":
                pending = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for (p, _, _), o in fake.objects.items()
                    if matches(p, o)
                ]
                since = fake.rv
            else:
                since = int(rv_param)
                if since < fake.compacted_rv:
                    err = ApiError(
                        410,
                        "Expired",
                        f"too old resource version: {since} ({fake.compacted_rv})",
                    )
                    pending = [{"type": "ERROR", "object": err.status()}]
                    since = -1
        if since < 0:
            self._chunks(pending)
            self._chunks(None)
            return
        with fake.cond:
            fake.streaming[plural] = fake.streaming.get(plural, 0) + 1
        try:
            self._stream(plural, since, pending, epoch, deadline, bookmarks, matches)
        finally:
            with fake.cond:
                fake.streaming[plural] -= 1

    def _stream(
        self,
        plural: str,
        since: int,
        pending: list[Obj],
        epoch: int,
        deadline: float,
        bookmarks: bool,
        matches: Any,
    ) -> None:
        fake = self.fake
        try:
            last_bookmark = time.monotonic()
            while True:
                if pending:
                    self._chunks(pending)
                    pending = []
                with fake.cond:
                    while True:
                        if fake.stopping:
                            break
                        if since < fake.compacted_rv:
                            err = ApiError(
                                410,
                                "Expired",
                                f"too old resource version: {since} ({fake.compacted_rv})",
                            )
                            pending = [{"type": "ERROR", "object": err.status()}]
                            since = -1
                            break
                        if fake.watch_epoch != epoch:
                            # a dropped connection: no terminating chunk
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        new = [
                            (rv, kind, o)
                            for rv, p, kind, o in fake.history
                            if rv > since and matches(p, o)
                        ]
                        if new:
                            pending = [{"type": kind, "object": o} for _, kind, o in new]
                            since = new[-1][0]
                            break
                        now = time.monotonic()
                        if now >= deadline:
                            break
                        if bookmarks and now - last_bookmark >= fake.bookmark_interval_s:
                            since = max(since, fake.rv)
                            pending = [
                                {
                                    "type": "BOOKMARK",
                                    "object": {
                                        "kind": fake.gv_of(plural)[1],
                                        "apiVersion": fake.gv_of(plural)[0],
                                        "metadata": {"resourceVersion": str(since)},
                                    },
                                }
                            ]
                            last_bookmark = now
                            break
                        fake.cond.wait(min(0.2, deadline - now))
                if not pending:
                    break
                if since < 0:
                    self._chunks(pending)
                    break
            self._chunks(None)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return

    def _chunks(self, events: list[Obj] | None) -> None:
        if events is None:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        for ev in events:
            data = json.dumps(ev).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
