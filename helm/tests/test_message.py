"""message-svc in the chart: a Deployment like relation-svc (outbox, relay, HPA, PDB,
NetworkPolicy, ServiceMonitor) on gRPC 50054 and admin 9105 (the gateway has 9104), given exactly
the config sections its binary accepts, with an optional database of its own, called by
counter-svc (the unread counters), and entirely absent when disabled."""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess

import helm_python as helm
import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv

import chartlib
from chartlib import GATEWAY, MESSAGE, MESSAGE_PORTS, NAMESPACE, RELEASE, merged, render
from test_chart import ALL_INLINE, NON_SG, VARIANTS
from test_monitoring import MONITORING, _rule_object, _series, _write_rules, promtool

NAME = f"{RELEASE}-{MESSAGE}"
MONITORED = {"serviceMonitor": {"enabled": True}, "networkPolicy": {"enabled": True}, **MONITORING}
# message-svc on a database of its own, given inline (trials) or from an existing Secret.
OWN_DB_INLINE = {MESSAGE: {"database": {"url": "postgres://msg:msg-password@message-db:5432/messages"}}}
OWN_DB_SECRET = {MESSAGE: {"database": {"existingSecret": "socialgraph-message-postgres", "existingSecretKey": "url"}}}


def _message_objects(rendered: chartlib.Rendered) -> list[dict]:
    return [o for o in rendered.objects
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == MESSAGE
            or MESSAGE in o["metadata"]["name"]]


# --- what message-svc's binary accepts, read from its source --------------------------------


def _rust_struct_fields(path: str, struct: str) -> dict[str, str]:
    """Field name -> type of `pub struct <struct> { ... }` in a Rust source of the repository."""
    text = (chartlib.REPO / path).read_text()
    body = re.search(r"pub struct " + struct + r" \{\n(.*?)\n\}", text, re.S)
    assert body, f"no struct {struct} in {path}"
    return dict(re.findall(r"^\s*pub (\w+): ([\w:<>]+),", body.group(1), re.M))


def accepted_settings() -> set[str]:
    """Every SG_<SECTION>__<KEY> message-svc's Config accepts (it denies unknown fields): its
    sections from services/message/src/config.rs, their keys from the structs they name."""
    sections = _rust_struct_fields("services/message/src/config.rs", "Config")
    assert set(sections) == {"server", "database", "kafka", "consumer", "messages", "auth", "relation", "subscribe"}, sections
    own = {"MessageLimits", "RelationSettings", "SubscribeSettings"}
    out = set()
    for section, struct in sections.items():
        source = ("services/message/src/config.rs" if struct in own
                  else "libs/events/src/consumer.rs" if struct == "ConsumerSettings" else "libs/server/src/config.rs")
        for key in _rust_struct_fields(source, struct):
            out.add(f"SG_{section.upper()}__{key.upper()}")
    return out


# The keys message-svc reads (the book's `## message-svc` table and the [server] section);
# it accepts a few more (the other topics, auth.admin_token) and ignores them.
READS = {
    "SG_SERVER__GRPC_ADDR", "SG_SERVER__ADMIN_ADDR", "SG_SERVER__REQUEST_TIMEOUT_MS", "SG_SERVER__CONCURRENCY_LIMIT",
    "SG_SERVER__CONCURRENCY_LIMIT_PER_CONNECTION", "SG_SERVER__DRAIN_TIMEOUT_MS",
    "SG_DATABASE__URL", "SG_DATABASE__MAX_CONNECTIONS", "SG_DATABASE__MIGRATE_ON_START", "SG_DATABASE__CONSUMER_NAME",
    "SG_CONSUMER__PARTITIONS", "SG_CONSUMER__MAX_WAIT_MS", "SG_CONSUMER__MAX_BYTES", "SG_CONSUMER__IDLE_MAX_MS",
    "SG_CONSUMER__DEEP_IDLE_AFTER_MS", "SG_CONSUMER__DEEP_IDLE_MS", "SG_KAFKA__ACCOUNT_TOPIC",
    "SG_KAFKA__BROKERS", "SG_KAFKA__MESSAGE_TOPIC", "SG_KAFKA__PARTITIONS", "SG_KAFKA__REQUEST_DEADLINE_MS",
    "SG_KAFKA__RELAY_BATCH_SIZE", "SG_KAFKA__RELAY_IDLE_POLL_MS", "SG_KAFKA__RELAY_ENABLED",
    "SG_MESSAGES__MAX_BODY_BYTES", "SG_MESSAGES__MAX_GROUP_MEMBERS", "SG_AUTH__PAGE_TOKEN_SECRET",
    "SG_SUBSCRIBE__IDLE_POLL_MS", "SG_SUBSCRIBE__QUIET_POLL_MS", "SG_SUBSCRIBE__BUFFER",
    "SG_SUBSCRIBE__MAX_CATCH_UP_RECORDS",
}


def test_the_keys_it_reads_are_keys_its_config_accepts():
    assert READS <= accepted_settings()
    assert chartlib.documented_settings()[MESSAGE] == READS


# --- the workload, its Service and ports ---------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production", "all-inline"])
def test_message_svc_is_a_deployment_of_the_same_image(variant):
    rendered = render(VARIANTS[variant])
    deployment = rendered.workload(MESSAGE)
    assert deployment["kind"] == "Deployment"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    container = rendered.container(MESSAGE)
    relation = rendered.container("relation")
    assert container["name"] == MESSAGE
    assert container["command"] == ["/usr/local/bin/message-svc"] and container["args"] == ["serve"]
    assert (container["image"], container["imagePullPolicy"]) == (relation["image"], relation["imagePullPolicy"])
    # relation-svc's pod template: hardening, service account, /tmp.
    pod = deployment["spec"]["template"]["spec"]
    relation_pod = rendered.workload("relation")["spec"]["template"]["spec"]
    for key in ("securityContext", "serviceAccountName", "automountServiceAccountToken", "enableServiceLinks",
                "volumes", "imagePullSecrets"):
        assert pod.get(key) == relation_pod.get(key), key
    assert container["securityContext"] == relation["securityContext"]
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == MESSAGE
    # The HPA owns the replica count, as for relation-svc.
    hpa = rendered.get("HorizontalPodAutoscaler", NAME)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME}
    assert hpa["spec"]["minReplicas"] == (3 if variant == "production" else 2)
    assert "replicas" not in deployment["spec"]


@pytest.mark.parametrize("ports", [MESSAGE_PORTS, (6004, 7004)])
def test_ports_probes_and_service(ports):
    grpc_port, admin_port = ports
    rendered = render({MESSAGE: {"ports": {"grpc": grpc_port, "admin": admin_port}}})
    container = rendered.container(MESSAGE)
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"grpc": grpc_port, "admin": admin_port}
    # Native gRPC probes on the gRPC port (grpc.health.v1, as relation-svc).
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": grpc_port}, probe
        assert container[probe] == {**rendered.container("relation")[probe], "grpc": {"port": grpc_port}}
    env = rendered.environment(MESSAGE)
    assert env["SG_SERVER__GRPC_ADDR"] == f"0.0.0.0:{grpc_port}"
    assert env["SG_SERVER__ADMIN_ADDR"] == f"0.0.0.0:{admin_port}"
    service = rendered.get("Service", NAME)
    assert service["spec"]["type"] == "ClusterIP"
    assert {p["name"]: (p["port"], p["targetPort"], p["appProtocol"]) for p in service["spec"]["ports"]} == {
        "grpc": (grpc_port, "grpc", "kubernetes.io/h2c"), "admin": (admin_port, "admin", "http")}
    pod_labels = rendered.workload(MESSAGE)["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert rendered.find("Service", f"{NAME}-headless") is None


def test_fixed_replicas_without_autoscaler():
    rendered = render({MESSAGE: {"autoscaling": {"enabled": False}, "replicas": 4}})
    assert rendered.workload(MESSAGE)["spec"]["replicas"] == 4
    assert rendered.find("HorizontalPodAutoscaler", NAME) is None
    assert rendered.get("HorizontalPodAutoscaler", f"{RELEASE}-relation")


# --- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production", "all-inline"])
def test_config_holds_only_the_sections_it_accepts(variant):
    """message-svc refuses unknown sections and keys at start-up: no [redis], [cache], [limits]
    or anything of another service, whatever the other services are given."""
    env = render(VARIANTS[variant]).environment(MESSAGE)
    settings = {k for k in env if k not in NON_SG}
    assert {k.split("__")[0] for k in settings} <= {"SG_SERVER", "SG_DATABASE", "SG_KAFKA", "SG_MESSAGES", "SG_SUBSCRIBE",
                                                    "SG_RELATION", "SG_AUTH", "SG_CONSUMER"}
    assert settings <= accepted_settings()
    assert settings <= READS
    assert not [k for k in env if re.match(r"SG_(REDIS|CACHE|LIMITS|FEED|COUNTERS|PROJECTION)__", k)]
    # Nothing of relation-svc: message-svc calls it no more (blocks come from the events).
    assert not [k for k in env if k.startswith("SG_RELATION__")]
    # No admin RPC, so no admin token, even where the other services get one.
    assert "SG_AUTH__ADMIN_TOKEN" not in env
    # The same config the ConfigMap holds: nothing of another service.
    data = render(VARIANTS[variant]).get("ConfigMap", NAME)["data"]
    assert not [k for k in data if "REDIS" in k or "CACHE" in k]


def test_default_settings():
    env = render().environment(MESSAGE)
    assert {k: v for k, v in env.items() if isinstance(v, str)} == {
        "SG_SERVER__GRPC_ADDR": "0.0.0.0:50054",
        "SG_SERVER__ADMIN_ADDR": "0.0.0.0:9105",
        "SG_SERVER__REQUEST_TIMEOUT_MS": "10000",
        "SG_SERVER__CONCURRENCY_LIMIT": "1024",
        "SG_SERVER__CONCURRENCY_LIMIT_PER_CONNECTION": "256",
        "SG_SERVER__DRAIN_TIMEOUT_MS": "10000",
        "SG_KAFKA__BROKERS": '["kafka:9092"]',
        "SG_KAFKA__PARTITIONS": "12",
        "SG_KAFKA__MESSAGE_TOPIC": "sg.message.v1",
        "SG_KAFKA__ACCOUNT_TOPIC": "sg.account.v1",
        "SG_KAFKA__REQUEST_DEADLINE_MS": "5000",
        "SG_KAFKA__RELAY_BATCH_SIZE": "1000",
        "SG_KAFKA__RELAY_IDLE_POLL_MS": "100",
        "SG_KAFKA__RELAY_ENABLED": "true",
        "SG_DATABASE__MAX_CONNECTIONS": "32",
        "SG_DATABASE__MIGRATE_ON_START": "false",
        "SG_DATABASE__CONSUMER_NAME": "message",
        "SG_CONSUMER__PARTITIONS": "all",
        "SG_CONSUMER__MAX_WAIT_MS": "5",
        "SG_CONSUMER__MAX_BYTES": "4194304",
        "SG_CONSUMER__IDLE_MAX_MS": "50",
        "SG_CONSUMER__DEEP_IDLE_AFTER_MS": "10000",
        "SG_CONSUMER__DEEP_IDLE_MS": "1000",
        "SG_MESSAGES__MAX_BODY_BYTES": "16384",
        "SG_MESSAGES__MAX_GROUP_MEMBERS": "1000",
        "SG_SUBSCRIBE__IDLE_POLL_MS": "20",
        "SG_SUBSCRIBE__QUIET_POLL_MS": "200",
        "SG_SUBSCRIBE__BUFFER": "4096",
        "SG_SUBSCRIBE__MAX_CATCH_UP_RECORDS": "200000",
        "RUST_LOG": "info",
        "SG_LOG_FORMAT": "json",
    }
    # Unset page-token key: not passed (the binary's development key, as for the others).
    assert env["SG_DATABASE__URL"] == {"secretKeyRef": {"name": f"{RELEASE}-socialgraph-inline", "key": "database-url"}}
    assert "SG_AUTH__PAGE_TOKEN_SECRET" not in env


def test_values_become_the_documented_variables():
    rendered = render(merged(ALL_INLINE, {
        "kafka": {"messageTopic": "chat.events.v2", "partitions": 24, "requestDeadlineMs": 2500},
        MESSAGE: {"messages": {"maxBodyBytes": 65536, "maxGroupMembers": 25000000},
                  "database": {"maxConnections": 8, "migrateOnStart": True},
                  "kafka": {"relayBatchSize": 500, "relayIdlePollMs": 20, "relayEnabled": False},
                  "server": {"requestTimeoutMs": 4000, "drainTimeoutMs": 20000},
                  "relationUrl": "http://relation.other:50051", "logLevel": "debug",
                  "subscribe": {"maxCatchUpRecords": 50000000, "quietPollMs": 1000}},
    }))
    env = rendered.environment(MESSAGE)
    assert "SG_RELATION__URL" not in env, "deprecated and ignored"
    (notes,) = [v for k, v in rendered.text.items() if k.endswith("NOTES.txt")]
    assert "WARNING: message.relationUrl is deprecated" in notes
    assert env["SG_SUBSCRIBE__MAX_CATCH_UP_RECORDS"] == "50000000" and env["SG_SUBSCRIBE__QUIET_POLL_MS"] == "1000"
    assert env["SG_KAFKA__MESSAGE_TOPIC"] == "chat.events.v2"
    assert env["SG_KAFKA__PARTITIONS"] == "24" and env["SG_KAFKA__REQUEST_DEADLINE_MS"] == "2500"
    assert env["SG_MESSAGES__MAX_BODY_BYTES"] == "65536"
    assert env["SG_MESSAGES__MAX_GROUP_MEMBERS"] == "25000000"  # no float notation
    assert env["SG_DATABASE__MAX_CONNECTIONS"] == "8" and env["SG_DATABASE__MIGRATE_ON_START"] == "true"
    assert env["SG_KAFKA__RELAY_BATCH_SIZE"] == "500" and env["SG_KAFKA__RELAY_IDLE_POLL_MS"] == "20"
    assert env["SG_KAFKA__RELAY_ENABLED"] == "false"
    assert env["SG_SERVER__REQUEST_TIMEOUT_MS"] == "4000" and env["SG_SERVER__GRPC_ADDR"] == "[::]:50054"
    assert rendered.workload(MESSAGE)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 5 + 20 + 5
    assert env["RUST_LOG"] == "debug" and env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
    assert env["SG_AUTH__PAGE_TOKEN_SECRET"] == {"secretKeyRef": {
        "name": f"{RELEASE}-socialgraph-inline", "key": "page-token-secret"}}
    # The limits are message-svc's alone; the topic is also counter-svc's (the unread counters),
    # which calls this release's message-svc, and no other service's.
    for name in ("relation", "projection", "counter"):
        assert not [k for k in rendered.environment(name) if k.startswith("SG_MESSAGES__")]
    for name in ("relation", "projection"):
        assert not [k for k in rendered.environment(name) if k in ("SG_KAFKA__MESSAGE_TOPIC", "SG_MESSAGE__URL")]
    counter = rendered.environment("counter")
    assert counter["SG_KAFKA__MESSAGE_TOPIC"] == "chat.events.v2"
    assert counter["SG_MESSAGE__URL"] == f"http://{NAME}:50054"
    assert "SG_KAFKA__RELATION_TOPIC" not in env


@pytest.mark.parametrize("base, change, rolled", [
    ({}, {MESSAGE: {"messages": {"maxBodyBytes": 1024}}}, {MESSAGE}),
    ({}, {"kafka": {"messageTopic": "chat.v2"}}, {MESSAGE, "counter"}),
    ({}, {MESSAGE: {"ports": {"grpc": 6004}}}, {MESSAGE, "counter", GATEWAY}),
    ({}, {MESSAGE: {"ports": {"admin": 7004}}}, {MESSAGE}),
    ({}, {MESSAGE: {"database": {"url": "postgres://m@db/messages"}}}, {MESSAGE}),
    (OWN_DB_INLINE, {"database": {"url": "postgres://other@db/sg"}}, {"relation", "projection"}),
    ({}, {"kafka": {"relationTopic": "sg.relation.v2"}}, {"relation", "projection", "counter"}),
    ({}, {"kafka": {"edgeCountTopic": "sg.edge_count.v2"}}, {"projection", "counter"}),
    ({}, {"kafka": {"accountTopic": "sg.account.v2"}}, {"relation", "projection", MESSAGE}),
    ({}, {"relation": {"limits": {"followingCap": 10}}}, {"relation"}),
    ({}, {"auth": {"adminToken": "t"}}, {"relation", "projection", "counter"}),
    ({}, {"auth": {"pageTokenSecret": "k"}}, {"relation", "projection", MESSAGE}),
    ({}, {"cache": {"url": "redis://cache:6379"}}, {"relation", "projection"}),
])
def test_config_changes_roll_exactly_the_pods_that_read_them(base, change, rolled):
    def checksums(rendered):
        return {n: rendered.workload(n)["spec"]["template"]["metadata"]["annotations"] for n in chartlib.COMPONENTS}
    before, after = checksums(render(base)), checksums(render(merged(base, change)))
    assert {n for n in chartlib.COMPONENTS if before[n] != after[n]} == rolled


# --- counter-svc calls it: the unread counters ---------------------------------------------

UNREAD = ("SG_KAFKA__MESSAGE_TOPIC", "SG_MESSAGE__URL")


def _grpc_url(rendered: chartlib.Rendered, service_name: str) -> str:
    service = rendered.get("Service", service_name)
    (grpc,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]
    return f"http://{service_name}:{grpc}"


@pytest.mark.parametrize("variant", ["default", "production", "all-inline"])
def test_counter_copies_unread_counts_from_this_releases_message_svc(variant):
    """counter-svc consumes message-svc's topic and copies membership states from this release's
    message-svc (its Service, on the gRPC port); with message-svc not deployed it gets neither
    setting, so the unread counters are off."""
    rendered = render(VARIANTS[variant])
    counter = rendered.environment("counter")
    assert counter["SG_MESSAGE__URL"] == _grpc_url(rendered, NAME) == f"http://{NAME}:{MESSAGE_PORTS[0]}"
    assert counter["SG_KAFKA__MESSAGE_TOPIC"] == rendered.environment(MESSAGE)["SG_KAFKA__MESSAGE_TOPIC"]
    assert counter["SG_KAFKA__MESSAGE_TOPIC"] == "sg.message.v1"
    # Non-secret settings: in counter-svc's ConfigMap, not in its pod's env entries.
    data = rendered.get("ConfigMap", f"{RELEASE}-counter")["data"]
    assert {k: data[k] for k in UNREAD} == {k: counter[k] for k in UNREAD}
    assert not [e for e in rendered.container("counter").get("env", []) if e["name"] in UNREAD]
    # The Service the URL names selects message-svc's pods, which serve gRPC on that port.
    service = rendered.get("Service", NAME)
    pod_labels = rendered.workload(MESSAGE)["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert {"name": "grpc", "containerPort": MESSAGE_PORTS[0], "protocol": "TCP"} in rendered.container(MESSAGE)["ports"]

    disabled = render(merged(VARIANTS[variant], {MESSAGE: {"enabled": False}}))
    without = disabled.environment("counter")
    assert not [k for k in without if "MESSAGE" in k]
    assert without == {k: v for k, v in counter.items() if k not in UNREAD}


@pytest.mark.parametrize("values, prefix", [
    ({}, RELEASE),
    ({"fullnameOverride": "graph"}, "graph"),
    ({MESSAGE: {"ports": {"grpc": 6004}}}, RELEASE),
    ({"networkPolicy": {"enabled": True}, "kafka": {"messageTopic": "chat.events.v2"}}, RELEASE),
])
def test_counters_message_settings_follow_the_message_service_and_topic(values, prefix):
    rendered = render(values)
    data = rendered.get("ConfigMap", f"{prefix}-counter")["data"]
    assert data["SG_MESSAGE__URL"] == _grpc_url(rendered, f"{prefix}-{MESSAGE}")
    assert data["SG_MESSAGE__URL"] == f"http://{prefix}-{MESSAGE}:{values.get(MESSAGE, {}).get('ports', {}).get('grpc', 50054)}"
    assert data["SG_KAFKA__MESSAGE_TOPIC"] == values.get("kafka", {}).get("messageTopic", "sg.message.v1")
    assert rendered.get("ConfigMap", f"{prefix}-{MESSAGE}")["data"]["SG_KAFKA__MESSAGE_TOPIC"] == data["SG_KAFKA__MESSAGE_TOPIC"]


def test_a_message_topic_change_without_message_svc_rolls_nothing():
    """With message-svc not deployed, counter-svc does not read the message topic."""
    def checksums(rendered):
        return {n: rendered.workload(n)["spec"]["template"]["metadata"]["annotations"]
                for n in chartlib.COMPONENTS if n != MESSAGE}
    base = {MESSAGE: {"enabled": False}}
    assert checksums(render(base)) == checksums(render(merged(base, {"kafka": {"messageTopic": "chat.v2"}})))


# --- its database --------------------------------------------------------------------------


def _migration_steps(rendered):
    pod = rendered.get("Job", f"{RELEASE}-migrate")["spec"]["template"]["spec"]
    return ([c["command"][0].rsplit("/", 1)[1] for c in pod.get("initContainers", [])],
            [c["command"][0].rsplit("/", 1)[1] for c in pod["containers"]], pod)


def test_shares_relation_svcs_database_by_default():
    for variant in ("default", "production", "all-inline"):
        rendered = render(VARIANTS[variant])
        assert rendered.environment(MESSAGE)["SG_DATABASE__URL"] == rendered.environment("relation")["SG_DATABASE__URL"]
        # relation-svc's migration covers the shared database (one migrator for every table).
        init, containers, _ = _migration_steps(rendered)
        assert "message-svc" not in init + containers


def test_a_database_of_its_own_inline_is_migrated_from_a_hook_secret():
    rendered = render(OWN_DB_INLINE)
    url = OWN_DB_INLINE[MESSAGE]["database"]["url"]
    inline = rendered.get("Secret", f"{RELEASE}-socialgraph-inline")
    assert base64.b64decode(inline["data"]["message-database-url"]).decode() == url
    assert rendered.environment(MESSAGE)["SG_DATABASE__URL"] == {"secretKeyRef": {
        "name": f"{RELEASE}-socialgraph-inline", "key": "message-database-url"}}
    assert rendered.environment("relation")["SG_DATABASE__URL"]["secretKeyRef"]["key"] == "database-url"
    assert "msg-password" not in json.dumps([o for o in rendered.objects if o["kind"] != "Secret"])
    init, containers, pod = _migration_steps(rendered)
    assert (init, containers) == (["relation-svc"], ["message-svc"])
    (step,) = pod["containers"]
    assert step["name"] == "migrate-message" and step["args"] == ["migrate"]
    ref = step["env"][0]["valueFrom"]["secretKeyRef"]
    hook = rendered.get("Secret", ref["name"])
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert base64.b64decode(hook["data"][ref["key"]]).decode() == url


def test_a_database_of_its_own_from_an_existing_secret():
    values = merged(chartlib.production_values(), OWN_DB_SECRET)
    rendered = render(values)
    assert rendered.environment(MESSAGE)["SG_DATABASE__URL"] == {"secretKeyRef": {
        "name": "socialgraph-message-postgres", "key": "url"}}
    assert not rendered.of_kind("Secret")
    # Every migration in turn (init containers), the last as the Job's container.
    init, containers, pod = _migration_steps(rendered)
    assert (init, containers) == (["relation-svc", "projection-svc"], ["message-svc"])
    assert pod["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": "socialgraph-message-postgres", "key": "url"}
    # An inline URL next to an existing Secret is never rendered.
    leaked = render(merged(values, {MESSAGE: {"database": {"url": "postgres://leak:sentinel-pw@db/m"}}}))
    assert "sentinel-pw" not in leaked.all_text and "postgres://" not in leaked.all_text


# --- disabling it --------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production", "all-inline", "production-with-alerts-and-dashboard"])
def test_disabled_renders_no_message_objects(variant):
    enabled = render(VARIANTS[variant])
    kinds = {o["kind"] for o in _message_objects(enabled)}
    expected = {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    if variant.startswith("production"):
        expected |= {"ServiceMonitor", "NetworkPolicy"}
    assert kinds == expected
    # Enabled, counter-svc consumes the message topic and calls message-svc (the unread counters).
    counter_config = enabled.get("ConfigMap", f"{RELEASE}-counter")["data"]
    assert counter_config["SG_MESSAGE__URL"] == f"http://{NAME}:{MESSAGE_PORTS[0]}"
    assert counter_config["SG_KAFKA__MESSAGE_TOPIC"] == "sg.message.v1"
    rendered = render(merged(VARIANTS[variant], {MESSAGE: {"enabled": False}}))
    assert _message_objects(rendered) == []
    # Nothing mentions message-svc, counter-svc's objects included: no URL, no topic.
    # (The dashboard, a static file, names every service in its descriptions.)
    text = "\n".join(body for template, body in rendered.text.items() if not template.endswith("grafana-dashboard.yaml"))
    for needle in (NAME, "message-svc", "SG_MESSAGE__", "SG_MESSAGES__", "MESSAGE_TOPIC", "sg.message.v1"):
        assert needle not in text, needle
    counter_objects = [o for o in rendered.objects
                       if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "counter"]
    assert {o["kind"] for o in counter_objects} >= {"StatefulSet", "ConfigMap", "Service"}
    assert "SG_MESSAGE__URL" not in json.dumps(counter_objects) and "MESSAGE" not in json.dumps(counter_objects)
    assert len(rendered.objects) == len(enabled.objects) - len(_message_objects(enabled))
    # Nothing else changes but counter-svc's config (the two unread-counter settings, and so its
    # pods' config checksum) and the relay alerts, which no longer count message-svc.
    others = {(o["kind"], o["metadata"]["name"]): o for o in enabled.objects if o not in _message_objects(enabled)}
    expected = copy.deepcopy(others)
    counter_cm = expected[("ConfigMap", f"{RELEASE}-counter")]["data"]
    for key in ("SG_MESSAGE__URL", "SG_KAFKA__MESSAGE_TOPIC"):
        del counter_cm[key]
    counter_pods = expected[("StatefulSet", f"{RELEASE}-counter")]["spec"]["template"]["metadata"]["annotations"]
    actual_pods = rendered.get("StatefulSet", f"{RELEASE}-counter")["spec"]["template"]["metadata"]["annotations"]
    assert actual_pods["checksum/config"] != counter_pods["checksum/config"]
    counter_pods["checksum/config"] = actual_pods["checksum/config"]
    # The gateway has no message-svc behind it: an empty URL (its message routes answer 501).
    if ("ConfigMap", f"{RELEASE}-gateway") in expected:
        expected[("ConfigMap", f"{RELEASE}-gateway")]["data"]["SG_UPSTREAM__MESSAGE_URL"] = ""
        pods = lambda objs: objs[("Deployment", f"{RELEASE}-gateway")]["spec"]["template"]["metadata"]["annotations"]
        actual = {(o["kind"], o["metadata"]["name"]): o for o in rendered.objects}
        assert pods(actual)["checksum/config"] != pods(expected)["checksum/config"]
        pods(expected)["checksum/config"] = pods(actual)["checksum/config"]
    # (relation-svc's network policy never admits message-svc: it calls nothing.)
    for obj in rendered.objects:
        if obj["kind"] != "PrometheusRule":
            assert obj == expected[(obj["kind"], obj["metadata"]["name"])], (obj["kind"], obj["metadata"]["name"])


def test_disabled_ignores_its_database():
    rendered = render(merged(OWN_DB_INLINE, {MESSAGE: {"enabled": False}}))
    assert "msg-password" not in rendered.all_text
    assert not [s for s in rendered.of_kind("Secret") if "message-database-url" in s.get("data", {})]
    init, containers, _ = _migration_steps(rendered)
    assert init == [] and containers == ["relation-svc"]


# --- disruption budget, monitoring, network policy ----------------------------------------


def test_pdb_service_monitor_and_network_policy():
    values = chartlib.production_values()
    rendered = render(values)
    labels = rendered.workload(MESSAGE)["spec"]["template"]["metadata"]["labels"]
    pdb = rendered.get("PodDisruptionBudget", NAME)
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == MESSAGE
    monitor = rendered.get("ServiceMonitor", NAME)
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "admin" and endpoint["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # On the gRPC port counter-svc's pods (the unread counters), the gateway's (the message
    # routes) and the named callers, only metricsFrom on the admin port.
    policy = rendered.get("NetworkPolicy", NAME)
    assert all(labels.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    assert all(len(r["ports"]) == 1 for r in policy["spec"]["ingress"])
    rules = {r["ports"][0]["port"]: r["from"] for r in policy["spec"]["ingress"]}
    counter_peer = {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "counter",
                                                    "app.kubernetes.io/instance": RELEASE,
                                                    "app.kubernetes.io/name": "socialgraph"}}}
    gateway_peer = {"podSelector": {"matchLabels": {**counter_peer["podSelector"]["matchLabels"],
                                                    "app.kubernetes.io/component": GATEWAY}}}
    assert rules == {"grpc": [counter_peer, gateway_peer] + values[MESSAGE]["networkPolicy"]["allowFrom"],
                     "admin": values["networkPolicy"]["metricsFrom"]}
    # Each peer is its component's pods and no other component's.
    for peer, component in ((counter_peer, "counter"), (gateway_peer, GATEWAY)):
        selected = {n for n in chartlib.COMPONENTS
                    if all(rendered.workload(n)["spec"]["template"]["metadata"]["labels"].get(k) == v
                           for k, v in peer["podSelector"]["matchLabels"].items())}
        assert selected == {component}
    # Without named callers only counter-svc and the gateway are admitted, only to the gRPC port.
    nobody = render({"networkPolicy": {"enabled": True}})
    assert nobody.get("NetworkPolicy", NAME)["spec"]["ingress"] == [
        {"ports": [{"port": "grpc", "protocol": "TCP"}], "from": [counter_peer, gateway_peer]}]
    # Without counter-svc and the gateway, nothing of the chart calls message-svc: nobody is admitted.
    alone = render({"networkPolicy": {"enabled": True}, "counter": {"enabled": False}, GATEWAY: {"enabled": False}})
    assert alone.get("NetworkPolicy", NAME)["spec"]["ingress"] == []
    # No policy admits message-svc's pods as a caller: it calls no other service.
    for other in nobody.of_kind("NetworkPolicy"):
        callers = {peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
                   for rule in other["spec"]["ingress"] for peer in rule["from"]}
        assert MESSAGE not in callers, other["metadata"]["name"]
    assert render({MESSAGE: {"pdb": {"enabled": False}}}).find("PodDisruptionBudget", NAME) is None


def test_notes_name_its_endpoint():
    notes = chartlib.chart().render({}, name=RELEASE, namespace=NAMESPACE)
    (text,) = [v for k, v in notes.items() if k.endswith("NOTES.txt")]
    assert f"message-svc   {NAME}.{NAMESPACE}.svc:50054   (admin /metrics /ready /live on 9105)" in text


# --- every object still validates -----------------------------------------------------------

MESSAGE_VARIANTS = {
    "own-database-inline-fixed-replicas": merged(ALL_INLINE, merged(OWN_DB_INLINE, {
        MESSAGE: {"autoscaling": {"enabled": False}, "replicas": 3, "pdb": {"minAvailable": "50%"},
                  "extraEnv": [{"name": "SG_TRACE_FILTER", "value": "debug"}]}})),
    "production-own-database-monitored": merged(merged(chartlib.production_values(), OWN_DB_SECRET), MONITORED),
    "disabled-monitored": merged(MONITORED, {MESSAGE: {"enabled": False}}),
    "custom-ports-memory-autoscaling": {MESSAGE: {"ports": {"grpc": 6004, "admin": 7004}, "autoscaling": {
        "targetCPUUtilizationPercentage": None, "targetMemoryUtilizationPercentage": 80,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}}}},
}


@pytest.mark.parametrize("variant", list(MESSAGE_VARIANTS))
def test_every_manifest_validates_strictly(variant):
    rendered = render(MESSAGE_VARIANTS[variant])
    failures = []
    for obj in rendered.objects:
        try:
            chartlib.validate(obj)
        except (jsonschema.ValidationError, kv.SchemaNotFoundError) as e:
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {getattr(e, 'message', e)}")
    assert not failures, "\n".join(failures)
    report = chartlib.lint(MESSAGE_VARIANTS[variant])
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2], report


# --- values.schema.json and cross-value checks ---------------------------------------------

INVALID = {
    "enabled as a word": ({MESSAGE: {"enabled": "yes"}}, "/message/enabled", "want boolean"),
    "zero body size": ({MESSAGE: {"messages": {"maxBodyBytes": 0}}}, "/message/messages/maxBodyBytes", "minimum"),
    "group cap as a string": ({MESSAGE: {"messages": {"maxGroupMembers": "1000"}}},
                              "/message/messages/maxGroupMembers", "want integer"),
    "misspelt limit": ({MESSAGE: {"messages": {"maxBody": 10}}}, "/message/messages", "'maxBody' not allowed"),
    "topic with a space": ({"kafka": {"messageTopic": "sg message"}}, "/kafka/messageTopic", "pattern"),
    "database url of another scheme": ({MESSAGE: {"database": {"url": "http://db:5432"}}},
                                       "/message/database/url", "pattern"),
    "consumer name": ({MESSAGE: {"database": {"consumerName": ""}}}, "/message/database/consumerName",
                      "minLength: got 0, want 1"),
    "redis section": ({MESSAGE: {"redis": {"poolSize": 4}}}, "/message", "'redis' not allowed"),
    "cache section": ({MESSAGE: {"cache": {"ttlSecs": 60}}}, "/message", "'cache' not allowed"),
    "limits section": ({MESSAGE: {"limits": {"followingCap": 1}}}, "/message", "'limits' not allowed"),
    "port out of range": ({MESSAGE: {"ports": {"grpc": 70000}}}, "/message/ports/grpc", "maximum"),
    "zero replicas": ({MESSAGE: {"replicas": 0}}, "/message/replicas", "minimum"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_schema_rejects_invalid_values_naming_the_key(case):
    values, pointer, reason = INVALID[case]
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    message = str(err.value)
    assert f"at '{pointer}" in message and reason in message, message


@pytest.mark.parametrize("values, message", [
    ({MESSAGE: {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}},
     "message.autoscaling.maxReplicas (2) is smaller than message.autoscaling.minReplicas (5)"),
    ({MESSAGE: {"autoscaling": {"targetCPUUtilizationPercentage": None}}}, "message.autoscaling is enabled without a target"),
])
def test_inconsistent_values_fail_with_a_message(values, message):
    with pytest.raises(helm.HelmRenderError) as err:
        render(values)
    assert message in str(err.value)
    # Not checked when message-svc is not deployed.
    render(merged(values, {MESSAGE: {"enabled": False}}))


# --- the relay alerts: one leader per database ---------------------------------------------


def _rules(rendered, alert):
    (group,) = _rule_object(rendered)["spec"]["groups"]
    return [r for r in group["rules"] if r["alert"] == alert]


def test_relay_alerts_count_message_svc_with_relation_svc_on_one_database():
    rendered = render(MONITORING)
    selector = f'namespace="{NAMESPACE}", service=~"{RELEASE}-relation|{NAME}"'
    (not_led,) = _rules(rendered, "SocialgraphRelayNotLed")
    (twice,) = _rules(rendered, "SocialgraphRelayLedTwice")
    assert not_led["expr"] == f"(sum(sg_relay_leader{{{selector}}}) or vector(0)) < 1"
    assert twice["expr"] == f"sum(sg_relay_leader{{{selector}}}) > 1"
    assert "service" not in not_led["labels"]
    (backlog,) = _rules(rendered, "SocialgraphOutboxBacklogGrowing")
    assert backlog["expr"].count(selector) == 3
    # Only relation-svc's relay off: message-svc's still publishes every row of the shared outbox.
    (only_message,) = _rules(render(merged(MONITORING, {"relation": {"kafka": {"relayEnabled": False}}})),
                             "SocialgraphRelayNotLed")
    assert f'service="{NAME}"' in only_message["expr"] and "service" not in only_message["labels"]


def test_relay_alerts_watch_a_database_of_its_own_separately():
    rendered = render(merged(MONITORING, OWN_DB_INLINE))
    for alert in ("SocialgraphRelayNotLed", "SocialgraphRelayLedTwice"):
        relation, message = _rules(rendered, alert)
        assert f'service="{RELEASE}-relation"' in relation["expr"] and MESSAGE not in relation["expr"]
        assert f'service="{NAME}"' in message["expr"] and "relation" not in message["expr"]
        assert "service" not in relation["labels"] and message["labels"]["service"] == NAME
        assert "message-svc" in message["annotations"]["summary"]
    chartlib.validate(_rule_object(rendered))


@pytest.mark.parametrize("values", [{}, OWN_DB_INLINE], ids=["shared-database", "own-database"])
def test_promtool_checks_and_fires_the_relay_rules(values, tmp_path):
    rendered = render(merged(MONITORING, values))
    rules = _write_rules(rendered, tmp_path)
    check = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    own = bool(values)

    def alerts(name, *label_sets):
        return [{"labels": "ALERTS{" + ",".join(f'{k}="{v}"' for k, v in sorted({
            "alertname": name, "alertstate": "firing", "namespace": NAMESPACE,
            "severity": "critical" if name == "SocialgraphRelayNotLed" else "warning", **labels}.items())) + "}",
                 "value": 1} for labels in label_sets]

    message_only = {"service": NAME} if own else {}
    tests = [
        # A message-svc replica leads, none of relation-svc: one leader for a shared database,
        # relation-svc's database unled for separate ones.
        ({_series("sg_relay_leader", "relation", "sg-relation-a"): "0x20",
          _series("sg_relay_leader", MESSAGE, "sg-message-a"): "1x20"},
         "SocialgraphRelayNotLed", alerts("SocialgraphRelayNotLed", {}) if own else []),
        # One leader of each: two on one database, one per database when separate.
        ({_series("sg_relay_leader", "relation", "sg-relation-a"): "1x20",
          _series("sg_relay_leader", MESSAGE, "sg-message-a"): "1x20"},
         "SocialgraphRelayLedTwice", [] if own else alerts("SocialgraphRelayLedTwice", {})),
        # relation-svc leads, no message-svc replica does.
        ({_series("sg_relay_leader", "relation", "sg-relation-a"): "1x20",
          _series("sg_relay_leader", MESSAGE, "sg-message-a"): "0x20"},
         "SocialgraphRelayNotLed", alerts("SocialgraphRelayNotLed", message_only) if own else []),
        # A growing outbox behind a message-svc leader.
        ({_series("sg_relay_leader", "relation", "sg-relation-a"): "1x60",
          _series("sg_outbox_backlog_rows", MESSAGE, "sg-message-a"): "20000+100x60",
          _series("sg_relay_leader", MESSAGE, "sg-message-a"): "1x60"},
         "SocialgraphOutboxBacklogGrowing",
         [{"labels": "ALERTS" + "{" + ",".join(f'{k}="{v}"' for k, v in sorted({
             "alertname": "SocialgraphOutboxBacklogGrowing", "alertstate": "firing", "severity": "warning",
             "namespace": NAMESPACE, "service": NAME, "job": MESSAGE, "pod": "sg-message-a",
             "instance": "10.0.0.1:9105", "endpoint": "admin", "container": MESSAGE}.items())) + "}", "value": 1}]),
    ]
    cases = []
    for i, (series, alert, expected) in enumerate(tests):
        cases.append({
            "name": f"{alert} {i}",
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "promql_expr_test": [{"expr": f'ALERTS{{alertname="{alert}", alertstate="firing"}}',
                                  "eval_time": "40m" if alert == "SocialgraphOutboxBacklogGrowing" else "15m",
                                  "exp_samples": expected}],
        })
    path = tmp_path / "message.test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": cases},
                                   sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
