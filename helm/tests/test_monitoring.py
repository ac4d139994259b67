"""The chart's alerts (a Prometheus Operator PrometheusRule) and its Grafana dashboard (a
ConfigMap): rendered only when enabled, valid (schema, `promtool check rules`), firing in
`promtool test rules` on series labelled as the chart's ServiceMonitors label them, each alert
documented in the book's runbook, and every query naming only metrics the services export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import helm_python as helm
import jsonschema
import pytest
import yaml

import chartlib
from chartlib import GATEWAY, MESSAGE, NAMESPACE, RELEASE, merged, render

# The metrics the services and the gateway export that the rules and the dashboard may use,
# with their labels (besides the target labels below). grpc_server_*: the grpc-ecosystem names
# (libs/server/src/red.rs); sg_ready: every service and the gateway (libs/server/src/admin.rs).
GRPC_LABELS = {"grpc_type", "grpc_service", "grpc_method"}
METRICS: dict[str, set[str]] = {
    "grpc_server_started_total": GRPC_LABELS,
    "grpc_server_handled_total": GRPC_LABELS | {"grpc_code"},
    "grpc_server_handling_seconds_bucket": GRPC_LABELS | {"le"},
    "grpc_server_handling_seconds_sum": GRPC_LABELS,
    "grpc_server_handling_seconds_count": GRPC_LABELS,
    "sg_gateway_requests_total": {"route", "code"},
    "sg_gateway_request_duration_seconds_bucket": {"route", "le"},
    "sg_gateway_request_duration_seconds_sum": {"route"},
    "sg_gateway_request_duration_seconds_count": {"route"},
    "sg_projection_lag_records": {"topic", "partition"},
    "sg_feed_fanout_backlog": set(),
    "sg_feed_inbox_writes_total": {"source"},
    "sg_counter_lag_records": {"topic", "partition"},
    "sg_outbox_backlog_rows": set(),
    "sg_relay_leader": set(),
    "sg_counter_repairs_total": set(),
    "sg_cache_requests_total": {"cache", "rpc", "result"},
    "sg_ready": set(),
}
# Labels Prometheus (through a ServiceMonitor) adds to every scraped series.
TARGET_LABELS = {"namespace", "service", "job", "pod", "instance", "container", "endpoint"}

ALERTS = {
    "SocialgraphProjectionLagHigh": "warning",
    "SocialgraphCounterLagHigh": "warning",
    "SocialgraphOutboxBacklogGrowing": "warning",
    "SocialgraphRelayNotLed": "critical",
    "SocialgraphRelayLedTwice": "warning",
    "SocialgraphCounterDriftRepaired": "warning",
    "SocialgraphRpcErrorRatioHigh": "critical",
    "SocialgraphGatewayErrorRatioHigh": "critical",
    "SocialgraphReadinessFlapping": "warning",
}
# The metric each alert watches.
ALERT_METRICS = {
    "SocialgraphProjectionLagHigh": {"sg_projection_lag_records"},
    "SocialgraphCounterLagHigh": {"sg_counter_lag_records"},
    "SocialgraphOutboxBacklogGrowing": {"sg_outbox_backlog_rows", "sg_relay_leader"},
    "SocialgraphRelayNotLed": {"sg_relay_leader"},
    "SocialgraphRelayLedTwice": {"sg_relay_leader"},
    "SocialgraphCounterDriftRepaired": {"sg_counter_repairs_total"},
    "SocialgraphRpcErrorRatioHigh": {"grpc_server_handled_total"},
    "SocialgraphGatewayErrorRatioHigh": {"sg_gateway_requests_total"},
    "SocialgraphReadinessFlapping": {"sg_ready"},
}
# The metric each dashboard panel must show.
PANEL_METRICS = {
    "RPC rate per method": {"grpc_server_handled_total"},
    "RPC error ratio per method": {"grpc_server_handled_total"},
    "RPC p99 latency per method": {"grpc_server_handling_seconds_bucket"},
    "Gateway request rate per route": {"sg_gateway_requests_total"},
    "Gateway 5xx ratio per route": {"sg_gateway_requests_total"},
    "Gateway p99 latency per route": {"sg_gateway_request_duration_seconds_bucket"},
    "Projection lag per topic and partition": {"sg_projection_lag_records"},
    "Feed fan-out": {"sg_feed_fanout_backlog", "sg_feed_inbox_writes_total"},
    "Counter lag per topic and partition": {"sg_counter_lag_records"},
    "Outbox backlog": {"sg_outbox_backlog_rows", "sg_relay_leader"},
    "Relay leader": {"sg_relay_leader"},
    "Counter repairs": {"sg_counter_repairs_total"},
    "Cache hit ratio": {"sg_cache_requests_total"},
    "Readiness": {"sg_ready"},
}

MONITORING = {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
RUNBOOK_BASE = "https://github.com/socialgraph/socialgraph/blob/main/docs/src/operations/runbook.md"
RUNBOOK = chartlib.REPO / "docs" / "src" / "operations" / "runbook.md"
DASHBOARD = f"{RELEASE}-socialgraph-dashboard"


def _rule_object(rendered: chartlib.Rendered) -> dict:
    (rule,) = rendered.of_kind("PrometheusRule")
    return rule


def _alerts(rendered: chartlib.Rendered) -> dict[str, dict]:
    (group,) = _rule_object(rendered)["spec"]["groups"]
    rules = group["rules"] or []
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), names
    return {r["alert"]: r for r in rules}


def _dashboard(rendered: chartlib.Rendered, name: str = DASHBOARD) -> dict:
    cm = rendered.get("ConfigMap", name)
    assert list(cm["data"]) == ["socialgraph.json"]
    return json.loads(cm["data"]["socialgraph.json"])


# --- PromQL, read just enough to name the metrics and labels a query uses -------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan"}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"(?<![\w:])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def promql_selectors(expr: str) -> tuple[list[tuple[str, dict[str, tuple[str, str]]]], set[str]]:
    """The series selectors of `expr` as (metric, {label: (op, value)}), and the labels of its
    grouping clauses (by, on, ...). Fails on a selector without a metric name or a matcher it
    cannot read."""
    selectors = []
    for m in _SELECTOR.finditer(expr):
        body = m.group(2)
        matchers = {}
        pos = 0
        while pos < len(body):
            mm = _MATCHER.match(body, pos)
            assert mm, f"unreadable matchers {body!r} in {expr!r}"
            matchers[mm.group(1)] = (mm.group(2), mm.group(3))
            pos = mm.end()
        selectors.append((m.group(1), matchers))
    rest = _SELECTOR.sub(" ", expr)
    assert "{" not in rest, f"a selector without a metric name in {expr!r}"
    rest = re.sub(r'"(?:[^"\\]|\\.)*"', " ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    grouping = {label.strip() for clause in _GROUPING.findall(rest) for label in clause.split(",") if label.strip()}
    rest = _GROUPING.sub(" ", rest)
    # What remains: functions and aggregations (followed by a parenthesis), keywords, numbers,
    # and the names of metrics selected without matchers.
    for m in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", rest):
        name, call = m.group(1), m.group(2)
        if call or name in _KEYWORDS:
            continue
        selectors.append((name, {}))
    return selectors, grouping


def check_query(expr: str, where: str) -> set[str]:
    """Asserts that `expr` names only known metrics and labels; returns its metrics."""
    selectors, grouping = promql_selectors(expr)
    metrics = {name for name, _ in selectors}
    assert metrics, f"{where}: no metric in {expr!r}"
    unknown = metrics - METRICS.keys()
    assert not unknown, f"{where}: {sorted(unknown)} not among the exported metrics"
    for name, matchers in selectors:
        bad = set(matchers) - METRICS[name] - TARGET_LABELS
        assert not bad, f"{where}: {name} has no label {sorted(bad)}"
    known = set().union(*(METRICS[n] for n in metrics)) | TARGET_LABELS
    assert grouping <= known, f"{where}: grouping by {sorted(grouping - known)}"
    return metrics


@pytest.mark.parametrize("expr, metrics, grouping", [
    ('sum by (a, b) (rate(x_total{namespace="n", c=~"1|2"}[5m])) / on (a) y > 0.05',
     {"x_total", "y"}, {"a", "b"}),
    ('(sum(z{q="a,b"}) or vector(0)) < 1e6 and on (pod) w', {"z", "w"}, {"pod"}),
    ('histogram_quantile(0.99, sum by (le) (rate(h_bucket{s=~"$service"}[$__rate_interval])))', {"h_bucket"}, {"le"}),
])
def test_the_promql_reader_finds_metrics_and_labels(expr, metrics, grouping):
    selectors, groups = promql_selectors(expr)
    assert {n for n, _ in selectors} == metrics and groups == grouping


def test_the_promql_check_refuses_unknown_metrics_and_labels():
    with pytest.raises(AssertionError):
        check_query('sum(sg_ready{namespace="x"}) + sg_redy', "test")
    with pytest.raises(AssertionError):
        check_query('sum by (grpc_cod) (grpc_server_handled_total)', "test")
    with pytest.raises(AssertionError):
        check_query('grpc_server_handled_total{grpc_cod="OK"}', "test")


# --- on and off ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production"])
def test_alerts_and_dashboard_are_off_by_default(variant):
    rendered = render(chartlib.production_values() if variant == "production" else {})
    assert not rendered.of_kind("PrometheusRule")
    assert rendered.find("ConfigMap", DASHBOARD) is None
    assert "grafana_dashboard" not in rendered.all_text


def test_alerts_and_dashboard_render_when_enabled():
    rendered = render(MONITORING)
    rule = _rule_object(rendered)
    assert rule["metadata"]["name"] == f"{RELEASE}-socialgraph"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert set(_alerts(rendered)) == set(ALERTS)
    cm = rendered.get("ConfigMap", DASHBOARD)
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    # Each renders on its own.
    only_rule = render({"prometheusRule": {"enabled": True}})
    assert only_rule.of_kind("PrometheusRule") and only_rule.find("ConfigMap", DASHBOARD) is None
    only_dashboard = render({"grafanaDashboard": {"enabled": True}})
    assert not only_dashboard.of_kind("PrometheusRule") and only_dashboard.find("ConfigMap", DASHBOARD)


def test_namespaces_labels_and_annotations_are_values():
    rendered = render(merged(MONITORING, {
        "fullnameOverride": "graph",
        "prometheusRule": {"namespace": "monitoring", "labels": {"release": "kube-prometheus-stack"},
                           "alertLabels": {"team": "social"}},
        "grafanaDashboard": {"namespace": "grafana", "labels": {"grafana_dashboard": None, "dashboards": "sg"},
                             "annotations": {"grafana_folder": "Socialgraph"}},
    }))
    rule = _rule_object(rendered)
    assert rule["metadata"]["name"] == "graph-socialgraph"
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for alert in _alerts(rendered).values():
        assert alert["labels"]["team"] == "social"
        # The series stay those of the release's namespace and Services, wherever the rule lives.
        for name, matchers in promql_selectors(alert["expr"])[0]:
            assert matchers["namespace"] == ("=", NAMESPACE), alert["expr"]
            op, value = matchers["service"]
            assert all(s.startswith("graph-") for s in value.split("|")), alert["expr"]
    cm = rendered.get("ConfigMap", "graph-socialgraph-dashboard")
    assert cm["metadata"]["namespace"] == "grafana"
    assert "grafana_dashboard" not in cm["metadata"]["labels"] and cm["metadata"]["labels"]["dashboards"] == "sg"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Socialgraph"}


def test_alerts_follow_the_deployed_components():
    # Without the gateway: no gateway alert, and readiness no longer watches it.
    without = _alerts(render(merged(MONITORING, {GATEWAY: {"enabled": False}})))
    assert set(without) == set(ALERTS) - {"SocialgraphGatewayErrorRatioHigh"}
    ready = dict(promql_selectors(without["SocialgraphReadinessFlapping"]["expr"])[0])["sg_ready"]
    assert ready["service"] == ("=~", f"{RELEASE}-relation|{RELEASE}-projection|{RELEASE}-counter|{RELEASE}-{MESSAGE}")
    # Relation-svc alone (the gateway calling another installation's services is not needed).
    alone = _alerts(render(merged(MONITORING, {"projection": {"enabled": False}, "counter": {"enabled": False},
                                               MESSAGE: {"enabled": False}, GATEWAY: {"enabled": False}})))
    assert set(alone) == {"SocialgraphOutboxBacklogGrowing", "SocialgraphRelayNotLed", "SocialgraphRelayLedTwice",
                          "SocialgraphRpcErrorRatioHigh", "SocialgraphReadinessFlapping"}
    rpc = dict(promql_selectors(alone["SocialgraphRpcErrorRatioHigh"]["expr"])[0])["grpc_server_handled_total"]
    assert rpc["service"] == ("=", f"{RELEASE}-relation")
    # No relay, no relay alerts.
    no_relay = _alerts(render(merged(MONITORING, {"relation": {"kafka": {"relayEnabled": False}},
                                                  MESSAGE: {"kafka": {"relayEnabled": False}}})))
    assert set(no_relay) == set(ALERTS) - {"SocialgraphRelayNotLed", "SocialgraphRelayLedTwice"}


def test_alerts_can_be_turned_off_one_by_one():
    values = merged(MONITORING, {"prometheusRule": {"alerts": {
        "counterDriftRepaired": {"enabled": False}, "readinessFlapping": {"enabled": False}}}})
    assert set(_alerts(render(values))) == set(ALERTS) - {"SocialgraphCounterDriftRepaired",
                                                          "SocialgraphReadinessFlapping"}
    keys = chartlib.chart().values["prometheusRule"]["alerts"]
    rendered = render(merged(MONITORING, {"prometheusRule": {"alerts": {k: {"enabled": False} for k in keys}}}))
    (group,) = _rule_object(rendered)["spec"]["groups"]
    assert group["rules"] == []
    chartlib.validate(_rule_object(rendered))


# --- validity ----------------------------------------------------------------------------------


def test_prometheus_rule_validates_against_its_schema():
    rule = _rule_object(render(MONITORING))
    chartlib.validate(rule)
    broken = json.loads(json.dumps(rule))
    broken["spec"]["groups"][0]["rules"][0]["expresion"] = "up"
    with pytest.raises(jsonschema.ValidationError):
        chartlib.validate(broken)
    broken = json.loads(json.dumps(rule))
    broken["spec"]["groups"][0]["rules"][0]["for"] = "10 minutes"
    with pytest.raises(jsonschema.ValidationError):
        chartlib.validate(broken)


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed (Debian package `prometheus`): run `make deps` (or `scripts/deps.sh promtool`)")
    return path


def _write_rules(rendered: chartlib.Rendered, directory: Path) -> Path:
    path = directory / "socialgraph.rules.yaml"
    path.write_text(yaml.safe_dump(_rule_object(rendered)["spec"], sort_keys=False))
    return path


ODD_VALUES = {
    "fullnameOverride": "graph",
    "prometheusRule": {"alertLabels": {"team": "social", "page": "yes"}, "alerts": {
        "projectionLagHigh": {"records": 2000000, "for": "1h30m"},
        "outboxBacklogGrowing": {"rows": 0, "growthWindow": "30m"},
        "counterDriftRepaired": {"window": "1h", "for": "0s", "severity": "info"},
        "relayLedTwice": {"severity": "off"},  # a YAML 1.1 boolean unless quoted
        "rpcErrorRatioHigh": {"ratio": 0.07, "minRequestsPerSecond": 0.00001, "codes": ["Internal"]},
        "gatewayErrorRatioHigh": {"ratio": 1, "minRequestsPerSecond": 25},
        "readinessFlapping": {"changes": 1, "window": "1h"},
    }},
}


@pytest.mark.parametrize("values", [MONITORING, merged(MONITORING, ODD_VALUES)], ids=["defaults", "tuned"])
def test_promtool_checks_the_rules(values, tmp_path):
    rendered = render(values)
    chartlib.validate(_rule_object(rendered))
    path = _write_rules(rendered, tmp_path)
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts(rendered))} rules found" in result.stdout, result.stdout


def test_tuned_values_reach_the_expressions():
    alerts = _alerts(render(merged(MONITORING, ODD_VALUES)))
    assert alerts["SocialgraphProjectionLagHigh"]["expr"].endswith("> 2000000")
    assert alerts["SocialgraphProjectionLagHigh"]["for"] == "1h30m"
    assert "[30m]" in alerts["SocialgraphOutboxBacklogGrowing"]["expr"]
    assert alerts["SocialgraphCounterDriftRepaired"]["labels"]["severity"] == "info"
    assert alerts["SocialgraphRelayLedTwice"]["labels"] == {"severity": "off", "namespace": NAMESPACE,
                                                            "team": "social", "page": "yes"}
    rpc = alerts["SocialgraphRpcErrorRatioHigh"]
    assert ") > 0.07\n" in rpc["expr"] and 'grpc_code=~"Internal"' in rpc["expr"]
    assert "more than 7% of the calls" in rpc["annotations"]["description"]
    assert "changes(sg_ready{" in alerts["SocialgraphReadinessFlapping"]["expr"]
    assert alerts["SocialgraphReadinessFlapping"]["expr"].endswith("[1h]) > 1")


# --- the alerts fire on the series the ServiceMonitors produce ----------------------------------


def _series(metric: str, component: str, pod: str, release: str = RELEASE, namespace: str = NAMESPACE,
            **labels: str) -> str:
    """A series as Prometheus stores it when a ServiceMonitor of the chart scrapes `pod`: job is
    the component (jobLabel), service the Service's name."""
    port = {"relation": 9101, "projection": 9102, "counter": 9103, MESSAGE: 9105, GATEWAY: 9104}[component]
    target = {"namespace": namespace, "service": f"{release}-{component}", "job": component, "pod": pod,
              "instance": f"10.0.0.1:{port}", "endpoint": "admin", "container": component}
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in {**target, **labels}.items()) + "}"


def _target(component: str, pod: str, **labels: str) -> dict[str, str]:
    port = {"relation": 9101, "projection": 9102, "counter": 9103, MESSAGE: 9105, GATEWAY: 9104}[component]
    return {"namespace": NAMESPACE, "service": f"{RELEASE}-{component}", "job": component, "pod": pod,
            "instance": f"10.0.0.1:{port}", "endpoint": "admin", "container": component, **labels}


FOLLOW = {"grpc_type": "unary", "grpc_service": "socialgraph.relation.v1.RelationService", "grpc_method": "Follow"}
UNFOLLOW = {**FOLLOW, "grpc_method": "Unfollow"}
REBUILD = {"grpc_type": "unary", "grpc_service": "socialgraph.projection.v1.ProjectionService", "grpc_method": "Rebuild"}

# alert -> (input series {series: values}, eval time, labels of each expected firing alert).
# Each scenario also holds series that must not fire: other releases and namespaces, values
# under the thresholds. Defaults: 1 minute between samples.
SCENARIOS = {
    "SocialgraphProjectionLagHigh": ({
        _series("sg_projection_lag_records", "projection", "sg-projection-0", partition="3"): "20000x40",
        _series("sg_projection_lag_records", "projection", "sg-projection-0", partition="5"): "10x40",
        _series("sg_projection_lag_records", "projection", "sg-projection-1", partition="4"): "9000x40",
        _series("sg_projection_lag_records", "projection", "other-projection-0", release="other",
                partition="4"): "90000x40",
        _series("sg_projection_lag_records", "projection", "sg-projection-0", namespace="staging",
                partition="4"): "90000x40",
    }, "30m", [{"namespace": NAMESPACE, "pod": "sg-projection-0"}]),
    "SocialgraphCounterLagHigh": ({
        _series("sg_counter_lag_records", "counter", "sg-counter-1", topic="sg.counter.v1", partition="0"): "15000x40",
        _series("sg_counter_lag_records", "counter", "sg-counter-1", topic="sg.relation.v1", partition="1"): "0x40",
        _series("sg_counter_lag_records", "counter", "other-counter-1", release="other", topic="sg.counter.v1",
                partition="0"): "15000x40",
    }, "30m", [{"namespace": NAMESPACE, "pod": "sg-counter-1", "topic": "sg.counter.v1"}]),
    "SocialgraphOutboxBacklogGrowing": ({
        _series("sg_outbox_backlog_rows", "relation", "sg-relation-a"): "20000+100x60",
        _series("sg_relay_leader", "relation", "sg-relation-a"): "1x60",
        # A replica that led before keeps its last count: not the leader, not counted.
        _series("sg_outbox_backlog_rows", "relation", "sg-relation-b"): "1+2000x60",
        _series("sg_relay_leader", "relation", "sg-relation-b"): "0x60",
    }, "40m", [_target("relation", "sg-relation-a")]),
    "SocialgraphRelayNotLed": ({
        _series("sg_relay_leader", "relation", "sg-relation-a"): "0x20",
        _series("sg_relay_leader", "relation", "sg-relation-b"): "1 1 0x18",
        _series("sg_relay_leader", "relation", "other-relation-a", release="other"): "1x20",
        _series("sg_relay_leader", "relation", "sg-relation-a", namespace="staging"): "1x20",
    }, "15m", [{"namespace": NAMESPACE}]),
    "SocialgraphRelayLedTwice": ({
        _series("sg_relay_leader", "relation", "sg-relation-a"): "1x20",
        _series("sg_relay_leader", "relation", "sg-relation-b"): "1x20",
    }, "15m", [{"namespace": NAMESPACE}]),
    "SocialgraphCounterDriftRepaired": ({
        _series("sg_counter_repairs_total", "counter", "sg-counter-0"): "0x10 1x20",
        _series("sg_counter_repairs_total", "counter", "sg-counter-1"): "7x30",
    }, "20m", [{"namespace": NAMESPACE, "pod": "sg-counter-0"}]),
    "SocialgraphRpcErrorRatioHigh": ({
        # Follow: 10 calls/s OK, 1/s Unavailable: 9% errors.
        _series("grpc_server_handled_total", "relation", "sg-relation-a", **FOLLOW, grpc_code="OK"): "0+600x40",
        _series("grpc_server_handled_total", "relation", "sg-relation-a", **FOLLOW,
                grpc_code="Unavailable"): "0+60x40",
        # Unfollow: half refused, but as client errors (NotFound, InvalidArgument).
        _series("grpc_server_handled_total", "relation", "sg-relation-a", **UNFOLLOW, grpc_code="OK"): "0+60x40",
        _series("grpc_server_handled_total", "relation", "sg-relation-a", **UNFOLLOW,
                grpc_code="InvalidArgument"): "0+60x40",
        # Rebuild: every call fails, but 0.05 calls/s is below the minimum rate.
        _series("grpc_server_handled_total", "projection", "sg-projection-0", **REBUILD,
                grpc_code="Internal"): "0+3x40",
        # Another gRPC service in the namespace.
        _series("grpc_server_handled_total", "relation", "x", release="payments", **FOLLOW,
                grpc_code="Internal"): "0+600x40",
    }, "30m", [{"namespace": NAMESPACE, "service": f"{RELEASE}-relation", "grpc_service": FOLLOW["grpc_service"],
                "grpc_method": "Follow"}]),
    "SocialgraphGatewayErrorRatioHigh": ({
        _series("sg_gateway_requests_total", GATEWAY, "sg-gateway-x", route="RelationService.Follow",
                code="200"): "0+600x40",
        _series("sg_gateway_requests_total", GATEWAY, "sg-gateway-x", route="RelationService.Follow",
                code="503"): "0+120x40",
        _series("sg_gateway_requests_total", GATEWAY, "sg-gateway-x", route="unmatched", code="404"): "0+600x40",
        _series("sg_gateway_requests_total", GATEWAY, "sg-gateway-x", route="ProjectionService.ListFollowers",
                code="200"): "0+600x40",
    }, "30m", [{"namespace": NAMESPACE, "route": "RelationService.Follow"}]),
    "SocialgraphReadinessFlapping": ({
        _series("sg_ready", GATEWAY, "sg-gateway-x"): "1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0",
        _series("sg_ready", "projection", "sg-projection-1"): "0 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 1",
        _series("sg_ready", "relation", "sg-relation-a"): "0 1x20",
        _series("sg_ready", "relation", "other-relation-a", release="other"): "1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0",
    }, "20m", [_target(GATEWAY, "sg-gateway-x"), _target("projection", "sg-projection-1")]),
}


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_every_alert_has_a_firing_scenario():
    assert set(SCENARIOS) == set(ALERTS)


def test_alerts_fire_on_the_release_series_only(tmp_path):
    """`promtool test rules`: in each scenario exactly the expected alerts fire (with their
    severity, the labels they group by and the alertLabels), and nothing fires from another
    release, another namespace or values under the thresholds."""
    rendered = render(merged(MONITORING, {"prometheusRule": {"alertLabels": {"team": "social"}}}))
    rules = _write_rules(rendered, tmp_path)
    tests = []
    for alert, (series, at, expected) in SCENARIOS.items():
        if not any(s.startswith("sg_relay_leader{") for s in series):
            # A relay leader, so that SocialgraphRelayNotLed stays quiet.
            series = {**series, _series("sg_relay_leader", "relation", "sg-relation-a"): "1x60"}
        exp = [{"labels": "ALERTS" + _labels({**labels, "alertname": alert, "alertstate": "firing",
                                              "severity": ALERTS[alert], "team": "social"}), "value": 1}
               for labels in expected]
        tests.append({
            "name": alert,
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "promql_expr_test": [
                {"expr": f'ALERTS{{alertname="{alert}"}}', "eval_time": at, "exp_samples": exp},
                # Nothing else fires in the scenario.
                {"expr": f'ALERTS{{alertname!="{alert}"}}', "eval_time": at, "exp_samples": []},
            ],
        })
    # The relay's alerts also fire when no relation-svc replica is scraped at all.
    tests.append({
        "name": "no relation-svc scraped",
        "interval": "1m",
        "input_series": [{"series": _series("sg_ready", GATEWAY, "sg-gateway-x"), "values": "1x20"}],
        "promql_expr_test": [{"expr": 'ALERTS{alertname="SocialgraphRelayNotLed"}', "eval_time": "10m",
                              "exp_samples": [{"labels": "ALERTS" + _labels({
                                  "alertname": "SocialgraphRelayNotLed", "alertstate": "firing", "severity": "critical",
                                  "namespace": NAMESPACE, "team": "social"}), "value": 1}]}],
    })
    # Before `for` has passed, an alert is pending, not firing.
    tests.append({
        "name": "pending before for",
        "interval": "1m",
        "input_series": [{"series": _series("sg_relay_leader", "relation", "sg-relation-a"), "values": "0x20"}],
        "promql_expr_test": [{"expr": 'ALERTS{alertname="SocialgraphRelayNotLed", alertstate="firing"}',
                              "eval_time": "3m", "exp_samples": []}],
    })
    path = tmp_path / "socialgraph.test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- annotations and the runbook --------------------------------------------------------------


def _book_anchor(heading: str) -> str:
    """The id mdBook (and GitHub) gives a Markdown heading: lower case, spaces to dashes, other
    punctuation dropped."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _runbook_sections() -> dict[str, str]:
    """The runbook page's `## <alert>` sections, by heading."""
    text = RUNBOOK.read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_alert_is_annotated_and_has_a_runbook_section():
    sections = _runbook_sections()
    anchors = [_book_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", RUNBOOK.read_text(), re.M)]
    assert sorted(sections) == sorted(ALERTS), "one ## heading per alert in the runbook"
    for name, rule in _alerts(render(MONITORING)).items():
        assert rule["labels"]["severity"] == ALERTS[name]
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["summary"].strip() and annotations["description"].strip(), name
        base, _, anchor = annotations["runbook_url"].partition("#")
        assert base == RUNBOOK_BASE and anchor == name.lower(), annotations["runbook_url"]
        assert anchors.count(anchor) == 1, f"{anchor}: no (or no unique) heading in the runbook"
        # Each section says what it means, what to check and what to do.
        for part in ("*Means:*", "*Check:*", "*Do:*"):
            assert part in sections[name], f"{name}: no {part}"
    rule = _alerts(render(merged(MONITORING, {"prometheusRule": {"runbookBaseUrl": "https://wiki.example.com/sg/"}})))
    assert rule["SocialgraphRelayNotLed"]["annotations"]["runbook_url"] == (
        "https://wiki.example.com/sg#socialgraphrelaynotled")


# --- the metrics every query names --------------------------------------------------------------


def test_rules_use_only_exported_metrics_scoped_to_the_release():
    for name, rule in _alerts(render(MONITORING)).items():
        assert check_query(rule["expr"], name) == ALERT_METRICS[name]
        for metric, matchers in promql_selectors(rule["expr"])[0]:
            assert matchers.get("namespace") == ("=", NAMESPACE), (name, metric)
            op, value = matchers["service"]
            assert set(value.split("|")) <= {f"{RELEASE}-{c}" for c in chartlib.COMPONENTS}, (name, value)


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def test_dashboard_queries_only_exported_metrics():
    dashboard = _dashboard(render(MONITORING))
    assert dashboard["uid"].startswith("sg-") and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "service"):
        var = variables[name]
        assert var["type"] == "query" and var["datasource"]["uid"] == "${datasource}"
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
        assert m and m.group(2) == name, var["definition"]
        assert check_query(m.group(1), f"variable {name}") == {"sg_ready"}
        assert var["query"]["query"] == var["definition"]
    used = {}
    ids = []
    for panel in _panels(dashboard):
        ids.append(panel["id"])
        assert panel.get("title"), panel
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            assert not panel.get("targets")
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        metrics = set()
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), panel["title"]
            metrics |= check_query(target["expr"], panel["title"])
            for metric, matchers in promql_selectors(target["expr"])[0]:
                assert matchers.get("namespace") == ("=", "$namespace"), (panel["title"], metric)
                assert matchers.get("service") == ("=~", "$service"), (panel["title"], metric)
        used[panel["title"]] = metrics
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert used == PANEL_METRICS


def test_dashboard_file_is_packaged_unchanged():
    files = {f["name"]: f["data"] for f in chartlib.chart().files}
    assert "dashboards/socialgraph.json" in files, ".helmignore drops the dashboard"
    source = (chartlib.CHART_DIR / "dashboards" / "socialgraph.json").read_text()
    assert json.loads(files["dashboards/socialgraph.json"]) == json.loads(source)
    rendered = _dashboard(render(MONITORING))
    release = {"uid": rendered.pop("uid"), "title": rendered.pop("title")}
    expected = json.loads(source)
    del expected["uid"], expected["title"]
    assert rendered == expected, "only the uid and the title are the release's own"
    assert release["title"] == f"socialgraph ({chartlib.NAMESPACE}/{chartlib.RELEASE})"
    assert len(release["uid"]) <= 40


def test_two_releases_get_two_dashboards():
    one = _dashboard(render(MONITORING))
    other = _dashboard(render(MONITORING, name="sg-canary"), "sg-canary-socialgraph-dashboard")
    elsewhere = _dashboard(render(MONITORING, namespace="social-eu"))
    assert len({one["uid"], other["uid"], elsewhere["uid"]}) == 3
    assert len({one["title"], other["title"], elsewhere["title"]}) == 3


# --- values.schema.json ---------------------------------------------------------------------------

INVALID = {
    "ratio above one": ({"prometheusRule": {"alerts": {"rpcErrorRatioHigh": {"ratio": 5}}}},
                        "/prometheusRule/alerts/rpcErrorRatioHigh/ratio", "maximum"),
    "zero ratio": ({"prometheusRule": {"alerts": {"gatewayErrorRatioHigh": {"ratio": 0}}}},
                   "/prometheusRule/alerts/gatewayErrorRatioHigh/ratio", "exclusiveMinimum"),
    "for in words": ({"prometheusRule": {"alerts": {"projectionLagHigh": {"for": "ten minutes"}}}},
                     "/prometheusRule/alerts/projectionLagHigh/for", "pattern"),
    "lag as a string": ({"prometheusRule": {"alerts": {"counterLagHigh": {"records": "10k"}}}},
                        "/prometheusRule/alerts/counterLagHigh/records", "want integer"),
    "misspelt alert": ({"prometheusRule": {"alerts": {"projectionLag": {"enabled": False}}}},
                       "/prometheusRule/alerts", "'projectionLag' not allowed"),
    "misspelt threshold": ({"prometheusRule": {"alerts": {"outboxBacklogGrowing": {"row": 5}}}},
                           "/prometheusRule/alerts/outboxBacklogGrowing", "'row' not allowed"),
    "unknown grpc code": ({"prometheusRule": {"alerts": {"rpcErrorRatioHigh": {"codes": ["INTERNAL"]}}}},
                          "/prometheusRule/alerts/rpcErrorRatioHigh/codes/0", "Internal"),
    "no grpc code": ({"prometheusRule": {"alerts": {"rpcErrorRatioHigh": {"codes": []}}}},
                     "/prometheusRule/alerts/rpcErrorRatioHigh/codes", "minItems"),
    "severity with a space": ({"prometheusRule": {"alerts": {"relayNotLed": {"severity": "page me"}}}},
                              "/prometheusRule/alerts/relayNotLed/severity", "pattern"),
    "runbook url with an anchor": ({"prometheusRule": {"runbookBaseUrl": "https://x.example.com/README.md#runbook"}},
                                   "/prometheusRule/runbookBaseUrl", "pattern"),
    "alert label overriding severity": ({"prometheusRule": {"alertLabels": {"severity": "page"}}},
                                        "", "invalid propertyName 'severity'"),
    "rule labels as a list": ({"prometheusRule": {"labels": ["release"]}}, "/prometheusRule/labels", "want object"),
    "dashboard enabled as a word": ({"grafanaDashboard": {"enabled": "yes"}}, "/grafanaDashboard/enabled",
                                    "want boolean"),
    "dashboard in a bad namespace": ({"grafanaDashboard": {"namespace": "Grafana"}}, "/grafanaDashboard/namespace",
                                     "pattern"),
    "misspelt dashboard key": ({"grafanaDashboard": {"label": {}}}, "/grafanaDashboard", "'label' not allowed"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_schema_rejects_invalid_monitoring_values(case):
    values, pointer, reason = INVALID[case]
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    message = str(err.value)
    assert f"at '{pointer}" in message and reason in message, message
