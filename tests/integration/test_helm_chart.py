"""charts/sluice, checked with the Helm v4 SDK (helm-python-sdk, no helm binary).

Lint clean; rendered with the defaults and every charts/sluice/ci/*-values.yaml; each
manifest parsed and checked: kinds, labels and selectors, probes on the admin port's real
paths, security context, grace period, RBAC equal to the Kubernetes module's
``RBAC_RULES``, and the ConfigMap accepted by ``sluice check``.
"""

from __future__ import annotations

import base64
import importlib
import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.support.dockerfile import parse_dockerfile
from tests.support.k8s_fields import field_errors

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluice"
VALUE_SETS = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE, NAMESPACE = "gw", "edge"
NAME_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance")
COMMON_LABELS = (*NAME_LABELS, "app.kubernetes.io/managed-by", "helm.sh/chart")
NAMESPACED = {
    "ConfigMap",
    "Secret",
    "Deployment",
    "PodDisruptionBudget",
    "Role",
    "RoleBinding",
    "Service",
    "ServiceAccount",
    "ServiceMonitor",
    "HorizontalPodAutoscaler",
    "PrometheusRule",
    "NetworkPolicy",
}
TOKEN = "testtoken0123456789abcdefghijklmnopqrstuv"
"""adminToken.value for renders that do not set adminToken (the chart requires one)."""
CRDS = {"ServiceMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1"}
Manifest = dict[str, Any]


def _values(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    return data or {}


def _render(values: dict[str, Any]) -> list[Manifest]:
    values = {"adminToken": {"value": TOKEN}} | values
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                doc["__template__"] = template
                docs.append(doc)
    return docs


@pytest.fixture(scope="module", params=VALUE_SETS, ids=lambda p: p.stem)
def case(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[Manifest]]:
    """(effective values, rendered manifests) for one ci value set."""
    values = _values(request.param)
    with helm.Chart.load(CHART) as chart:
        merged = chart.merge_values(values)
    return merged, _render(values)


def _kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[Manifest], kind: str) -> Manifest:
    found = _kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _config_map(docs: list[Manifest]) -> Manifest:
    """The ConfigMap with Sluice's config (the dashboard's is another one)."""
    (found,) = [d for d in docs if d["__template__"].endswith("/configmap.yaml")]
    return found


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _container(docs: list[Manifest]) -> Manifest:
    (container,) = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


# ---------------------------------------------------------------- lint and the SDK


def test_the_value_sets_exist() -> None:
    assert len(VALUE_SETS) >= 4, [p.name for p in VALUE_SETS]


@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.33.0"])  # oldest supported; pods/resize
@pytest.mark.parametrize("path", VALUE_SETS, ids=lambda p: p.stem)
def test_lint_is_clean(path: Path, kube_version: str) -> None:
    """Strict lint (warnings are errors), including Helm's deprecated-API check."""
    report = helm.lint(
        CHART, _values(path), strict=True, namespace=NAMESPACE, kube_version=kube_version
    )
    assert report["errors"] == []
    # severity 1 is INFO; only "icon is recommended" (the project has no icon) is accepted
    findings = [m for m in report["messages"] if m["error"] != "icon is recommended"]
    assert findings == []


def test_the_packaged_chart_renders_the_same(tmp_path: Path) -> None:
    archive = helm.package(CHART, destination=tmp_path)
    with helm.Chart.load(archive) as packaged, helm.Chart.load(CHART) as source:
        values = {"adminToken": {"value": TOKEN}}
        a, b = (c.render(values, name=RELEASE, namespace=NAMESPACE) for c in (packaged, source))
        assert a == b
        assert packaged.schema == source.schema is not None
    assert not [f for f in packaged_names(archive) if "/ci/" in f], ".helmignore keeps ci/ out"


def packaged_names(archive: str) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


def test_schema_rejects_bad_values() -> None:
    bad = [
        ({"replicaCount": -1}, "/replicaCount"),
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        ({"service": {"type": "Ingress"}}, "/service/type"),
        ({"config": {"platform": "static"}}, "/config/platform"),
        ({"serviceMonitor": {"interval": "often"}}, "/serviceMonitor/interval"),
    ]
    with helm.Chart.load(CHART) as chart:
        for values, where in bad:
            with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
                chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"config": {"admin": {"host": "127.0.0.1"}}},
            "config.admin.host is 127.0.0.1: a pod must bind a reachable address",
        ),
        (
            {"config": {"listen": {"host": "localhost"}}},
            "config.listen.host is localhost",
        ),
        (
            {"terminationGracePeriodSeconds": 30},
            "terminationGracePeriodSeconds (30) must exceed preStopDelaySeconds (5) + the drain time (30 s)",
        ),
        (
            {
                "ingressClass": {"name": "edge"},
                "config": {"kubernetes": {"ingress_class": "sluice"}},
            },
            "ingressClass.name (edge) differs from config.kubernetes.ingress_class (sluice)",
        ),
        (
            {"rbac": {"clusterWide": False}, "config": {"kubernetes": {"namespaces": ["shop"]}}},
            "config.kubernetes.namespaces is [shop] but rbac.clusterWide=false grants access to "
            "the release namespace (edge) only",
        ),
        (
            {"serviceAccount": {"create": False, "name": ""}},
            "serviceAccount.name is required when serviceAccount.create is false",
        ),
    ],
)
def test_render_refuses_installs_that_cannot_work(values: dict[str, Any], message: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmRenderError) as info:
        chart.render({"adminToken": {"value": TOKEN}} | values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(info.value)


# ---------------------------------------------------------------- every value set


def test_objects_and_kinds(case: tuple[dict[str, Any], list[Manifest]]) -> None:
    values, docs = case
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ConfigMap", "Deployment", "Service", "Service"]
    for key, kind in [
        ("autoscaling", "HorizontalPodAutoscaler"),
        ("prometheusRule", "PrometheusRule"),
        ("grafanaDashboard", "ConfigMap"),
        ("networkPolicy", "NetworkPolicy"),
    ]:
        if values[key]["enabled"]:
            expected.append(kind)
    if values["serviceAccount"]["create"]:
        expected.append("ServiceAccount")
    if values["rbac"]["create"]:
        expected += ["Role", "RoleBinding"]
        if values["rbac"]["clusterWide"]:
            expected += ["ClusterRole", "ClusterRoleBinding"]
    if values["ingressClass"]["enabled"]:
        expected.append("IngressClass")
    if values["podDisruptionBudget"]["enabled"]:
        expected.append("PodDisruptionBudget")
    if values["serviceMonitor"]["enabled"]:
        expected.append("ServiceMonitor")
    if values["config"]["admin"].get("token_env") and not values["adminToken"]["existingSecret"]:
        expected.append("Secret")
    assert kinds == sorted(expected)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "duplicate objects"
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"]
        labels = doc["metadata"].get("labels", {})
        for label in COMMON_LABELS:
            assert label in labels, f"{doc['kind']} {doc['metadata']['name']} lacks {label}"
        if doc["kind"] in NAMESPACED:
            assert doc["metadata"]["namespace"] == NAMESPACE
        else:
            assert "namespace" not in doc["metadata"]


def test_every_field_is_known_to_the_kubernetes_api(
    case: tuple[dict[str, Any], list[Manifest]],
) -> None:
    for doc in case[1]:
        if doc["kind"] in CRDS:  # not in the official client's models
            assert doc["apiVersion"] == CRDS[doc["kind"]]
            continue
        manifest = {k: v for k, v in doc.items() if k != "__template__"}
        assert field_errors(manifest) == [], doc["__template__"]


def test_the_field_check_catches_typos_and_wrong_kinds() -> None:
    deployment = _one(_render({}), "Deployment")
    manifest = {k: v for k, v in deployment.items() if k != "__template__"}
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    container["readinesProbe"] = container.pop("readinessProbe")
    container["ports"][0]["containerPort"] = "8080"
    assert field_errors(manifest) == [
        "Deployment.spec.template.spec.containers[0].ports[0].containerPort: expected int, got '8080'",
        "Deployment.spec.template.spec.containers[0].readinesProbe: unknown field of V1Container",
    ]


def test_selectors_match_the_pods(case: tuple[dict[str, Any], list[Manifest]]) -> None:
    values, docs = case
    deployment = _one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert set(selector) == set(NAME_LABELS), "the selector is immutable: keep it minimal"
    assert _matches(selector, pod_labels)
    if values["autoscaling"]["enabled"]:
        assert "replicas" not in deployment["spec"], "the HPA owns the replicas"
    else:
        assert deployment["spec"]["replicas"] == values["replicaCount"]
    ports = {p["name"]: p["containerPort"] for p in _container(docs)["ports"]}
    services = {
        s["metadata"]["labels"]["app.kubernetes.io/component"]: s for s in _kind(docs, "Service")
    }
    assert set(services) == {"gateway", "admin"}
    for service in services.values():
        assert _matches(service["spec"]["selector"], pod_labels)
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{port['targetPort']} is no container port"
    traffic, admin = services["gateway"], services["admin"]
    assert traffic["spec"]["type"] == values["service"]["type"]
    assert traffic["spec"]["ports"][0]["port"] == values["service"]["port"]
    assert admin["spec"]["clusterIP"] == "None", "peers need one address per pod"
    for pdb in _kind(docs, "PodDisruptionBudget"):
        assert _matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)
        assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])
    for monitor in _kind(docs, "ServiceMonitor"):
        assert _matches(monitor["spec"]["selector"]["matchLabels"], admin["metadata"]["labels"])
        assert not _matches(
            monitor["spec"]["selector"]["matchLabels"], traffic["metadata"]["labels"]
        )
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in admin["spec"]["ports"]}
        assert endpoint["path"] == "/metrics"
    # the leader finds its peers in the EndpointSlices of the Service the config names
    kube = yaml.safe_load(_config_map(docs)["data"]["sluice.yaml"])["kubernetes"]
    assert kube["gateway_service"] == {
        "namespace": NAMESPACE,
        "name": admin["metadata"]["name"],
        "admin_port_name": "admin",
    }
    assert "admin" in {p["name"] for p in admin["spec"]["ports"]}


def test_ports_and_probes_follow_the_config(case: tuple[dict[str, Any], list[Manifest]]) -> None:
    values, docs = case
    container = _container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "http": values["config"]["listen"]["port"],
        "admin": values["config"]["admin"]["port"],
    }
    probes = {
        name: container[name]["httpGet"]
        for name in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes["livenessProbe"] == {"path": "/healthz", "port": "admin"}
    assert probes["startupProbe"] == {"path": "/healthz", "port": "admin"}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": "admin"}
    # these two paths are served by the real admin plane: tests/e2e/test_chart_probes.py


def test_pods_are_hardened_and_drain(case: tuple[dict[str, Any], list[Manifest]]) -> None:
    values, docs = case
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    container = _container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"]
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    drain_s = values["config"].get("shutdown", {}).get("drain_s", values["drainSeconds"])
    assert pod["terminationGracePeriodSeconds"] > float(sleep[1]) + drain_s


def test_the_image_and_the_chart_agree(case: tuple[dict[str, Any], list[Manifest]]) -> None:
    _, docs = case
    runtime = parse_dockerfile((ROOT / "Dockerfile").read_text()).stage("runtime")
    entrypoint = runtime.last("ENTRYPOINT")
    assert entrypoint is not None and isinstance(entrypoint.args, list)
    config_path = Path(entrypoint.args[entrypoint.args.index("--config") + 1])
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    container = _container(docs)
    assert "command" not in container and "args" not in container, "use the image's entrypoint"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert mount["mountPath"] == str(config_path.parent)
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    configmap = _config_map(docs)
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert volume["configMap"]["items"] == [{"key": config_path.name, "path": config_path.name}]
    uid = next(a.words[0] for a in runtime.all("ARG") if a.words[0].startswith("SLUICE_UID="))
    assert pod["securityContext"]["runAsUser"] == int(uid.split("=")[1])


def test_configmap_passes_sluice_check(
    case: tuple[dict[str, Any], list[Manifest]], tmp_path: Path
) -> None:
    values, docs = case
    text = _config_map(docs)["data"]["sluice.yaml"]
    rendered = yaml.safe_load(text)
    kube = rendered.pop("kubernetes")
    expected = dict(values["config"])
    given = expected.pop("kubernetes", None) or {}
    assert rendered == expected, "values.config is rendered verbatim"
    for key, value in given.items():  # the user's kubernetes keys survive
        if key not in {"gateway_service", "lease"}:
            assert kube[key] == value
    assert kube["lease"]["namespace"] == NAMESPACE, "the namespaced Role grants the Lease there"
    assert kube["ingress_class"] == values["ingressClass"]["name"]
    if values["rbac"]["create"] and not values["rbac"]["clusterWide"]:
        assert kube["namespaces"] == [NAMESPACE], "a Role only reaches the release namespace"
    config = tmp_path / "sluice.yaml"
    config.write_text(text)
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "ok: platform kubernetes" in out.stdout
    assert f"{len(values['config']['services'])} service(s)" in out.stdout


def test_the_admin_token_reaches_the_pods_and_prometheus(
    case: tuple[dict[str, Any], list[Manifest]],
) -> None:
    values, docs = case
    variable = values["config"]["admin"].get("token_env")
    assert variable, "the admin plane is off loopback: it needs a token"
    secret_name = values["adminToken"]["existingSecret"] or f"{RELEASE}-sluice-admin-token"
    if values.get("fullnameOverride") and not values["adminToken"]["existingSecret"]:
        secret_name = f"{values['fullnameOverride']}-admin-token"
    key = values["adminToken"]["secretKey"]
    env = {e["name"]: e for e in _container(docs)["env"]}
    assert env[variable]["valueFrom"] == {"secretKeyRef": {"name": secret_name, "key": key}}
    secrets = _kind(docs, "Secret")
    if values["adminToken"]["existingSecret"]:
        assert secrets == []
    else:
        (secret,) = secrets
        assert secret["metadata"]["name"] == secret_name
        token = base64.b64decode(secret["data"][key]).decode()
        assert len(token) >= 32 and token.isalnum()
    for monitor in _kind(docs, "ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": secret_name, "key": key},
        }


def test_service_account_is_bound(case: tuple[dict[str, Any], list[Manifest]]) -> None:
    values, docs = case
    account = _one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    if values["serviceAccount"]["create"]:
        assert _one(docs, "ServiceAccount")["metadata"]["name"] == account
    else:
        assert account == values["serviceAccount"]["name"]
    roles = {
        (d["kind"], d["metadata"]["name"]) for d in _kind(docs, "Role") + _kind(docs, "ClusterRole")
    }
    for binding in _kind(docs, "RoleBinding") + _kind(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        assert (ref["kind"], ref["name"]) in roles
        expected = "ClusterRole" if binding["kind"] == "ClusterRoleBinding" else "Role"
        assert ref["kind"] == expected


# ---------------------------------------------------------------- RBAC


def _rule_triples(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _chart_rules(docs: list[Manifest]) -> dict[str, set[tuple[str, str, str]]]:
    return {
        kind: _rule_triples(r for d in _kind(docs, kind) for r in d["rules"])
        for kind in ("Role", "ClusterRole")
    }


def _code_rule_triples(rules: object) -> set[tuple[str, str, str]]:
    """Normalise ``RBAC_RULES`` to (apiGroup, resource[/subresource], verb) triples.

    Accepts (group, resource, verbs) tuples, mappings with apiGroup(s)/resource(s)/verbs
    (the RBAC PolicyRule shape), or objects with api_group/resource/verbs attributes.
    """

    def listify(value: object) -> list[str]:
        if isinstance(value, str):
            return [value]
        assert isinstance(value, Iterable), value
        return [str(v) for v in value]

    out: set[tuple[str, str, str]] = set()
    assert isinstance(rules, Iterable), type(rules)
    for rule in rules:
        if isinstance(rule, tuple) and len(rule) == 3:
            groups, resources, verbs = rule
        elif isinstance(rule, dict):
            groups = rule.get(
                "apiGroups", rule.get("api_groups", rule.get("apiGroup", rule.get("api_group")))
            )
            resources = rule.get("resources", rule.get("resource"))
            verbs = rule["verbs"]
        else:
            groups = getattr(rule, "api_groups", None) or getattr(rule, "api_group")  # noqa: B009
            resources = getattr(rule, "resources", None) or getattr(rule, "resource")  # noqa: B009
            verbs = getattr(rule, "verbs")  # noqa: B009
        for group in listify(groups):
            for resource in listify(resources):
                for verb in listify(verbs):
                    out.add((group, resource, verb))
    return out


def test_rule_normaliser_reads_every_supported_shape() -> None:
    class Rule:
        api_groups = ("apps",)
        resources = ("deployments/scale",)
        verbs = ("get", "patch")

    expected = {("apps", "deployments/scale", "get"), ("apps", "deployments/scale", "patch")}
    assert _code_rule_triples([("apps", "deployments/scale", ("get", "patch"))]) == expected
    assert (
        _code_rule_triples(
            [("apps", "deployments/scale", "get"), ("apps", "deployments/scale", "patch")]
        )
        == expected
    )
    assert (
        _code_rule_triples(
            [{"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]}]
        )
        == expected
    )
    assert _code_rule_triples(frozenset({Rule()})) == expected


def _kubernetes_module_rules() -> set[tuple[str, str, str]]:
    try:
        kubeapi = importlib.import_module("gateway.platforms.kubernetes.api")
    except ModuleNotFoundError as e:
        if e.name != "gateway.platforms.kubernetes.api":
            raise
        pytest.skip(
            "gateway/platforms/kubernetes/api.py (issue 6, the Kubernetes platform) has not landed: "
            "nothing to compare the chart's RBAC rules with yet"
        )
    return _code_rule_triples(kubeapi.RBAC_RULES)


CLUSTER_SCOPED = {"nodes"}


def _rbac_docs(cluster_wide: bool) -> list[Manifest]:
    return _render({"rbac": {"create": True, "clusterWide": cluster_wide}})


@pytest.mark.parametrize("cluster_wide", [True, False], ids=["cluster", "namespace"])
def test_rbac_rules_equal_what_the_kubernetes_module_calls(cluster_wide: bool) -> None:
    code = _kubernetes_module_rules()
    if not cluster_wide:  # a Role cannot grant cluster-scoped objects (budget.cpu: auto's nodes)
        code -= {t for t in code if t[1] in CLUSTER_SCOPED}
    rules = _chart_rules(_rbac_docs(cluster_wide))
    chart = rules["Role"] | rules["ClusterRole"]
    assert chart - code == set(), "the chart grants more than the code uses"
    assert code - chart == set(), "the code calls the API beyond what the chart grants"


@pytest.mark.parametrize("cluster_wide", [True, False], ids=["cluster", "namespace"])
def test_rbac_shape(cluster_wide: bool) -> None:
    docs = _rbac_docs(cluster_wide)
    rules = _chart_rules(docs)
    everything = rules["Role"] | rules["ClusterRole"]
    assert everything, "no RBAC rendered"
    assert not [t for t in everything if "*" in t], "no wildcards"
    assert not [
        t
        for t in everything
        if t[2] in {"delete", "deletecollection", "escalate", "bind", "impersonate"}
    ]
    leases = {t for t in everything if t[1] == "leases"}
    assert leases and {t[0] for t in leases} == {"coordination.k8s.io"}
    assert leases <= rules["Role"], "the Lease lives in the release namespace: a Role"
    assert not leases & rules["ClusterRole"]
    if cluster_wide:
        assert rules["ClusterRole"] == everything - leases
    else:
        assert rules["ClusterRole"] == set()
        assert not _kind(docs, "ClusterRoleBinding")


def test_rbac_off_renders_no_rbac() -> None:
    docs = _render({"rbac": {"create": False, "clusterWide": True}})
    assert not [
        d for d in docs if d["kind"] in {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    ]


# ---------------------------------------------------------------- NOTES and documentation


def test_notes_render_with_the_real_names() -> None:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render({"adminToken": {"value": TOKEN}}, name=RELEASE, namespace=NAMESPACE)
    notes = rendered["sluice/templates/NOTES.txt"]
    assert "ingressClassName: sluice" in notes
    assert f"svc/{RELEASE}-sluice-admin 9901:9901" in notes
    assert "/api/decisions" in notes


def _value_keys() -> Iterator[tuple[str, bool]]:
    """(dotted key, documented) for every key line of values.yaml."""
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in (CHART / "values.yaml").read_text().splitlines():
        match = re.match(r"^(\s*)([A-Za-z][\w]*):", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
            yield ".".join(k for _, k in stack), previous.lstrip().startswith("#")
        if line.strip():
            previous = line


def _schema_node(schema: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    """The schema node for a key, or None below a free-form object (no 'properties')."""
    node = schema
    for part in dotted.split("."):
        if "properties" not in node:
            return None
        node = node["properties"].get(part, {"__missing__": True})
    return node


def test_every_value_is_documented_typed_and_in_the_readme() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    readme = (CHART / "README.md").read_text()
    keys = list(_value_keys())
    assert len(keys) > 60
    for dotted, documented in keys:
        node = _schema_node(schema, dotted)
        if node is None:
            continue  # inside a free-form map (resources, securityContext, config.services...)
        assert documented, f"values.yaml: {dotted} has no comment"
        assert "__missing__" not in node or dotted.startswith("config."), (
            f"values.schema.json does not know {dotted}"
        )
        assert f"`{dotted}`" in readme, f"charts/sluice/README.md does not document {dotted}"
    top = {k for k, _ in keys if "." not in k}
    assert set(schema["properties"]) - {"global"} == top


def test_the_docs_values_example_installs_a_valid_config(tmp_path: Path) -> None:
    docs = (ROOT / "docs" / "kubernetes-chart.md").read_text()
    (example,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S) if "# my-values.yaml" in b
    ]
    manifests = _render(yaml.safe_load(example))
    config = tmp_path / "sluice.yaml"
    config.write_text(_config_map(manifests)["data"]["sluice.yaml"])
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "shop/api" in out.stdout


def test_digest_history_and_extra_args_volumes_and_mounts() -> None:
    digest = "sha256:" + "ab" * 32
    docs = _render(
        {
            "image": {"repository": "registry.example/sluice", "tag": "9.9", "digest": digest},
            "revisionHistoryLimit": 3,
            "extraArgs": ["--log-format", "json"],
            "extraVolumes": [{"name": "certs", "secret": {"secretName": "sluice-tls"}}],
            "extraVolumeMounts": [{"name": "certs", "mountPath": "/etc/sluice-tls"}],
        }
    )
    deployment = _one(docs, "Deployment")
    assert deployment["spec"]["revisionHistoryLimit"] == 3
    container = _container(docs)
    assert container["image"] == f"registry.example/sluice@{digest}"  # the tag is ignored
    assert container["args"] == ["--log-format", "json"]  # after the image's entrypoint
    assert {"name": "certs", "mountPath": "/etc/sluice-tls"} in container["volumeMounts"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "certs", "secret": {"secretName": "sluice-tls"}} in volumes
    assert {v["name"] for v in volumes} >= {"config", "tmp", "certs"}
    # Defaults: a tag, 10 old ReplicaSets, no args.
    plain = _render({})
    assert _one(plain, "Deployment")["spec"]["revisionHistoryLimit"] == 10
    assert "@" not in _container(plain)["image"] and "args" not in _container(plain)
    with pytest.raises(Exception, match="digest"):
        _render({"image": {"digest": "latest"}})


# ---------------------------------------------------------------- operators' objects (issue 19)

METRICS_SOURCE = ROOT / "gateway" / "admin" / "metrics.py"


def _exposed_metric_names() -> set[str]:
    """Every series name gateway/admin/metrics.py can expose (counters get ``_total``,
    histograms ``_bucket``/``_sum``/``_count``), plus Prometheus' own ``up``."""
    source = METRICS_SOURCE.read_text()
    names = {"up"}
    for kind, name in re.findall(r"(\w+)MetricFamily\(\s*\"(sluice_\w+)\"", source):
        if kind == "Counter":
            names.add(f"{name}_total")
        elif kind == "Histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(sluice_\w+|up)\s*\{", expr)) | set(
        re.findall(r"\b(sluice_\w+)\b", expr)
    )


def test_the_metric_name_reader_knows_the_exposition() -> None:
    names = _exposed_metric_names()
    assert {"sluice_requests_total", "sluice_scaler_leader", "sluice_endpoints"} <= names
    assert "sluice_request_duration_seconds_bucket" in names
    assert "sluice_scaler_resize_blocked" in names


def test_the_gateway_hpa_scales_the_deployment_on_cpu() -> None:
    docs = _render(
        {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 7}, "replicaCount": 5}
    )
    hpa = _one(docs, "HorizontalPodAutoscaler")
    deployment = _one(docs, "Deployment")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 7)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
    assert "replicas" not in deployment["spec"]
    assert _container(docs)["resources"]["requests"]["cpu"], "Utilization needs a CPU request"
    assert not _kind(_render({}), "HorizontalPodAutoscaler"), "off by default"
    with pytest.raises(helm.HelmRenderError, match="must not exceed"):
        _render({"autoscaling": {"enabled": True, "minReplicas": 9, "maxReplicas": 3}})
    with pytest.raises(helm.HelmRenderError, match=r"resources.requests.cpu"):
        _render({"autoscaling": {"enabled": True}, "resources": {"requests": {"cpu": None}}})


def _rule_groups(docs: list[Manifest]) -> dict[str, Any]:
    return {"groups": _one(docs, "PrometheusRule")["spec"]["groups"]}


def test_the_alerts_use_real_metrics_and_pass_promtool(tmp_path: Path) -> None:
    docs = _render({"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}})
    groups = _rule_groups(docs)
    alerts = {r["alert"]: r for g in groups["groups"] for r in g["rules"]}
    assert {
        "SluiceBudgetExhausted",
        "SluiceResizeBlocked",
        "SluiceNoReadyEndpoints",
        "SluiceLeaderLost",
    } <= set(alerts)
    exposed = _exposed_metric_names()
    for name, rule in alerts.items():
        used = _metric_names(rule["expr"])
        assert used and used <= exposed, f"{name} uses {used - exposed}"
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert f'job="{RELEASE}-sluice-admin"' in rule["expr"], "the ServiceMonitor's job"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(groups))
    out = subprocess.run(
        ["promtool", "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_each_alert_fires_on_its_condition_only(tmp_path: Path) -> None:
    """promtool's rule unit tests: series as a follower and a leader pod would expose them."""
    docs = _render({"prometheusRule": {"enabled": True, "for": "2m"}})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(docs)))
    job = f'job="{RELEASE}-sluice-admin", namespace="{NAMESPACE}"'
    series = [
        # shop/api is clamped by the budget; shop/web is not
        (
            f'sluice_scaler_clamped{{{job}, pod="a", service="shop/api", quantity="cores", bound="budget"}}',
            "1x10",
        ),
        (
            f'sluice_scaler_clamped{{{job}, pod="a", service="shop/web", quantity="replicas", bound="max_replicas"}}',
            "1x10",
        ),
        (f'sluice_scaler_resize_blocked{{{job}, pod="a", service="shop/api"}}', "1x10"),
        (f'sluice_scaler_resize_blocked{{{job}, pod="a", service="shop/web"}}', "0x10"),
        # shop/web has requests and no ready endpoint; shop/api has one
        (f'sluice_endpoints{{{job}, pod="a", service="shop/web", state="ready"}}', "0x10"),
        (f'sluice_endpoints{{{job}, pod="a", service="shop/api", state="ready"}}', "1x10"),
        (f'sluice_arrivals_total{{{job}, pod="a", service="shop/web"}}', "0+60x10"),
        (f'sluice_arrivals_total{{{job}, pod="a", service="shop/api"}}', "0+60x10"),
        # leadership lost after 3 minutes
        (f'sluice_scaler_leader{{{job}, pod="a"}}', "1 1 1 0x7"),
        (f'sluice_scaler_leader{{{job}, pod="b"}}', "0x10"),
        (f'up{{{job}, pod="a"}}', "1x10"),
    ]
    service_labels = {"namespace": NAMESPACE}
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {
                        "eval_time": "9m",
                        "alertname": "SluiceBudgetExhausted",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    **service_labels,
                                    "service": "shop/api",
                                    "severity": "warning",
                                }
                            }
                        ],
                    },
                    {
                        "eval_time": "9m",
                        "alertname": "SluiceResizeBlocked",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    **service_labels,
                                    "service": "shop/api",
                                    "severity": "warning",
                                }
                            }
                        ],
                    },
                    {
                        "eval_time": "9m",
                        "alertname": "SluiceNoReadyEndpoints",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    **service_labels,
                                    "service": "shop/web",
                                    "severity": "critical",
                                }
                            }
                        ],
                    },
                    {"eval_time": "4m", "alertname": "SluiceLeaderLost", "exp_alerts": []},
                    {
                        "eval_time": "9m",
                        "alertname": "SluiceLeaderLost",
                        "exp_alerts": [{"exp_labels": {**service_labels, "severity": "critical"}}],
                    },
                    {"eval_time": "9m", "alertname": "SluiceMetricsAbsent", "exp_alerts": []},
                ],
            }
        ],
    }
    for alert in tests["tests"][0]["alert_rule_test"]:  # type: ignore[index]
        for expected in alert["exp_alerts"]:
            expected["exp_annotations"] = _annotations(
                docs, alert["alertname"], expected["exp_labels"]
            )
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    out = subprocess.run(
        ["promtool", "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _annotations(docs: list[Manifest], alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The alert's annotations with ``{{ $labels.x }}`` expanded (promtool compares them)."""
    (rule,) = [
        r for g in _rule_groups(docs)["groups"] for r in g["rules"] if r.get("alert") == alert
    ]
    return {
        key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], value)
        for key, value in rule["annotations"].items()
    }


def test_the_grafana_dashboard_is_a_labelled_configmap_on_real_metrics() -> None:
    docs = _render({"grafanaDashboard": {"enabled": True}})
    (dashboard,) = [d for d in _kind(docs, "ConfigMap") if d is not _config_map(docs)]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == NAMESPACE
    model = json.loads(dashboard["data"]["sluice.json"])
    assert model["uid"] and model["panels"]
    exposed = _exposed_metric_names()
    exprs = [t["expr"] for p in model["panels"] for t in p["targets"]]
    titles = " ".join(p["title"] for p in model["panels"]).lower()
    for word in ("requests", "latency", "replicas", "budget", "endpoints", "leader"):
        assert word in titles
    for expr in exprs:
        assert _metric_names(expr) <= exposed, expr
    plain = _render({})
    assert _kind(plain, "ConfigMap") == [_config_map(plain)], "off by default"


def test_the_network_policy_admits_traffic_and_peers_on_named_ports() -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    docs = _render({"networkPolicy": {"enabled": True, "adminFrom": [monitoring]}})
    policy = _one(docs, "NetworkPolicy")
    pod_labels = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert _matches(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress stays open (API server, backends)"
    ports = {p["name"] for p in _container(docs)["ports"]}
    traffic, admin = policy["spec"]["ingress"]
    assert [p["port"] for p in traffic["ports"]] == ["http"] and "from" not in traffic
    assert [p["port"] for p in admin["ports"]] == ["admin"]
    assert {p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]} <= ports
    peers, extra = admin["from"]
    assert _matches(peers["podSelector"]["matchLabels"], pod_labels), "peers fetch /api/signals"
    assert extra == monitoring


def test_the_lease_rule_names_the_lease() -> None:
    for config, lease in [
        ({}, f"{RELEASE}-sluice-scaler"),
        ({"lease": {"name": "edge-lock"}}, "edge-lock"),
    ]:
        docs = _render({"config": {"kubernetes": config}} if config else {})
        kube = yaml.safe_load(_config_map(docs)["data"]["sluice.yaml"])["kubernetes"]
        assert kube["lease"]["name"] == lease
        role = next(d for d in _kind(docs, "Role"))
        rules = [r for r in role["rules"] if r["resources"] == ["leases"]]
        named = [r for r in rules if "resourceNames" in r]
        assert named == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [lease],
                "verbs": ["get", "update"],
            }
        ]
        (create,) = [r for r in rules if "resourceNames" not in r]
        assert create["verbs"] == ["create"], "RBAC cannot limit create by name"


def test_the_token_secret_is_the_same_on_every_render_and_never_invented() -> None:
    """No lookup, no random: `helm template` and Argo CD see the same objects every run."""
    values = {"adminToken": {"value": TOKEN}}
    with helm.Chart.load(CHART) as chart:
        first = chart.render(values, name=RELEASE, namespace=NAMESPACE)
        second = chart.render(values, name=RELEASE, namespace=NAMESPACE)
        assert first == second
        secret = yaml.safe_load(first["sluice/templates/secret.yaml"])
        assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
        with pytest.raises(
            helm.HelmRenderError, match=re.escape("adminToken: set adminToken.existingSecret")
        ):
            chart.render({}, name=RELEASE, namespace=NAMESPACE)
        with pytest.raises(helm.HelmValuesError, match="adminToken/value"):
            chart.render({"adminToken": {"value": "short"}}, name=RELEASE, namespace=NAMESPACE)
    deployment = _one(_render(values), "Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    rotated = _one(_render({"adminToken": {"value": TOKEN[::-1]}}), "Deployment")
    assert (
        annotations["checksum/admin-token"]
        != rotated["spec"]["template"]["metadata"]["annotations"]["checksum/admin-token"]
    ), "a new token rolls the pods (the token is an environment variable)"
    assert not re.search(r"\blookup\s+\"", (CHART / "templates" / "secret.yaml").read_text())
