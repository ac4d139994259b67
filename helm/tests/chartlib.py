"""Offline rendering, linting and schema validation of the socialgraph chart.

Rendering and linting go through helm-python-sdk (a binding of the Helm Go SDK: the same
template engine, values coalescing and values.schema.json check as `helm install`); manifests
are validated with kubernetes-validate against the Kubernetes schemas in strict mode.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import helm_python as helm
import jsonschema
import yaml
from kubernetes_validate import utils as kv

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "socialgraph"
PRODUCTION_VALUES = CHART_DIR / "ci" / "production-values.yaml"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KUBE_VERSION = "1.33.0"
RELEASE = "sg"
NAMESPACE = "social"

SERVICES = ("relation", "projection", "counter")
CONSUMERS = ("projection", "counter")
DEFAULT_PORTS = {"relation": (50051, 9101), "projection": (50052, 9102), "counter": (50053, 9103)}
# message-svc: a Deployment like relation-svc (outbox and relay), not called by the gateway.
MESSAGE = "message"
MESSAGE_PORTS = (50054, 9105)  # gRPC, admin (9105: the gateway has 9104)
# The HTTP/JSON gateway in front of the three services: a stateless Deployment of its own.
GATEWAY = "gateway"
GATEWAY_PORTS = (8080, 9104)  # HTTP/JSON, admin
COMPONENTS = SERVICES + (MESSAGE, GATEWAY)
DEPLOYMENTS = ("relation", MESSAGE, GATEWAY)

# Kinds kubernetes-validate has no schema for, with the schema the tests hold for them.
CUSTOM_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
}


@lru_cache(maxsize=1)
def chart() -> helm.Chart:
    return helm.Chart.load(CHART_DIR)


def production_values() -> dict[str, Any]:
    return yaml.safe_load(PRODUCTION_VALUES.read_text())


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`base` with `override` merged in (maps recursively, everything else replaced)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Rendered:
    """The manifests of one render: raw text per template and the parsed objects."""

    text: dict[str, str]
    objects: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for template, body in sorted(self.text.items()):
            if template.endswith("NOTES.txt"):
                continue
            for doc in yaml.safe_load_all(body):
                if doc:
                    doc.setdefault("metadata", {}).setdefault("annotations", {})
                    self.objects.append(doc)

    @property
    def all_text(self) -> str:
        return "\n".join(self.text.values())

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def find(self, kind: str, name: str) -> dict[str, Any] | None:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        return found[0] if found else None

    def workload(self, service: str) -> dict[str, Any]:
        kind = "Deployment" if service in DEPLOYMENTS else "StatefulSet"
        return self.get(kind, f"{RELEASE}-{service}")

    def container(self, service: str) -> dict[str, Any]:
        (c,) = self.workload(service)["spec"]["template"]["spec"]["containers"]
        return c

    def environment(self, service: str) -> dict[str, Any]:
        """Every variable the service's container gets: ConfigMap values (as str) and `env`
        entries (their value, or their valueFrom)."""
        container = self.container(service)
        env: dict[str, Any] = {}
        for source in container.get("envFrom", []):
            cm = self.get("ConfigMap", source["configMapRef"]["name"])
            env.update(cm["data"])
        for entry in container.get("env", []):
            assert entry["name"] not in env, f"{service}: {entry['name']} set twice"
            env[entry["name"]] = entry.get("value", entry.get("valueFrom"))
        return env

    def pod_specs(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(object, pod spec) of every workload, the migration Job included."""
        for obj in self.objects:
            if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
                yield obj, obj["spec"]["template"]["spec"]

    def secret_values(self) -> list[str]:
        """Decoded values of every Secret the chart renders."""
        out = []
        for secret in self.of_kind("Secret"):
            out += [base64.b64decode(v).decode() for v in secret.get("data", {}).values()]
            out += list(secret.get("stringData", {}).values())
        return out


def render(values: dict[str, Any] | None = None, **opts: Any) -> Rendered:
    opts.setdefault("name", RELEASE)
    opts.setdefault("namespace", NAMESPACE)
    return Rendered(chart().render(values, **opts))


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return helm.lint(CHART_DIR, values, strict=True, kube_version=f"v{KUBE_VERSION}")


@lru_cache(maxsize=None)
def _custom_validator(filename: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / filename).read_text())
    return jsonschema.Draft202012Validator(schema)


def validate(obj: dict[str, Any]) -> None:
    """Validates one object strictly: built-in kinds against the Kubernetes schemas of
    KUBE_VERSION, known custom kinds against the schema the tests hold. Raises on anything
    else, so that a new kind cannot slip through unvalidated."""
    custom = CUSTOM_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if custom:
        _custom_validator(custom).validate(obj)
        return
    kv.validate(obj, KUBE_VERSION, strict=True)


def documented_settings() -> dict[str, set[str]]:
    """The SG_ variables each component reads, from the book's configuration reference
    (docs/src/configuration.md): for the services the `## server` table, then the `key` tables
    of each `## <name>-svc` section; for the gateway only the table of its `## gateway` section
    (it has no `[server]` section). The tables of keys a service accepts but does not use (their
    header is `accepted, not used`) are left out."""
    text = (REPO / "docs" / "src" / "configuration.md").read_text()
    row = re.compile(r"^\|\s*`([a-z_]+(?:\.[a-z_]+)?)`\s*\|", re.M)

    def section(title: str) -> str:
        start = text.index(f"\n## {title}\n")
        end = text.find("\n## ", start + 1)
        return text[start:end if end != -1 else len(text)]

    def keys(body: str) -> set[str]:
        out = set()
        for table in re.split(r"\n\n(?=\|)", body):
            if table.lstrip().startswith("| key |"):
                out |= {"SG_" + k.upper().replace(".", "__") for k in row.findall(table)}
        return out

    server = keys(section("server"))
    assert server and all(v.startswith("SG_SERVER__") for v in server), server
    out: dict[str, set[str]] = {}
    for match in re.finditer(r"^## (?:([a-z]+)-svc|(gateway))\s*$", text, re.M):
        table = keys(section(match.group(0)[3:].strip()))
        if match.group(2):
            out[match.group(2)] = table
        else:
            out[match.group(1)] = server | table
    return out
