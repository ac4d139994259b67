"""The socialgraph chart, rendered offline: lint, strict Kubernetes 1.33 validation, and what the
rendered manifests must guarantee (probes, partition assignment, migration order, secrets,
hardening, rollouts on config change, schema errors)."""

from __future__ import annotations

import base64
import copy
import json
import math
import re

import helm_python as helm
import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv

import chartlib
from chartlib import (COMPONENTS, CONSUMERS, DEFAULT_PORTS, GATEWAY, GATEWAY_PORTS, MESSAGE, MESSAGE_PORTS, RELEASE,
                      SERVICES, merged, render)

# Everything a trial may give inline, and more than the defaults: separate projection database,
# own Redis for counters, a cache Redis, tokens, key prefixes, IPv6 listen host, no autoscaling,
# a browser origin for the gateway.
ALL_INLINE = {
    "listenHost": "::",
    "redis": {"keyPrefix": "sg-trial:"},
    "cache": {"url": "redis://cache-redis:6379/2", "keyPrefix": "sg-trial-cache:"},
    "auth": {"adminToken": "trial-admin-token", "pageTokenSecret": "trial-page-key"},
    "projection": {"database": {"url": "postgres://proj@projection-db:5432/projection"}},
    "counter": {"redis": {"url": "redis://counter-redis:6379/1"}},
    "relation": {"autoscaling": {"enabled": False}, "replicas": 1},
    "gateway": {"autoscaling": {"enabled": False}, "replicas": 1,
                "http": {"corsAllowedOrigins": ["http://localhost:3000"]}},
    "otel": {"endpoint": "http://otel-collector:4317"},
    "log": {"format": "text"},
}


def variants() -> dict[str, dict]:
    prod = chartlib.production_values()
    return {
        "default": {},
        "production": prod,
        "all-inline": ALL_INLINE,
        # The gateway then calls the projection and counters of another installation.
        "production-without-projection-and-counter": merged(
            prod, {"projection": {"enabled": False}, "counter": {"enabled": False},
                   "gateway": {"upstream": {"projectionUrl": "http://projection.graph:50052",
                                            "counterUrl": "http://counter.graph:50053"}}}
        ),
        "network-policy-without-callers": {"networkPolicy": {"enabled": True}},
        "without-gateway": merged(prod, {"gateway": {"enabled": False}}),
        # The alerts (PrometheusRule) and the Grafana dashboard ConfigMap, as production would run them.
        "production-with-alerts-and-dashboard": merged(prod, {
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "grafanaDashboard": {"enabled": True}}),
        "gateway-fixed-replicas-custom-ports": {
            "gateway": {"autoscaling": {"enabled": False}, "replicas": 3, "ports": {"http": 8000, "admin": 9000},
                        "pdb": {"minAvailable": 2}, "extraEnv": [{"name": "SG_TRACE_FILTER", "value": "debug"}]},
        },
    }


VARIANTS = variants()


@pytest.fixture(scope="module")
def default() -> chartlib.Rendered:
    return render()


@pytest.fixture(scope="module")
def production() -> chartlib.Rendered:
    return render(chartlib.production_values(), is_upgrade=True)


# --- lint and strict validation ------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production", "all-inline", "production-with-alerts-and-dashboard"])
def test_chart_lints_clean(variant):
    report = chartlib.lint(VARIANTS[variant])
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report
    # Only informational notes remain (Helm recommends an icon URL).
    assert {m["path"] for m in report["messages"]} <= {"Chart.yaml"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_manifest_validates_strictly_against_kubernetes_1_33(variant):
    rendered = render(VARIANTS[variant])
    assert rendered.objects
    failures = []
    for obj in rendered.objects:
        try:
            chartlib.validate(obj)
        except (jsonschema.ValidationError, kv.SchemaNotFoundError) as e:
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {getattr(e, 'message', e)}")
    assert not failures, "\n".join(failures)


def test_strict_validation_rejects_unknown_fields(default):
    """The validator used above is really strict (an unknown field is an error)."""
    deployment = copy.deepcopy(default.workload("relation"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpcc"] = {}
    with pytest.raises(jsonschema.ValidationError):
        chartlib.validate(deployment)
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [{"port": "admin", "intervall": "30s"}]},
    }
    with pytest.raises(jsonschema.ValidationError):
        chartlib.validate(monitor)


def test_default_values_install_every_service(default):
    assert default.workload("relation")["kind"] == "Deployment"
    assert default.get("HorizontalPodAutoscaler", f"{RELEASE}-relation")
    for name in CONSUMERS:
        assert default.workload(name)["kind"] == "StatefulSet"
    for name in SERVICES:
        assert default.get("Service", f"{RELEASE}-{name}")
        assert default.get("PodDisruptionBudget", f"{RELEASE}-{name}")
        assert default.get("ConfigMap", f"{RELEASE}-{name}")
    assert default.workload(GATEWAY)["kind"] == "Deployment"
    assert default.get("HorizontalPodAutoscaler", f"{RELEASE}-{GATEWAY}")
    for kind in ("Service", "PodDisruptionBudget", "ConfigMap"):
        assert default.get(kind, f"{RELEASE}-{GATEWAY}")
    assert default.get("Job", f"{RELEASE}-migrate")
    assert not default.of_kind("ServiceMonitor") and not default.of_kind("NetworkPolicy")


def test_production_runs_three_replicas_of_each_service(production):
    hpa = production.get("HorizontalPodAutoscaler", f"{RELEASE}-relation")
    assert hpa["spec"]["minReplicas"] == 3
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": f"{RELEASE}-relation"}
    # The HPA owns the replica count: the Deployment leaves it alone, so upgrades keep it.
    assert "replicas" not in production.workload("relation")["spec"]
    for name in CONSUMERS:
        assert production.workload(name)["spec"]["replicas"] == 3
    gateway_hpa = production.get("HorizontalPodAutoscaler", f"{RELEASE}-{GATEWAY}")
    assert gateway_hpa["spec"]["minReplicas"] == 3 and gateway_hpa["spec"]["maxReplicas"] == 12
    assert gateway_hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": f"{RELEASE}-{GATEWAY}"}
    assert "replicas" not in production.workload(GATEWAY)["spec"]
    fixed = render({n: {"autoscaling": {"enabled": False}, "replicas": 3} for n in ("relation", MESSAGE, GATEWAY)})
    assert fixed.workload("relation")["spec"]["replicas"] == 3
    assert fixed.workload(MESSAGE)["spec"]["replicas"] == 3
    assert fixed.workload(GATEWAY)["spec"]["replicas"] == 3
    assert not fixed.of_kind("HorizontalPodAutoscaler")


# --- probes, ports, termination ------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production", "custom-ports"])
def test_probes_are_native_grpc_on_each_services_grpc_port(variant):
    ports = DEFAULT_PORTS
    values = VARIANTS.get(variant, {})
    if variant == "custom-ports":
        ports = {"relation": (6001, 7001), "projection": (6002, 7002), "counter": (6003, 7003)}
        values = {n: {"ports": {"grpc": g, "admin": a}} for n, (g, a) in ports.items()}
    rendered = render(values)
    for name in SERVICES:
        grpc_port, admin_port = ports[name]
        container = rendered.container(name)
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
            "grpc": grpc_port, "admin": admin_port}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            spec = container[probe]
            assert spec["grpc"] == {"port": grpc_port}, f"{name} {probe}: {spec}"
            assert not {"httpGet", "tcpSocket", "exec"} & spec.keys()
        env = rendered.environment(name)
        assert env["SG_SERVER__GRPC_ADDR"].endswith(f":{grpc_port}")
        assert env["SG_SERVER__ADMIN_ADDR"].endswith(f":{admin_port}")
        service = rendered.get("Service", f"{RELEASE}-{name}")
        assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
            "grpc": (grpc_port, "grpc"), "admin": (admin_port, "admin")}
    # Callers inside the chart follow the ports.
    assert rendered.environment("projection")["SG_RELATION__URL"] == f"http://{RELEASE}-relation:{ports['relation'][0]}"
    assert rendered.environment("counter")["SG_PROJECTION__URL"] == (
        f"http://{RELEASE}-projection:{ports['projection'][0]}")


@pytest.mark.parametrize("drain_ms, pre_stop, extra", [(10000, 5, 5), (30500, 0, 2), (1, 10, 0)])
def test_termination_grace_covers_pre_stop_and_drain_time(drain_ms, pre_stop, extra):
    settings = {"server": {"drainTimeoutMs": drain_ms}, "preStopSleepSeconds": pre_stop,
                "terminationGraceExtraSeconds": extra}
    rendered = render({name: settings for name in SERVICES})
    for name in SERVICES:
        pod = rendered.workload(name)["spec"]["template"]["spec"]
        assert rendered.environment(name)["SG_SERVER__DRAIN_TIMEOUT_MS"] == str(drain_ms)
        assert pod["terminationGracePeriodSeconds"] == pre_stop + math.ceil(drain_ms / 1000) + extra
        assert pod["terminationGracePeriodSeconds"] > drain_ms / 1000
        lifecycle = rendered.container(name).get("lifecycle")
        if pre_stop:
            assert lifecycle == {"preStop": {"sleep": {"seconds": pre_stop}}}
        else:
            assert lifecycle is None


# --- partition assignment ------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 3, 5])
def test_statefulsets_pass_their_ordinal_and_replica_count_to_the_consumers(replicas):
    rendered = render({n: {"replicas": replicas} for n in CONSUMERS})
    for name in CONSUMERS:
        sts = rendered.workload(name)
        assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == replicas
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        env = {e["name"]: e for e in rendered.container(name)["env"]}
        assert env["SG_CONSUMER__PARTITIONS__REPLICA__ORDINAL"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
        assert env["SG_CONSUMER__PARTITIONS__REPLICA__COUNT"]["value"] == str(replicas)
        headless = rendered.get("Service", sts["spec"]["serviceName"])
        assert headless["spec"]["clusterIP"] == "None"
    assert "SG_CONSUMER__PARTITIONS__REPLICA__ORDINAL" not in rendered.environment("relation")


def test_changing_the_replica_count_rolls_every_consumer_pod():
    two, three = render({"projection": {"replicas": 2}}), render({"projection": {"replicas": 3}})
    assert two.workload("projection")["spec"]["template"] != three.workload("projection")["spec"]["template"]


# --- migration hook ------------------------------------------------------------------------


def _hook(obj):
    annotations = obj["metadata"]["annotations"]
    phases = set(filter(None, annotations.get("helm.sh/hook", "").split(",")))
    return phases, int(annotations.get("helm.sh/hook-weight", "0"))


@pytest.mark.parametrize("variant", ["default", "production", "all-inline"])
def test_migration_hook_runs_before_the_services(variant):
    rendered = render(VARIANTS[variant])
    job = rendered.get("Job", f"{RELEASE}-migrate")
    phases, job_weight = _hook(job)
    assert phases == {"pre-install", "pre-upgrade"}
    # Nothing else is a hook: the services are ordinary release objects, applied after it.
    for obj in rendered.objects:
        if obj is job:
            continue
        obj_phases, weight = _hook(obj)
        if obj_phases:
            assert obj["kind"] == "Secret" and obj_phases == phases and weight < job_weight
    pod = job["spec"]["template"]["spec"]
    steps = pod.get("initContainers", []) + pod["containers"]
    binaries = [(c["command"], c["args"]) for c in steps]
    separate = variant != "default"  # production and all-inline give projection-svc its own DB
    expected = [(["/usr/local/bin/relation-svc"], ["migrate"])]
    if separate:
        expected.append((["/usr/local/bin/projection-svc"], ["migrate"]))
    assert binaries == expected
    assert pod["restartPolicy"] == "Never"
    # Pre-install hooks run before the release's own objects exist: the Job may read only
    # existing Secrets or hook Secrets created before it, and not the chart's ServiceAccount.
    assert "serviceAccountName" not in pod
    for c in steps:
        for e in c["env"]:
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if not ref:
                continue
            secret = rendered.find("Secret", ref["name"])
            if secret is not None:
                secret_phases, weight = _hook(secret)
                assert secret_phases == phases and weight < job_weight, ref
                assert ref["key"] in secret["data"]
    if variant == "production":
        refs = [c["env"][0]["valueFrom"]["secretKeyRef"] for c in steps]
        assert refs == [{"name": "socialgraph-postgres", "key": "url"},
                        {"name": "socialgraph-projection-postgres", "key": "url"}]


def test_migration_hook_can_be_turned_off():
    rendered = render({"migrations": {"enabled": False}})
    assert not rendered.of_kind("Job")
    assert all(not _hook(o)[0] for o in rendered.objects)


# --- secrets -------------------------------------------------------------------------------

SENTINELS = {
    "database": {"url": "postgres://leak:db-password-sentinel@db/x"},
    "redis": {"url": "redis://:redis-password-sentinel@redis:6379"},
    "cache": {"url": "redis://:cache-password-sentinel@cache:6379"},
    "kafka": {"brokers": ["broker-sentinel:9092"]},
    "auth": {"adminToken": "admin-token-sentinel", "pageTokenSecret": "page-key-sentinel"},
    "projection": {"database": {"url": "postgres://leak:projection-password-sentinel@db/y"}},
    "counter": {"redis": {"url": "redis://:counter-redis-sentinel@redis:6379"}},
}


def test_secrets_never_appear_inline_when_an_existing_secret_is_named():
    values = merged(chartlib.production_values(), SENTINELS)
    rendered = render(values)
    text = rendered.all_text
    for needle in ("sentinel", "postgres://", "redis://", "kafka:9092"):
        assert needle not in text, f"{needle!r} rendered although an existing Secret is named"
        assert base64.b64encode(needle.encode()).decode()[:8] not in text
    assert not rendered.of_kind("Secret"), "no Secret is needed when every value is external"
    expected = {
        "relation": {
            "SG_DATABASE__URL": ("socialgraph-postgres", "url"),
            "SG_REDIS__URL": ("socialgraph-redis-limits", "url"),
            "SG_CACHE__URL": ("socialgraph-redis-cache", "url"),
            "SG_KAFKA__BROKERS": ("socialgraph-kafka", "brokers"),
            "SG_AUTH__ADMIN_TOKEN": ("socialgraph-auth", "admin-token"),
            "SG_AUTH__PAGE_TOKEN_SECRET": ("socialgraph-auth", "page-token-secret"),
        },
        "projection": {
            "SG_DATABASE__URL": ("socialgraph-projection-postgres", "url"),
            "SG_CACHE__URL": ("socialgraph-redis-cache", "url"),
            "SG_KAFKA__BROKERS": ("socialgraph-kafka", "brokers"),
            "SG_AUTH__ADMIN_TOKEN": ("socialgraph-auth", "admin-token"),
            "SG_RELATION__ADMIN_TOKEN": ("socialgraph-auth", "admin-token"),
            "SG_AUTH__PAGE_TOKEN_SECRET": ("socialgraph-auth", "page-token-secret"),
        },
        "counter": {
            "SG_REDIS__URL": ("socialgraph-redis-counters", "url"),
            "SG_KAFKA__BROKERS": ("socialgraph-kafka", "brokers"),
            "SG_AUTH__ADMIN_TOKEN": ("socialgraph-auth", "admin-token"),
        },
    }
    for name, refs in expected.items():
        env = rendered.environment(name)
        for var, (secret, key) in refs.items():
            assert env[var] == {"secretKeyRef": {"name": secret, "key": key}}, (name, var)


def test_inline_trial_values_live_only_in_the_charts_secret():
    rendered = render(ALL_INLINE)
    inline = rendered.get("Secret", f"{RELEASE}-socialgraph-inline")
    stored = {k: base64.b64decode(v).decode() for k, v in inline["data"].items()}
    assert stored == {
        "database-url": "postgres://socialgraph@postgresql:5432/socialgraph",
        "projection-database-url": "postgres://proj@projection-db:5432/projection",
        "redis-url": "redis://redis-master:6379",
        "counter-redis-url": "redis://counter-redis:6379/1",
        "cache-redis-url": "redis://cache-redis:6379/2",
        "admin-token": "trial-admin-token",
        "page-token-secret": "trial-page-key",
    }
    for obj in rendered.objects:
        if obj["kind"] == "Secret":
            continue
        text = json.dumps(obj)
        for value in stored.values():
            assert value not in text, f"{value} in plain text in {obj['kind']}"
    env = rendered.environment("projection")
    assert env["SG_DATABASE__URL"] == {"secretKeyRef": {
        "name": f"{RELEASE}-socialgraph-inline", "key": "projection-database-url"}}
    assert rendered.environment("counter")["SG_REDIS__URL"]["secretKeyRef"]["key"] == "counter-redis-url"


def test_unset_tokens_are_not_passed_at_all(default):
    for name in SERVICES:
        env = default.environment(name)
        assert not {"SG_AUTH__ADMIN_TOKEN", "SG_AUTH__PAGE_TOKEN_SECRET", "SG_RELATION__ADMIN_TOKEN"} & env.keys()


CACHE_READERS = ("relation", "projection")


def test_a_redis_cluster_url_is_accepted_for_the_counters_and_the_caches():
    url = "redis+cluster://:pw@redis-0.redis:6379,redis-1.redis:6379"
    rendered = render({"cache": {"url": url}, "counter": {"redis": {"url": url}}})
    secret = rendered.get("Secret", f"{RELEASE}-socialgraph-inline")
    for key in ("cache-redis-url", "counter-redis-url"):
        assert base64.b64decode(secret["data"][key]).decode() == url


def test_cache_url_is_passed_from_a_secret_to_relation_and_projection_only(default):
    # Off by default: no SG_CACHE__URL at all (the services' default, "", turns the caches off),
    # and nothing of the cache in any Secret.
    for name in CACHE_READERS:
        assert "SG_CACHE__URL" not in default.environment(name)
    assert not [s for s in default.of_kind("Secret") if "cache-redis-url" in s.get("data", {})]
    # Inline (trials): from the chart's Secret, to the two services that document the cache.
    inline = render({"cache": {"url": "redis://:cache-pw@cache-redis:6379/3", "keyPrefix": "c:"}})
    secret = inline.get("Secret", f"{RELEASE}-socialgraph-inline")
    assert base64.b64decode(secret["data"]["cache-redis-url"]).decode() == "redis://:cache-pw@cache-redis:6379/3"
    for name in CACHE_READERS:
        env = inline.environment(name)
        assert env["SG_CACHE__URL"] == {"secretKeyRef": {
            "name": f"{RELEASE}-socialgraph-inline", "key": "cache-redis-url"}}
        assert env["SG_CACHE__KEY_PREFIX"] == "c:"
        assert "cache-pw" not in json.dumps(inline.workload(name))
    assert not [v for v in inline.environment("counter") if v.startswith("SG_CACHE__")]
    # An existing Secret wins over an inline URL, which is then never rendered.
    existing = render({"cache": {"url": "redis://:cache-pw@cache-redis:6379/3",
                                 "existingSecret": "sg-cache", "existingSecretKey": "url"}})
    for name in CACHE_READERS:
        assert existing.environment(name)["SG_CACHE__URL"] == {"secretKeyRef": {"name": "sg-cache", "key": "url"}}
    assert not [v for v in existing.environment("counter") if v.startswith("SG_CACHE__")]
    assert "cache-pw" not in existing.all_text and "cache-redis-url" not in existing.all_text


def test_cache_settings_become_the_documented_variables(default):
    relation, projection = (default.environment(n) for n in CACHE_READERS)
    assert {k: v for k, v in relation.items() if k.startswith("SG_CACHE__")} == {
        "SG_CACHE__POOL_SIZE": "4", "SG_CACHE__TIMEOUT_MS": "100",
        "SG_CACHE__TTL_SECS": "3600", "SG_CACHE__FOLLOWING_MAX": "10000",
        "SG_CACHE__FOLLOWERS_WINDOW": "10000", "SG_CACHE__RELATIONSHIP_MAX": "10000",
        "SG_CACHE__FILL_SLOTS": "8", "SG_CACHE__FILL_AFTER_MISSES": "1",
        "SG_CACHE__FILL_ROWS_PER_SEC": "20000"}
    assert {k: v for k, v in projection.items() if k.startswith("SG_CACHE__")} == {
        "SG_CACHE__POOL_SIZE": "4", "SG_CACHE__TIMEOUT_MS": "100", "SG_CACHE__TTL_SECS": "3600",
        "SG_CACHE__FOLLOWING_MAX": "10000", "SG_CACHE__FOLLOWERS_WINDOW": "10000", "SG_CACHE__POSTS_WINDOW": "1000", "SG_CACHE__RELATIONSHIP_MAX": "10000",
        "SG_CACHE__DEEP_PAGES_PER_SEC": "50", "SG_CACHE__HOT_READS_PER_SEC": "50",
        "SG_CACHE__HOT_STALENESS_MS": "1000", "SG_CACHE__FILL_SLOTS": "8", "SG_CACHE__FILL_AFTER_MISSES": "1",
        "SG_CACHE__FILL_ROWS_PER_SEC": "20000"}
    rendered = render({
        "cache": {"keyPrefix": "sg-cache:"},
        "relation": {"cache": {"poolSize": 8, "timeoutMs": 50, "ttlSecs": 86400, "followingMax": 20000000}},
        "projection": {"cache": {"poolSize": 2, "timeoutMs": 250, "followersWindow": 50000, "postsWindow": 200, "deepPagesPerSec": 5}},
    })
    relation, projection = (rendered.environment(n) for n in CACHE_READERS)
    assert relation["SG_CACHE__KEY_PREFIX"] == projection["SG_CACHE__KEY_PREFIX"] == "sg-cache:"
    assert relation["SG_CACHE__POOL_SIZE"] == "8" and relation["SG_CACHE__TIMEOUT_MS"] == "50"
    assert relation["SG_CACHE__TTL_SECS"] == "86400"
    assert relation["SG_CACHE__FOLLOWING_MAX"] == "20000000"  # no float notation
    assert projection["SG_CACHE__POOL_SIZE"] == "2" and projection["SG_CACHE__TIMEOUT_MS"] == "250"
    assert projection["SG_CACHE__FOLLOWERS_WINDOW"] == "50000" and projection["SG_CACHE__DEEP_PAGES_PER_SEC"] == "5"
    assert projection["SG_CACHE__POSTS_WINDOW"] == "200"


# --- configuration -------------------------------------------------------------------------

# counter-svc's settings (from its config; used until the book documents them).
COUNTER_SETTINGS = {
    "SG_REDIS__URL", "SG_REDIS__KEY_PREFIX", "SG_REDIS__POOL_SIZE", "SG_REDIS__TIMEOUT_MS",
    "SG_KAFKA__BROKERS", "SG_KAFKA__COUNTER_TOPIC",
    "SG_KAFKA__CONTENT_TOPIC", "SG_KAFKA__PARTITIONS", "SG_KAFKA__REQUEST_DEADLINE_MS",
    "SG_CONSUMER__PARTITIONS", "SG_CONSUMER__MAX_WAIT_MS", "SG_CONSUMER__MAX_BYTES",
    "SG_CONSUMER__IDLE_MAX_MS", "SG_PROJECTION__URL", "SG_COUNTERS__CHECK_INTERVAL_SECS",
    "SG_COUNTERS__RELAY_QUIET_MS", "SG_KAFKA__MESSAGE_TOPIC", "SG_MESSAGE__URL", "SG_KAFKA__EDGE_COUNT_TOPIC",
    "SG_AUTH__ADMIN_TOKEN", "SG_SERVER__GRPC_ADDR", "SG_SERVER__ADMIN_ADDR",
    "SG_SERVER__REQUEST_TIMEOUT_MS", "SG_SERVER__CONCURRENCY_LIMIT",
    "SG_SERVER__CONCURRENCY_LIMIT_PER_CONNECTION", "SG_SERVER__DRAIN_TIMEOUT_MS",
}
NON_SG = {"RUST_LOG", "OTEL_EXPORTER_OTLP_ENDPOINT", "SG_LOG_FORMAT"}
# The gateway's settings (its contract; the book's `## gateway` table must list exactly these).
GATEWAY_SETTINGS = {
    "SG_HTTP__ADDR", "SG_HTTP__ADMIN_ADDR", "SG_HTTP__REQUEST_TIMEOUT_MS", "SG_HTTP__MAX_BODY_BYTES",
    "SG_HTTP__MAX_HEADER_BYTES", "SG_HTTP__CONCURRENCY_LIMIT", "SG_HTTP__DRAIN_TIMEOUT_MS",
    "SG_HTTP__CORS_ALLOWED_ORIGINS", "SG_HTTP__CORS_MAX_AGE_SECS", "SG_UPSTREAM__RELATION_URL",
    "SG_UPSTREAM__PROJECTION_URL", "SG_UPSTREAM__COUNTER_URL", "SG_UPSTREAM__MESSAGE_URL", "SG_UPSTREAM__CHANNELS",
    "SG_UPSTREAM__CONNECT_TIMEOUT_MS",
}


def _documented():
    documented = chartlib.documented_settings()
    documented.setdefault("counter", COUNTER_SETTINGS)
    return documented


def _setting(var: str, known: set[str]) -> str | None:
    """The documented key `var` sets (nested forms such as SG_CONSUMER__PARTITIONS__REPLICA__COUNT
    belong to SG_CONSUMER__PARTITIONS)."""
    for key in known:
        if var == key or var.startswith(key + "__"):
            return key
    return None


@pytest.mark.parametrize("variant", ["default", "production", "all-inline"])
def test_services_get_only_settings_they_know(variant):
    """The services refuse unknown SG_ keys at start-up: every variable must be documented."""
    rendered = render(VARIANTS[variant])
    documented = _documented()
    for name in COMPONENTS:
        for var in rendered.environment(name):
            if var in NON_SG:
                continue
            assert _setting(var, documented[name]), f"{name} does not read {var}"


def test_every_documented_setting_is_a_chart_value():
    rendered = render(ALL_INLINE)
    documented = _documented()
    # The book's `## gateway` table is read too, and holds the gateway's settings only.
    assert set(documented) == set(COMPONENTS)
    assert documented[GATEWAY] == GATEWAY_SETTINGS
    for name, known in documented.items():
        env = rendered.environment(name)
        covered = {_setting(var, known) for var in env}
        assert known <= covered, f"{name} settings with no chart value: {sorted(known - covered)}"


def test_values_become_the_documented_variables():
    values = merged(ALL_INLINE, {
        "kafka": {"brokers": ["kafka-0:9092", "kafka-1:9092"], "partitions": 24},
        "relation": {"limits": {"followingCap": 2000, "followBurst": 50, "followRefillPerDay": 100,
                                "onRedisError": "closed"},
                     "server": {"requestTimeoutMs": 4000}},
        "projection": {"consumer": {"maxBytes": 8388608}},
        "counter": {"counters": {"checkIntervalSecs": 60}},
        "log": {"format": "json", "level": "info,socialgraph_events=debug"},
    })
    rendered = render(values)
    relation, projection, counter = (rendered.environment(n) for n in SERVICES)
    assert json.loads(relation["SG_KAFKA__BROKERS"]) == ["kafka-0:9092", "kafka-1:9092"]
    assert relation["SG_KAFKA__PARTITIONS"] == counter["SG_KAFKA__PARTITIONS"] == "24"
    assert relation["SG_LIMITS__FOLLOWING_CAP"] == "2000"
    assert relation["SG_LIMITS__FOLLOW_BURST"] == "50"
    assert relation["SG_LIMITS__FOLLOW_REFILL_PER_DAY"] == "100"
    assert relation["SG_LIMITS__ON_REDIS_ERROR"] == "closed"
    assert relation["SG_SERVER__REQUEST_TIMEOUT_MS"] == "4000"
    assert relation["SG_SERVER__GRPC_ADDR"] == "[::]:50051"
    assert relation["SG_REDIS__KEY_PREFIX"] == counter["SG_REDIS__KEY_PREFIX"] == "sg-trial:"
    assert projection["SG_CONSUMER__MAX_BYTES"] == "8388608"  # no float notation
    assert counter["SG_COUNTERS__CHECK_INTERVAL_SECS"] == "60"
    assert counter["SG_KAFKA__COUNTER_TOPIC"] == "sg.counter.v1"
    for env in (relation, projection, counter):
        assert env["SG_LOG_FORMAT"] == "json"
        assert env["RUST_LOG"] == "info,socialgraph_events=debug"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
    assert "SG_LOG_FORMAT" not in render(ALL_INLINE).environment("relation")



def test_counter_settings_use_their_new_names_and_retired_ones_are_only_warned_about():
    """counters.verify_after_ms was renamed relay_quiet_ms: the chart renders the new variable,
    from the new value or, for one more release, from the old one (named in the notes as
    deprecated). projection_wait_ms (once rebuild_wait_ms) is retired: follow counts arrive as
    events, so nothing is rendered for it and the notes say it is ignored."""
    def notes(rendered):
        (text,) = [v for k, v in rendered.text.items() if k.endswith("NOTES.txt")]
        return text

    default = render(ALL_INLINE)
    env = default.environment("counter")
    assert env["SG_COUNTERS__RELAY_QUIET_MS"] == "2000"
    assert not {"SG_COUNTERS__REBUILD_WAIT_MS", "SG_COUNTERS__VERIFY_AFTER_MS", "SG_COUNTERS__PROJECTION_WAIT_MS"} & set(env)
    assert env["SG_KAFKA__EDGE_COUNT_TOPIC"] == "sg.edge_count.v1"
    assert default.environment("projection")["SG_KAFKA__EDGE_COUNT_TOPIC"] == "sg.edge_count.v1"
    assert "deprecated" not in notes(default) and "ignored" not in notes(default)
    new = render(merged(ALL_INLINE, {"counter": {"counters": {"relayQuietMs": 1500}}}))
    assert new.environment("counter")["SG_COUNTERS__RELAY_QUIET_MS"] == "1500"
    old = render(merged(ALL_INLINE, {"counter": {"counters": {"rebuildWaitMs": 7000, "projectionWaitMs": 8000, "verifyAfterMs": 900}}}))
    env = old.environment("counter")
    assert env["SG_COUNTERS__RELAY_QUIET_MS"] == "900"
    assert "SG_COUNTERS__PROJECTION_WAIT_MS" not in env
    text = notes(old)
    assert "WARNING: counter.counters.verifyAfterMs is deprecated" in text and "counter.counters.relayQuietMs" in text
    for retired in ("projectionWaitMs", "rebuildWaitMs"):
        assert f"WARNING: counter.counters.{retired} is ignored" in text


def test_both_cache_services_get_the_same_list_limits():
    """relation-svc writes follows through to the follower windows and relationship hashes
    projection-svc fills, and projection-svc keeps relation-svc's following lists from the
    events: each list's limits must be the same in both."""
    rendered = render(merged(ALL_INLINE, {
        "relation": {"cache": {"followingMax": 20000}},
        "projection": {"cache": {"followersWindow": 5000, "relationshipMax": 3000}},
    }))
    relation, projection = rendered.environment("relation"), rendered.environment("projection")
    for key, value in (("FOLLOWING_MAX", "20000"), ("FOLLOWERS_WINDOW", "5000"), ("RELATIONSHIP_MAX", "3000")):
        assert relation[f"SG_CACHE__{key}"] == projection[f"SG_CACHE__{key}"] == value, key

def _checksums(rendered):
    return {n: rendered.workload(n)["spec"]["template"]["metadata"]["annotations"] for n in COMPONENTS}


@pytest.mark.parametrize("base, change, rolled", [
    (ALL_INLINE, {"relation": {"limits": {"followingCap": 1234}}}, {"relation"}),
    (ALL_INLINE, {"kafka": {"partitions": 16}}, {"relation", "projection", "counter", MESSAGE}),
    (ALL_INLINE, {"counter": {"counters": {"checkIntervalSecs": 30}}}, {"counter"}),
    (ALL_INLINE, {"auth": {"adminToken": "rotated"}}, {"relation", "projection", "counter"}),
    (ALL_INLINE, {"auth": {"pageTokenSecret": "rotated"}}, {"relation", "projection", MESSAGE}),
    # projection-svc has its own database in ALL_INLINE, and shares relation-svc's by default
    # (message-svc shares it in both)
    (ALL_INLINE, {"database": {"url": "postgres://other@db/sg"}}, {"relation", MESSAGE}),
    ({}, {"database": {"url": "postgres://other@db/sg"}}, {"relation", "projection", MESSAGE}),
    ({}, {"database": {"existingSecret": "pg"}}, {"relation", "projection", MESSAGE}),
    (ALL_INLINE, {"projection": {"database": {"url": "postgres://other@db/p"}}}, {"projection"}),
    (ALL_INLINE, {"counter": {"redis": {"url": "redis://other:6379"}}}, {"counter"}),
    ({}, {"redis": {"url": "redis://other:6379"}}, {"relation", "counter"}),
    ({}, {"cache": {"url": "redis://cache:6379"}}, {"relation", "projection"}),
    (ALL_INLINE, {"cache": {"url": "redis://other-cache:6379"}}, {"relation", "projection"}),
    (ALL_INLINE, {"cache": {"existingSecret": "sg-cache"}}, {"relation", "projection"}),
    (ALL_INLINE, {"cache": {"keyPrefix": "other:"}}, {"relation", "projection"}),
    (ALL_INLINE, {"relation": {"cache": {"ttlSecs": 60}}}, {"relation"}),
    (ALL_INLINE, {"projection": {"cache": {"timeoutMs": 500}}}, {"projection"}),
    # The gateway reads no secret and no store setting, but follows the services' addresses.
    (ALL_INLINE, {"gateway": {"http": {"corsAllowedOrigins": ["https://app.example.com"]}}}, {GATEWAY}),
    (ALL_INLINE, {"gateway": {"upstream": {"channels": 8}}}, {GATEWAY}),
    # projection-svc (rebuilds) and the gateway call relation-svc; message-svc no more.
    ({}, {"relation": {"ports": {"grpc": 6001}}}, {"relation", "projection", GATEWAY}),
    ({}, {"counter": {"ports": {"grpc": 6003}}}, {"counter", GATEWAY}),
    # counter-svc (unread rebuilds) and the gateway (the message routes) call message-svc.
    ({}, {MESSAGE: {"ports": {"grpc": 6004}}}, {MESSAGE, "counter", GATEWAY}),
    ({}, {"log": {"level": "debug"}}, {"relation", "projection", "counter", MESSAGE, GATEWAY}),
])
def test_config_changes_roll_exactly_the_pods_that_read_them(base, change, rolled):
    before = _checksums(render(base))
    after = _checksums(render(merged(base, change)))
    changed = {n for n in COMPONENTS if before[n] != after[n]}
    assert changed == rolled
    for n in COMPONENTS:
        assert set(after[n]) >= {"checksum/config", "checksum/secret"}


# --- hardening -----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production"])
def test_pods_are_hardened(variant):
    rendered = render(VARIANTS[variant])
    pods = list(rendered.pod_specs())
    assert len(pods) == 6  # four services, the gateway, the migration Job
    for obj, pod in pods:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] == 10001, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False, where
        # Kubernetes' service-link variables would collide with the SG_ prefix.
        assert pod["enableServiceLinks"] is False, where
        tmp = [v for v in pod["volumes"] if v["name"] == "tmp"]
        assert tmp and "emptyDir" in tmp[0], where
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["runAsNonRoot"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], where
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], where


def test_service_account_is_created_without_a_token(default):
    (sa,) = default.of_kind("ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    for name in COMPONENTS:
        assert default.workload(name)["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


# --- selectors, PDBs, monitoring, network policy -------------------------------------------


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("variant", ["default", "production"])
def test_services_pdbs_and_policies_select_their_own_pods_only(variant):
    rendered = render(VARIANTS[variant])
    pod_labels = {n: rendered.workload(n)["spec"]["template"]["metadata"]["labels"] for n in COMPONENTS}
    for name in COMPONENTS:
        workload = rendered.workload(name)
        assert _selects(workload["spec"]["selector"]["matchLabels"], pod_labels[name])
        selectors = [rendered.get("Service", f"{RELEASE}-{name}")["spec"]["selector"],
                     rendered.get("PodDisruptionBudget", f"{RELEASE}-{name}")["spec"]["selector"]["matchLabels"]]
        policy = rendered.find("NetworkPolicy", f"{RELEASE}-{name}")
        if policy:
            selectors.append(policy["spec"]["podSelector"]["matchLabels"])
        for selector in selectors:
            matched = {n for n in COMPONENTS if _selects(selector, pod_labels[n])}
            assert matched == {name}, (name, selector)


def test_each_service_has_a_disruption_budget(production):
    for name in COMPONENTS:
        pdb = production.get("PodDisruptionBudget", f"{RELEASE}-{name}")
        assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    rendered = render({"projection": {"pdb": {"minAvailable": "50%"}}, "counter": {"pdb": {"enabled": False}}})
    assert rendered.get("PodDisruptionBudget", f"{RELEASE}-projection")["spec"]["minAvailable"] == "50%"
    assert rendered.find("PodDisruptionBudget", f"{RELEASE}-counter") is None


def test_service_monitors_scrape_metrics_on_the_admin_port(production):
    monitors = production.of_kind("ServiceMonitor")
    assert len(monitors) == len(COMPONENTS)
    for name in COMPONENTS:
        monitor = production.get("ServiceMonitor", f"{RELEASE}-{name}")
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        service = production.get("Service", f"{RELEASE}-{name}")
        assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        assert [s for s in production.of_kind("Service")
                if _selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
                and any(p["name"] == "admin" for p in s["spec"]["ports"])] == [service]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "admin" and endpoint["path"] == "/metrics"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [chartlib.NAMESPACE]}


def test_network_policies_admit_only_the_named_callers(production):
    values = chartlib.production_values()
    # The chart's own callers: projection-svc rebuilds from relation-svc, counter-svc copies
    # projection-svc's counts and rebuilds message-svc's unread counts, the gateway calls all
    # four. message-svc calls nothing (blocks come from the account events).
    internal = {"relation": ["projection", GATEWAY], "projection": ["counter", GATEWAY], "counter": [GATEWAY],
                MESSAGE: ["counter", GATEWAY], GATEWAY: []}
    for name in COMPONENTS:
        policy = production.get("NetworkPolicy", f"{RELEASE}-{name}")
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        rules = {r["ports"][0]["port"]: r["from"] for r in policy["spec"]["ingress"]}
        assert all(len(r["ports"]) == 1 for r in policy["spec"]["ingress"])
        serving = "http" if name == GATEWAY else "grpc"
        expected = list(values[name]["networkPolicy"]["allowFrom"])
        own = rules[serving][:len(internal[name])]
        for peer, caller in zip(own, internal[name]):
            caller_labels = production.workload(caller)["spec"]["template"]["metadata"]["labels"]
            assert peer.keys() == {"podSelector"}
            assert {n for n in COMPONENTS if _selects(
                peer["podSelector"]["matchLabels"],
                production.workload(n)["spec"]["template"]["metadata"]["labels"])} == {caller}
            assert _selects(peer["podSelector"]["matchLabels"], caller_labels)
        expected = own + expected
        assert rules == {serving: expected, "admin": values["networkPolicy"]["metricsFrom"]}


def _component_peer(component: str) -> list:
    return sorted({"app.kubernetes.io/component": component, "app.kubernetes.io/instance": RELEASE,
                   "app.kubernetes.io/name": "socialgraph"}.items())


def test_network_policy_without_callers_admits_nobody_from_outside():
    rendered = render(VARIANTS["network-policy-without-callers"])
    assert rendered.get("NetworkPolicy", f"{RELEASE}-{GATEWAY}")["spec"]["ingress"] == []
    for name, callers in (("relation", ["projection", GATEWAY]), ("projection", ["counter", GATEWAY]),
                          ("counter", [GATEWAY]), (MESSAGE, ["counter", GATEWAY])):
        ingress = rendered.get("NetworkPolicy", f"{RELEASE}-{name}")["spec"]["ingress"]
        assert [r["ports"] for r in ingress] == [[{"port": "grpc", "protocol": "TCP"}]]
        assert [list(p["podSelector"]["matchLabels"].items()) for p in ingress[0]["from"]] == [
            _component_peer(c) for c in callers]
    # Without the gateway, only the services' own calls remain.
    without = render(merged(VARIANTS["network-policy-without-callers"], {"gateway": {"enabled": False}}))
    assert without.get("NetworkPolicy", f"{RELEASE}-counter")["spec"]["ingress"] == []
    relation = without.get("NetworkPolicy", f"{RELEASE}-relation")["spec"]["ingress"]
    assert [list(p["podSelector"]["matchLabels"].items()) for p in relation[0]["from"]] == [
        _component_peer("projection")]
    message = without.get("NetworkPolicy", f"{RELEASE}-{MESSAGE}")["spec"]["ingress"]
    assert [list(p["podSelector"]["matchLabels"].items()) for p in message[0]["from"]] == [
        _component_peer("counter")]
    assert without.find("NetworkPolicy", f"{RELEASE}-{GATEWAY}") is None


# --- the gateway ---------------------------------------------------------------------------


def _gateway_objects(rendered):
    return [o for o in rendered.objects
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == GATEWAY
            or GATEWAY in o["metadata"]["name"]]


@pytest.mark.parametrize("variant", ["default", "production", "all-inline"])
def test_gateway_is_a_stateless_deployment_of_the_same_image(variant):
    rendered = render(VARIANTS[variant])
    deployment = rendered.workload(GATEWAY)
    assert deployment["kind"] == "Deployment"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]["spec"]
    container = rendered.container(GATEWAY)
    relation = rendered.container("relation")
    assert container["name"] == GATEWAY
    assert container["command"] == ["/usr/local/bin/gateway"] and container["args"] == ["serve"]
    assert (container["image"], container["imagePullPolicy"]) == (relation["image"], relation["imagePullPolicy"])
    # The same pod template as the services: hardening, service account, /tmp, spread.
    relation_pod = rendered.workload("relation")["spec"]["template"]["spec"]
    for key in ("securityContext", "serviceAccountName", "automountServiceAccountToken", "enableServiceLinks",
                "volumes", "imagePullSecrets"):
        assert pod.get(key) == relation_pod.get(key), key
    assert container["securityContext"] == relation["securityContext"]
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == GATEWAY
    # Stateless and holding no secret: no volume but /tmp, no variable from a Secret, nothing
    # of a store in its settings.
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    env = rendered.environment(GATEWAY)
    assert not [k for k, v in env.items() if not isinstance(v, str)], env
    assert not [k for k in env if k.split("__")[0] in (
        "SG_DATABASE", "SG_REDIS", "SG_CACHE", "SG_KAFKA", "SG_AUTH", "SG_SERVER", "SG_CONSUMER")]
    assert "env" not in container
    assert "checksum/config" in deployment["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize("variant", ["default", "gateway-fixed-replicas-custom-ports"])
def test_gateway_ports_probes_and_service(variant):
    values = VARIANTS[variant]
    http_port, admin_port = (8000, 9000) if values else GATEWAY_PORTS
    rendered = render(values)
    container = rendered.container(GATEWAY)
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": http_port, "admin": admin_port}
    paths = {"startupProbe": "/live", "livenessProbe": "/live", "readinessProbe": "/ready"}
    for probe, path in paths.items():
        spec = container[probe]
        assert spec["httpGet"] == {"port": admin_port, "path": path, "scheme": "HTTP"}, probe
        assert not {"grpc", "tcpSocket", "exec"} & spec.keys()
    env = rendered.environment(GATEWAY)
    assert env["SG_HTTP__ADDR"] == f"0.0.0.0:{http_port}"
    assert env["SG_HTTP__ADMIN_ADDR"] == f"0.0.0.0:{admin_port}"
    service = rendered.get("Service", f"{RELEASE}-{GATEWAY}")
    assert service["spec"]["type"] == "ClusterIP"
    assert {p["name"]: (p["port"], p["targetPort"], p["appProtocol"]) for p in service["spec"]["ports"]} == {
        "http": (http_port, "http", "http"), "admin": (admin_port, "admin", "http")}
    # A Deployment: no headless Service.
    assert rendered.find("Service", f"{RELEASE}-{GATEWAY}-headless") is None
    if values:
        assert rendered.workload(GATEWAY)["spec"]["replicas"] == 3
        assert rendered.find("HorizontalPodAutoscaler", f"{RELEASE}-{GATEWAY}") is None
        assert rendered.get("PodDisruptionBudget", f"{RELEASE}-{GATEWAY}")["spec"]["minAvailable"] == 2
        assert {"name": "SG_TRACE_FILTER", "value": "debug"} in container["env"]


def test_gateway_listens_on_ipv6_when_asked():
    env = render(ALL_INLINE).environment(GATEWAY)
    assert env["SG_HTTP__ADDR"] == "[::]:8080" and env["SG_HTTP__ADMIN_ADDR"] == "[::]:9104"


@pytest.mark.parametrize("drain_ms, pre_stop, extra", [(10000, 5, 5), (30500, 0, 2)])
def test_gateway_termination_grace_covers_pre_stop_and_drain_time(drain_ms, pre_stop, extra):
    rendered = render({GATEWAY: {"http": {"drainTimeoutMs": drain_ms}, "preStopSleepSeconds": pre_stop,
                                 "terminationGraceExtraSeconds": extra}})
    pod = rendered.workload(GATEWAY)["spec"]["template"]["spec"]
    assert rendered.environment(GATEWAY)["SG_HTTP__DRAIN_TIMEOUT_MS"] == str(drain_ms)
    assert pod["terminationGracePeriodSeconds"] == pre_stop + math.ceil(drain_ms / 1000) + extra
    lifecycle = rendered.container(GATEWAY).get("lifecycle")
    assert lifecycle == ({"preStop": {"sleep": {"seconds": pre_stop}}} if pre_stop else None)


def test_gateway_settings_become_the_documented_variables(default):
    env = default.environment(GATEWAY)
    assert {k: v for k, v in env.items() if k.startswith("SG_")} == {
        "SG_HTTP__ADDR": "0.0.0.0:8080",
        "SG_HTTP__ADMIN_ADDR": "0.0.0.0:9104",
        "SG_HTTP__REQUEST_TIMEOUT_MS": "10000",
        "SG_HTTP__MAX_BODY_BYTES": "1048576",
        "SG_HTTP__MAX_HEADER_BYTES": "16384",
        "SG_HTTP__CONCURRENCY_LIMIT": "1024",
        "SG_HTTP__DRAIN_TIMEOUT_MS": "10000",
        "SG_HTTP__CORS_ALLOWED_ORIGINS": "[]",
        "SG_HTTP__CORS_MAX_AGE_SECS": "600",
        "SG_UPSTREAM__RELATION_URL": f"http://{RELEASE}-relation:50051",
        "SG_UPSTREAM__PROJECTION_URL": f"http://{RELEASE}-projection:50052",
        "SG_UPSTREAM__COUNTER_URL": f"http://{RELEASE}-counter:50053",
        "SG_UPSTREAM__MESSAGE_URL": f"http://{RELEASE}-message:50054",
        "SG_UPSTREAM__CHANNELS": "4",
        "SG_UPSTREAM__CONNECT_TIMEOUT_MS": "2000",
        "SG_LOG_FORMAT": "json",
    }
    assert env["RUST_LOG"] == "info"
    rendered = render({
        "log": {"level": "info,tower_http=debug"},
        "otel": {"endpoint": "http://otel-collector:4317"},
        GATEWAY: {
            "logLevel": "debug",
            "http": {"requestTimeoutMs": 2500, "maxBodyBytes": 8388608, "maxHeaderBytes": 32768,
                     "concurrencyLimit": 4096, "drainTimeoutMs": 20000,
                     "corsAllowedOrigins": ["https://app.example.com", "http://localhost:3000"],
                     "corsMaxAgeSecs": 86400},
            "upstream": {"channels": 16, "connectTimeoutMs": 500,
                         "relationUrl": "http://relation.graph.example.com:50051"},
        },
    })
    env = rendered.environment(GATEWAY)
    assert env["SG_HTTP__REQUEST_TIMEOUT_MS"] == "2500"
    assert env["SG_HTTP__MAX_BODY_BYTES"] == "8388608"  # no float notation
    assert env["SG_HTTP__MAX_HEADER_BYTES"] == "32768"
    assert env["SG_HTTP__CONCURRENCY_LIMIT"] == "4096"
    assert env["SG_HTTP__DRAIN_TIMEOUT_MS"] == "20000"
    # A TOML-style list, like SG_KAFKA__BROKERS.
    assert env["SG_HTTP__CORS_ALLOWED_ORIGINS"] == '["https://app.example.com","http://localhost:3000"]'
    assert json.loads(env["SG_HTTP__CORS_ALLOWED_ORIGINS"]) == ["https://app.example.com", "http://localhost:3000"]
    assert env["SG_HTTP__CORS_MAX_AGE_SECS"] == "86400"
    assert env["SG_UPSTREAM__CHANNELS"] == "16" and env["SG_UPSTREAM__CONNECT_TIMEOUT_MS"] == "500"
    assert env["SG_UPSTREAM__RELATION_URL"] == "http://relation.graph.example.com:50051"
    assert env["SG_UPSTREAM__PROJECTION_URL"] == f"http://{RELEASE}-projection:50052"
    assert env["RUST_LOG"] == "debug"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
    assert json.loads(render({GATEWAY: {"http": {"corsAllowedOrigins": ["*"]}}})
                      .environment(GATEWAY)["SG_HTTP__CORS_ALLOWED_ORIGINS"]) == ["*"]


@pytest.mark.parametrize("values, prefix", [
    ({}, RELEASE),
    ({"fullnameOverride": "graph"}, "graph"),
    ({n: {"ports": {"grpc": 6000 + i}} for i, n in enumerate(SERVICES)}, RELEASE),
])
def test_gateway_upstreams_are_the_charts_own_services(values, prefix):
    rendered = render(values)
    env = rendered.get("ConfigMap", f"{prefix}-{GATEWAY}")["data"]
    (container,) = rendered.get("Deployment", f"{prefix}-{GATEWAY}")["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"configMapRef": {"name": f"{prefix}-{GATEWAY}"}}]
    for name in SERVICES:
        url = env[f"SG_UPSTREAM__{name.upper()}_URL"]
        service = rendered.get("Service", f"{prefix}-{name}")
        (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
        assert url == f"http://{service['metadata']['name']}:{grpc['port']}"
        # The Service selects the service's pods, which listen on that port.
        pods = rendered.get("StatefulSet" if name in CONSUMERS else "Deployment", f"{prefix}-{name}")
        assert _selects(service["spec"]["selector"], pods["spec"]["template"]["metadata"]["labels"])
        (container,) = pods["spec"]["template"]["spec"]["containers"]
        assert {"name": "grpc", "containerPort": grpc["port"], "protocol": "TCP"} in container["ports"]


def test_gateway_can_call_the_services_of_another_installation():
    rendered = render(VARIANTS["production-without-projection-and-counter"])
    env = rendered.environment(GATEWAY)
    assert env["SG_UPSTREAM__RELATION_URL"] == f"http://{RELEASE}-relation:50051"
    assert env["SG_UPSTREAM__PROJECTION_URL"] == "http://projection.graph:50052"
    assert env["SG_UPSTREAM__COUNTER_URL"] == "http://counter.graph:50053"


@pytest.mark.parametrize("variant", ["default", "production", "all-inline"])
def test_gateway_disabled_renders_no_gateway_objects(variant):
    enabled = render(VARIANTS[variant])
    kinds = {o["kind"] for o in _gateway_objects(enabled)}
    expected = {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"}
    if variant != "all-inline":
        expected.add("HorizontalPodAutoscaler")
    if variant == "production":
        expected |= {"ServiceMonitor", "NetworkPolicy"}
    assert kinds == expected
    rendered = render(merged(VARIANTS[variant], {GATEWAY: {"enabled": False}}))
    assert _gateway_objects(rendered) == []
    assert GATEWAY not in rendered.all_text
    assert len(rendered.objects) == len(enabled.objects) - len(_gateway_objects(enabled))
    # Nothing else changes but the services' network policies, which no longer admit it.
    others = {(o["kind"], o["metadata"]["name"]): o for o in enabled.objects if o not in _gateway_objects(enabled)}
    for obj in rendered.objects:
        if obj["kind"] != "NetworkPolicy":
            assert obj == others[(obj["kind"], obj["metadata"]["name"])]


def test_gateway_disabled_needs_neither_projection_nor_counter():
    render({"projection": {"enabled": False}, "counter": {"enabled": False}, GATEWAY: {"enabled": False}})


def test_notes_name_the_gateway():
    notes = chartlib.chart().render({}, name=RELEASE, namespace=chartlib.NAMESPACE)
    (text,) = [v for k, v in notes.items() if k.endswith("NOTES.txt")]
    assert f"http://{RELEASE}-gateway.{chartlib.NAMESPACE}.svc:8080" in text
    assert "/openapi.json" in text and "WARNING: gateway.http.corsAllowedOrigins" not in text
    star = chartlib.chart().render({GATEWAY: {"http": {"corsAllowedOrigins": ["*"]}}},
                                   name=RELEASE, namespace=chartlib.NAMESPACE)
    (text,) = [v for k, v in star.items() if k.endswith("NOTES.txt")]
    assert "WARNING: gateway.http.corsAllowedOrigins" in text


# --- values.schema.json --------------------------------------------------------------------

INVALID = {
    "replicas given as a word": ({"projection": {"replicas": "three"}}, "/projection/replicas", "want integer"),
    "negative replicas": ({"counter": {"replicas": -1}}, "/counter/replicas", "minimum"),
    "zero relation replicas": ({"relation": {"replicas": 0}}, "/relation/replicas", "minimum"),
    "fractional replicas": ({"projection": {"replicas": 2.5}}, "/projection/replicas", "want integer"),
    "no database at all": ({"database": {"url": "", "existingSecret": ""}}, "/database", "anyOf"),
    "no redis at all": ({"redis": {"url": "", "existingSecret": ""}}, "/redis/existingSecret", "minLength"),
    "no kafka brokers": ({"kafka": {"brokers": []}}, "/kafka/brokers", "minItems"),
    "existing secret given as a list": ({"database": {"existingSecret": ["pg"]}}, "/database/existingSecret",
                                        "want string"),
    "counter redis secret without key": ({"counter": {"redis": {"existingSecret": "r", "existingSecretKey": ""}}},
                                         "/counter/redis/existingSecretKey", "pattern"),
    "empty existing secret key": ({"database": {"existingSecret": "pg", "existingSecretKey": ""}},
                                  "/database/existingSecretKey", "pattern"),
    "invalid secret name": ({"auth": {"existingSecret": "Auth_Secret"}}, "/auth/existingSecret", "pattern"),
    "database url of another scheme": ({"database": {"url": "http://db:5432"}}, "/database/url", "pattern"),
    "broker without port": ({"kafka": {"brokers": ["kafka"]}}, "/kafka/brokers/0", "pattern"),
    "brokers as one string": ({"kafka": {"brokers": "kafka:9092"}}, "/kafka/brokers", "want array"),
    "zero partitions": ({"kafka": {"partitions": 0}}, "/kafka/partitions", "minimum"),
    "unknown redis error mode": ({"relation": {"limits": {"onRedisError": "maybe"}}},
                                 "/relation/limits/onRedisError", "'open', 'closed'"),
    "negative following cap": ({"relation": {"limits": {"followingCap": -5}}},
                               "/relation/limits/followingCap", "minimum"),
    "rate limit as a string": ({"relation": {"limits": {"followBurst": "100"}}},
                               "/relation/limits/followBurst", "want integer"),
    "port out of range": ({"relation": {"ports": {"grpc": 70000}}}, "/relation/ports/grpc", "maximum"),
    "log format": ({"log": {"format": "xml"}}, "/log/format", "'json', 'text'"),
    "cache url of another scheme": ({"cache": {"url": "memcached://cache:11211"}}, "/cache/url", "pattern"),
    "zero cache pool": ({"relation": {"cache": {"poolSize": 0}}}, "/relation/cache/poolSize", "minimum"),
    "cache ttl as a string": ({"relation": {"cache": {"ttlSecs": "1h"}}}, "/relation/cache/ttlSecs",
                              "want integer"),
    "negative longest cached list": ({"relation": {"cache": {"followingMax": -1}}},
                                     "/relation/cache/followingMax", "minimum"),
    "deep pages of projection-svc off": ({"projection": {"cache": {"deepPagesPerSec": 0}}},
                                         "/projection/cache/deepPagesPerSec", "minimum"),
    "following window on projection-svc": ({"projection": {"cache": {"followingMax": 10}}}, "/projection/cache",
                                           "'followingMax' not allowed"),
    "otlp endpoint without scheme": ({"otel": {"endpoint": "collector:4317"}}, "/otel/endpoint", "pattern"),
    "misspelt key": ({"relation": {"replica": 3}}, "/relation", "'replica' not allowed"),
    "unknown top-level key": ({"relations": {}}, "", "'relations' not allowed"),
    "negative drain time": ({"counter": {"server": {"drainTimeoutMs": -1}}},
                            "/counter/server/drainTimeoutMs", "minimum"),
    "pdb as a word": ({"relation": {"pdb": {"maxUnavailable": "half"}}}, "/relation/pdb/maxUnavailable", "oneOf"),
    "scrape interval in words": ({"serviceMonitor": {"interval": "30 seconds"}},
                                 "/serviceMonitor/interval", "pattern"),
    "network peer not an object": ({"relation": {"networkPolicy": {"allowFrom": ["bff"]}}},
                                   "/relation/networkPolicy/allowFrom/0", "want object"),
    "image digest malformed": ({"image": {"digest": "sha256:xyz"}}, "/image/digest", "pattern"),
    "probe threshold zero": ({"relation": {"probes": {"liveness": {"periodSeconds": 10, "timeoutSeconds": 1,
                                                                    "failureThreshold": 0}}}},
                             "/relation/probes/liveness/failureThreshold", "minimum"),
    "gateway enabled as a word": ({"gateway": {"enabled": "yes"}}, "/gateway/enabled", "want boolean"),
    "gateway grpc port": ({"gateway": {"ports": {"grpc": 50054}}}, "/gateway/ports", "'grpc' not allowed"),
    "gateway port out of range": ({"gateway": {"ports": {"http": 0}}}, "/gateway/ports/http", "minimum"),
    "gateway server section": ({"gateway": {"server": {"requestTimeoutMs": 1000}}}, "/gateway",
                               "'server' not allowed"),
    "gateway zero request timeout": ({"gateway": {"http": {"requestTimeoutMs": 0}}},
                                     "/gateway/http/requestTimeoutMs", "minimum"),
    "gateway body limit as a size": ({"gateway": {"http": {"maxBodyBytes": "1Mi"}}},
                                     "/gateway/http/maxBodyBytes", "want integer"),
    "gateway zero concurrency": ({"gateway": {"http": {"concurrencyLimit": 0}}},
                                 "/gateway/http/concurrencyLimit", "minimum"),
    "cors origins as one string": ({"gateway": {"http": {"corsAllowedOrigins": "https://app.example.com"}}},
                                   "/gateway/http/corsAllowedOrigins", "want array"),
    "cors origin with a path": ({"gateway": {"http": {"corsAllowedOrigins": ["https://app.example.com/"]}}},
                                "/gateway/http/corsAllowedOrigins/0", "pattern"),
    "cors origin without scheme": ({"gateway": {"http": {"corsAllowedOrigins": ["app.example.com"]}}},
                                   "/gateway/http/corsAllowedOrigins/0", "pattern"),
    "gateway upstream not a URL": ({"gateway": {"upstream": {"relationUrl": "sg-relation:50051"}}},
                                   "/gateway/upstream/relationUrl", "pattern"),
    "gateway zero channels": ({"gateway": {"upstream": {"channels": 0}}}, "/gateway/upstream/channels", "minimum"),
    "gateway too many channels": ({"gateway": {"upstream": {"channels": 65}}}, "/gateway/upstream/channels", "maximum"),
    "gateway upstream over TLS": ({"gateway": {"upstream": {"counterUrl": "https://c:50053"}}},
                                  "/gateway/upstream/counterUrl", "pattern"),
    "gateway upstream with a path": ({"gateway": {"upstream": {"counterUrl": "http://c:50053/api"}}},
                                     "/gateway/upstream/counterUrl", "pattern"),
    "cors origin in upper case": ({"gateway": {"http": {"corsAllowedOrigins": ["HTTPS://APP.EXAMPLE.COM"]}}},
                                  "/gateway/http/corsAllowedOrigins/0", "pattern"),
    "gateway misspelt upstream key": ({"gateway": {"upstream": {"relationURL": "http://r:50051"}}},
                                      "/gateway/upstream", "'relationURL' not allowed"),
    "gateway probes without readiness": ({"gateway": {"probes": {"readiness": None}}}, "/gateway/probes",
                                         "missing property 'readiness'"),
}


def test_every_value_the_schema_accepts_is_documented_in_values_yaml():
    """values.yaml is the reference of the settings: each key of the schema has a commented
    default there (except Helm's `global`, and optional probe delays and resource claims)."""
    schema = chartlib.chart().schema
    values = yaml.safe_load((chartlib.CHART_DIR / "values.yaml").read_text())
    optional = {"global", "claims", "initialDelaySeconds"}

    def resolve(node):
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
        return node

    def walk(node, value, path):
        node = resolve(node)
        if node.get("additionalProperties") is not False or not isinstance(value, dict):
            return
        missing = set(node["properties"]) - set(value) - optional
        assert not missing, f"{path or '/'}: {sorted(missing)} not in values.yaml"
        for key, child in value.items():
            walk(node["properties"][key], child, f"{path}/{key}")

    walk(schema, values, "")


@pytest.mark.parametrize("case", list(INVALID))
def test_schema_rejects_invalid_values_naming_the_key(case):
    values, pointer, reason = INVALID[case]
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    message = str(err.value)
    assert f"at '{pointer}" in message and reason in message, message


def test_schema_rejects_a_production_file_that_forgets_its_secret_names():
    values = chartlib.production_values()
    values["database"] = {"url": "", "existingSecret": "", "existingSecretKey": "url"}
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert "at '/database'" in str(err.value) and "anyOf" in str(err.value)
    report = chartlib.lint(values)
    assert any(m["severity"] == 3 for m in report["messages"]), report


@pytest.mark.parametrize("values, message", [
    ({"projection": {"replicas": 13}}, "projection.replicas (13) is larger than kafka.partitions (12)"),
    ({"counter": {"replicas": 4}, "kafka": {"partitions": 3}}, "counter.replicas (4) is larger than kafka.partitions (3)"),
    ({"relation": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "maxReplicas (2) is smaller than"),
    ({"relation": {"autoscaling": {"targetCPUUtilizationPercentage": None}}}, "without a target"),
    ({"projection": {"enabled": False}}, "counter.enabled needs projection-svc"),
    ({"gateway": {"autoscaling": {"minReplicas": 4, "maxReplicas": 3}}},
     "gateway.autoscaling.maxReplicas (3) is smaller than gateway.autoscaling.minReplicas (4)"),
    ({"gateway": {"autoscaling": {"targetCPUUtilizationPercentage": None}}}, "gateway.autoscaling is enabled without a target"),
    ({"counter": {"enabled": False}}, "gateway.enabled needs counter-svc: enable counter, set gateway.upstream.counterUrl"),
    ({"projection": {"enabled": False}, "counter": {"enabled": False}},
     "gateway.enabled needs projection-svc: enable projection, set gateway.upstream.projectionUrl"),
])
def test_inconsistent_values_fail_with_a_message(values, message):
    with pytest.raises(helm.HelmRenderError) as err:
        render(values)
    assert message in str(err.value)


# --- the image the chart runs --------------------------------------------------------------


def test_dockerfile_builds_every_binary_the_chart_runs():
    dockerfile = (chartlib.REPO / "Dockerfile").read_text()
    built = set(re.findall(r"--bin ([a-z-]+)", dockerfile))
    commands = set()
    for variant in ("default", "production", "all-inline"):
        for _, pod in render(VARIANTS[variant]).pod_specs():
            for c in pod.get("initContainers", []) + pod["containers"]:
                (command,) = c["command"]
                commands.add(command)
    assert commands == {f"/usr/local/bin/{n}-svc" for n in SERVICES + (MESSAGE,)} | {"/usr/local/bin/gateway"}
    assert {c.rsplit("/", 1)[1] for c in commands} <= built
    assert "socialgraph" in built
    # Every built binary is copied out of the cache-mounted target/ into the image.
    (copied,) = re.findall(r"&& cp (.*?) /out/$", dockerfile, re.M | re.S)
    assert set(re.findall(r"target/release/([a-z-]+)", copied)) == built
    (exposed,) = re.findall(r"^EXPOSE (.+)$", dockerfile, re.M)
    ports = {p for n in SERVICES for p in DEFAULT_PORTS[n]} | set(MESSAGE_PORTS) | set(GATEWAY_PORTS)
    assert set(map(int, exposed.split())) == ports
    assert re.search(r"^COPY --from=builder .* /usr/local/bin/$", dockerfile, re.M)
    assert re.search(r"^USER 10001:10001$", dockerfile, re.M)
    assert re.search(r"^FROM rust:1\.95-bookworm AS builder$", dockerfile, re.M)
    assert re.search(r"^FROM debian:bookworm-slim$", dockerfile, re.M)
