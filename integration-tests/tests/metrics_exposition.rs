//! The admin endpoints as Prometheus reads them: every service's and the gateway's `/metrics`
//! parses with promtool (Debian's prometheus package, installed by `make deps`), passes its
//! naming lint but for the listed exceptions, and carries the RED metrics of every RPC under
//! the grpc-ecosystem names, and `sg_ready`.

use std::io::Write;
use std::process::{Command, Stdio};

use socialgraph_integration_tests::Mesh;
use socialgraph_integration_tests::gateway::spawn_gateway;
use socialgraph_proto::relation::v1::FollowRequest;

/// Lint findings of promtool accepted as they are: `sg_relay_lag_ms` (renaming it would break
/// dashboards and alerts already written against it), and counter-svc's `sg_counter_*` names,
/// where "counter" is the service, not the metric type.
fn accepted(finding: &str) -> bool {
    finding == "sg_relay_lag_ms metric names should not contain abbreviated units"
        || (finding.starts_with("sg_counter_") && finding.ends_with("metric name should not include type 'counter'"))
}

/// promtool's verdict on `text`: parse errors fail the test; lint findings are returned.
fn promtool(what: &str, text: &str) -> anyhow::Result<Vec<String>> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("promtool is not installed ({e}): run `make deps` (step promtool)"))?;
    child.stdin.take().ok_or_else(|| anyhow::anyhow!("no stdin"))?.write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!said.contains("parsing error") && out.status.code() != Some(1), "{what}/metrics does not parse: {said}");
    Ok(said.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect())
}

async fn scrape(admin: std::net::SocketAddr) -> anyhow::Result<String> {
    Ok(reqwest::get(format!("http://{admin}/metrics")).await?.text().await?)
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_admin_endpoint_parses_and_counts_rpcs_by_code() -> anyhow::Result<()> {
    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let gw = spawn_gateway(&mesh, |_| {}).await?;
    let mut relation = mesh.relation.client().await?;
    relation.follow(FollowRequest { follower_id: 1, followee_id: 2 }).await?;
    relation.follow(FollowRequest { follower_id: 1, followee_id: 3 }).await?;
    let refused = relation.follow(FollowRequest { follower_id: 4, followee_id: 4 }).await;
    assert_eq!(refused.map(|_| ()).map_err(|s| s.code()), Err(tonic::Code::InvalidArgument));
    gw.call(reqwest::Method::GET, "/v1/users/1/following", None).await?;

    let text = scrape(mesh.relation.admin_addr).await?;
    // The text format writes labels in name order.
    let follow = r#"grpc_method="Follow",grpc_service="socialgraph.relation.v1.RelationService",grpc_type="unary""#;
    assert_eq!(value(&text, &format!("grpc_server_started_total{{{follow}}}")), Some(3.0), "{text}");
    let handled = |code: &str| value(&text, &format!("grpc_server_handled_total{{grpc_code=\"{code}\",{follow}}}"));
    assert_eq!((handled("OK"), handled("InvalidArgument")), (Some(2.0), Some(1.0)));
    assert_eq!(value(&text, &format!("grpc_server_handling_seconds_count{{{follow}}}")), Some(3.0));
    assert!(text.contains("grpc_server_handling_seconds_bucket{") && text.contains(r#"le="0.00025""#), "sub-millisecond buckets");
    assert!(text.contains(r#"grpc_method="ListFollowing""#), "the gateway's call is counted by the service too");

    let services =
        [("relation-svc", mesh.relation.admin_addr), ("projection-svc", mesh.projection.admin_addr), ("counter-svc", mesh.counter.admin_addr)];
    for (name, admin) in services {
        // projection-svc is ready once its consumers run.
        let text = socialgraph_testkit::eventually(std::time::Duration::from_secs(30), "every service to report sg_ready 1", || async move {
            let text = scrape(admin).await?;
            Ok((value(&text, "sg_ready") == Some(1.0)).then_some(text))
        })
        .await?;
        let lint: Vec<String> = promtool(name, &text)?.into_iter().filter(|l| !accepted(l)).collect();
        assert!(lint.is_empty(), "{name}/metrics: promtool lint findings {lint:?}");
    }
    let (_, text) = gw.admin_get("/metrics").await?;
    assert_eq!(value(&text, "sg_ready"), Some(1.0));
    assert!(text.contains(r#"sg_gateway_requests_total{code="200",route="RelationService.ListFollowing"} 1"#), "{text}");
    let lint = promtool("gateway", &text)?;
    assert!(lint.is_empty(), "gateway/metrics: promtool lint findings {lint:?}");
    gw.stop().await?;
    mesh.stop().await
}
