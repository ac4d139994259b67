//! The HTTP/JSON gateway in front of the real mesh (PostgreSQL, Redis, the broker): every
//! annotated route called over HTTP, with paging, proto3 JSON, errors as google.rpc.Status
//! under the standard HTTP mapping, limits, CORS, trace context and the OpenAPI document.

use reqwest::Method;
use serde_json::{Value, json};
use socialgraph_integration_tests::Mesh;
use socialgraph_integration_tests::gateway::{GatewaySvc, spawn_gateway};

const ORIGIN: &str = "http://app.example";

async fn ok(gw: &GatewaySvc, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let a = gw.call(method.clone(), path, body).await?;
    assert_eq!(a.status, 200, "{method} {path}: {}", a.json);
    assert_eq!(a.headers["content-type"], "application/json");
    Ok(a.json)
}

fn ids(list: &Value, field: &str) -> Vec<String> {
    list.as_array().map(|l| l.iter().filter_map(|e| e[field].as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

/// Follow, paging, relationships, joins and counts of the relation side; returns the
/// consistency tokens of 11's last follow (11 -> 16) and of 12 -> 13.
async fn relation_routes(gw: &GatewaySvc) -> anyhow::Result<[String; 2]> {
    let first = ok(gw, Method::POST, "/v1/users/11/following/12", None).await?;
    assert_eq!(first["changed"], true);
    assert_eq!(first["version"], "1", "int64 is a string in proto3 JSON");
    assert!(first["followedAt"].as_str().is_some_and(|t| t.ends_with('Z') && t.contains('T')), "Timestamps are RFC 3339: {first}");
    let again = ok(gw, Method::POST, "/v1/users/11/following/12", None).await?;
    assert_eq!(again["changed"], false, "false is printed, not left out: {again}");
    let mut tokens = Vec::new();
    for followee in 13..=16 {
        let follow = ok(gw, Method::POST, &format!("/v1/users/11/following/{followee}"), None).await?;
        if followee == 16 {
            tokens.push(follow["consistencyToken"].as_str().unwrap_or_default().to_owned());
        }
    }
    let last = ok(gw, Method::POST, "/v1/users/12/following/13", None).await?;
    tokens.push(last["consistencyToken"].as_str().unwrap_or_default().to_owned());
    assert!(tokens.iter().all(|t| !t.is_empty()));

    let (mut seen, mut page_token) = (Vec::new(), String::new());
    loop {
        let page = ok(gw, Method::GET, &format!("/v1/users/11/following?page_size=2&page_token={page_token}"), None).await?;
        let got = ids(&page["following"], "userId");
        assert!(got.len() <= 2);
        seen.extend(got);
        page_token = page["nextPageToken"].as_str().unwrap_or_default().to_owned();
        if page_token.is_empty() {
            break;
        }
        page_token = url_encode(&page_token);
    }
    assert_eq!(seen, ["16", "15", "14", "13", "12"], "newest first, no entry skipped or repeated across pages");
    let bad = gw.call(Method::GET, "/v1/users/11/following?page_token=edited", None).await?;
    assert_eq!((bad.status, bad.reason().as_str()), (400, "BAD_PAGE_TOKEN"), "{}", bad.json);

    let rel = ok(gw, Method::GET, "/v1/users/11/relationships/12", None).await?;
    assert_eq!(rel["relationship"]["following"], true);
    let batch = ok(gw, Method::POST, "/v1/users/11/relationships:batchGet", Some(json!({"otherUserIds": ["12", "99"]}))).await?;
    assert_eq!(ids(&batch["relationships"], "otherUserId"), ["12", "99"], "{batch}");
    let common = ok(gw, Method::GET, "/v1/users/11/common_following/12", None).await?;
    assert!(common.to_string().contains("\"13\""), "{common}");
    ok(gw, Method::GET, "/v1/users/11/familiar_followers/13", None).await?;
    let count = ok(gw, Method::GET, "/v1/users/11/following:count", None).await?;
    assert_eq!(count["count"], "5");

    let selfie = gw.call(Method::POST, "/v1/users/11/following/11", None).await?;
    assert_eq!((selfie.status, selfie.json["code"].as_i64()), (400, Some(3)), "{}", selfie.json);
    assert_eq!(selfie.reason(), "SELF_FOLLOW");
    assert!(selfie.json.to_string().contains("google.rpc.BadRequest"), "details keep their types: {}", selfie.json);
    Ok([tokens.remove(0), tokens.remove(0)])
}

/// The follower side and the counters, read with consistency tokens. A token covers its own
/// edge and, because a partition is applied in order, every earlier change of the same follower
/// (the record key); 11's and 12's follows may sit on different partitions. So each view is
/// first read with the token of 11's last follow, then every read that expects 12 -> 13 as well
/// holds that follow's token.
async fn projection_and_counter_routes(gw: &GatewaySvc, [older, token]: &[String; 2]) -> anyhow::Result<()> {
    let o = url_encode(older);
    ok(gw, Method::GET, &format!("/v1/users/13/edge_counts?consistency_token={o}"), None).await?;
    ok(gw, Method::GET, &format!("/v1/users/13/counters?consistency_token={o}"), None).await?;
    let t = url_encode(token);
    let followers = ok(gw, Method::GET, &format!("/v1/users/13/followers?consistency_token={t}"), None).await?;
    assert_eq!(ids(&followers["followers"], "userId"), ["12", "11"], "{followers}");
    let count = ok(gw, Method::GET, &format!("/v1/users/13/followers:count?consistency_token={t}"), None).await?;
    assert_eq!(count["count"], "2");
    let check =
        ok(gw, Method::POST, "/v1/users/13/followers:batchCheck", Some(json!({"candidateIds": ["11", "14"], "consistencyToken": token}))).await?;
    assert!(check.to_string().contains("\"11\""), "{check}");
    ok(gw, Method::GET, &format!("/v1/users/13/edge_counts?consistency_token={t}"), None).await?;
    ok(gw, Method::POST, "/v1/edge_counts:batchGet", Some(json!({"userIds": ["11", "13"]}))).await?;
    ok(gw, Method::GET, "/v1/projection/status", None).await?;

    let counters = ok(gw, Method::GET, &format!("/v1/users/13/counters?consistency_token={t}"), None).await?;
    assert_eq!(counters["counters"]["followers"], "2", "{counters}");
    // Zero values are printed, not left out: a JavaScript caller reads "0", never undefined.
    for zero in ["posts", "likesReceived", "favsReceived"] {
        assert_eq!(counters["counters"][zero], "0", "{zero}: {counters}");
    }
    let batch = ok(gw, Method::POST, "/v1/counters:batchGet", Some(json!({"userIds": ["11", "13"], "consistencyToken": token}))).await?;
    assert_eq!(batch["counters"][0]["followings"], "5", "{batch}");

    let like = ok(gw, Method::POST, "/v1/entities/post/77/likes/11?owner_id=13", None).await?;
    assert_eq!((like["changed"].clone(), like["active"].clone()), (json!(true), json!(true)));
    ok(gw, Method::POST, "/v1/entities/post/77/favs/11?owner_id=13", None).await?;
    let counts = ok(gw, Method::GET, "/v1/entities/post/77/counts?metrics=METRIC_LIKE&metrics=METRIC_FAV", None).await?;
    assert_eq!(counts["counts"]["counts"], json!([{"metric": "METRIC_LIKE", "count": "1"}, {"metric": "METRIC_FAV", "count": "1"}]), "enums by name");
    let many = ok(gw, Method::POST, "/v1/entities:batchGetCounts", Some(json!({"entities": [{"entityType": "post", "entityId": "77"}]}))).await?;
    assert_eq!(many["counts"][0]["entity"]["entityId"], "77");
    let states = ok(gw, Method::POST, "/v1/users/11/action_states:batchGet", Some(json!({"entityType": "post", "entityIds": ["77", "78"]}))).await?;
    assert!(states.to_string().contains("liked"), "{states}");
    ok(gw, Method::DELETE, "/v1/entities/post/77/likes/11?owner_id=13", None).await?;
    ok(gw, Method::DELETE, "/v1/entities/post/77/favs/11?owner_id=13", None).await?;
    let bad = gw.call(Method::POST, "/v1/entities/Bad-Type!/77/likes/11", None).await?;
    assert_eq!(bad.status, 400, "{}", bad.json);
    Ok(())
}

/// Posts and timelines (FeedService, served by projection-svc): 11 follows 13.
async fn feed_routes(gw: &GatewaySvc) -> anyhow::Result<()> {
    ok(gw, Method::POST, "/v1/users/13/posts/900", Some(json!({"createdAt": "2026-01-02T03:04:05Z"}))).await?;
    socialgraph_testkit::eventually(std::time::Duration::from_secs(30), "the post to reach the timeline", || async {
        let timeline = ok(gw, Method::GET, "/v1/users/11/timeline?page_size=10", None).await?;
        let posts = ok(gw, Method::GET, "/v1/users/13/posts", None).await?;
        let seen = ids(&timeline["posts"], "postId") == ["900"] && ids(&posts["posts"], "postId") == ["900"];
        if seen {
            assert_eq!(timeline["posts"][0]["createdAt"], "2026-01-02T03:04:05Z", "{timeline}");
        }
        Ok(seen.then_some(()))
    })
    .await?;
    // Once the post is recorded, its id is 13's.
    let taken = gw.call(Method::POST, "/v1/users/12/posts/900", Some(json!({}))).await?;
    assert_eq!((taken.status, taken.reason()), (409, "POST_ID_TAKEN".to_owned()), "{}", taken.json);
    // Catching up from post 900: the walks come from the query parameters.
    ok(gw, Method::POST, "/v1/users/13/posts/901", Some(json!({"createdAt": "2026-01-02T03:04:06Z"}))).await?;
    socialgraph_testkit::eventually(std::time::Duration::from_secs(30), "the newer post to reach the timeline", || async {
        let up = ok(gw, Method::GET, "/v1/users/11/timeline?min_post_id=900&page_size=1", None).await?;
        Ok((ids(&up["posts"], "postId") == ["901"]).then_some(()))
    })
    .await?;
    let down = ok(gw, Method::GET, "/v1/users/11/timeline?since_post_id=900", None).await?;
    assert_eq!(ids(&down["posts"], "postId"), ["901"], "{down}");
    let both = gw.call(Method::GET, "/v1/users/11/timeline?min_post_id=900&since_post_id=900", None).await?;
    assert_eq!(both.status, 400, "{}", both.json);
    let unknown = gw.call(Method::GET, "/v1/users/11/timeline?min_post_id=899", None).await?;
    assert_eq!((unknown.status, unknown.reason()), (400, "UNKNOWN_POST".to_owned()), "{}", unknown.json);
    ok(gw, Method::DELETE, "/v1/users/13/posts/901", None).await?;
    ok(gw, Method::DELETE, "/v1/users/13/posts/900", None).await?;
    let bad = gw.call(Method::GET, "/v1/users/0/timeline", None).await?;
    assert_eq!(bad.status, 400, "{}", bad.json);
    Ok(())
}

/// Blocks, mutes, removed followers, unfollows and account lifecycle.
async fn restriction_and_account_routes(gw: &GatewaySvc) -> anyhow::Result<()> {
    ok(gw, Method::POST, "/v1/users/20/blocks/21", None).await?;
    let blocked = gw.call(Method::POST, "/v1/users/21/following/20", None).await?;
    assert_eq!((blocked.status, blocked.reason().as_str()), (409, "BLOCKED"), "FAILED_PRECONDITION BLOCKED is a conflict: {}", blocked.json);
    assert!(ok(gw, Method::GET, "/v1/users/20/blocks", None).await?.to_string().contains("\"21\""));
    ok(gw, Method::DELETE, "/v1/users/20/blocks/21", None).await?;
    ok(gw, Method::POST, "/v1/users/20/mutes/22", None).await?;
    assert!(ok(gw, Method::GET, "/v1/users/20/mutes", None).await?.to_string().contains("\"22\""));
    ok(gw, Method::DELETE, "/v1/users/20/mutes/22", None).await?;
    assert_eq!(ok(gw, Method::DELETE, "/v1/users/13/followers/12", None).await?["changed"], true);
    assert_eq!(ok(gw, Method::DELETE, "/v1/users/11/following/16", None).await?["changed"], true);

    assert_eq!(ok(gw, Method::PUT, "/v1/accounts/30/locked", Some(json!({"locked": true}))).await?["changed"], true);
    assert_eq!(ok(gw, Method::POST, "/v1/users/31/following/30", None).await?["requested"], true);
    ok(gw, Method::POST, "/v1/users/32/following/30", None).await?;
    let incoming = ok(gw, Method::GET, "/v1/users/30/follow_requests?direction=REQUEST_DIRECTION_INCOMING", None).await?;
    assert_eq!(incoming["accounts"].as_array().map(Vec::len), Some(2), "{incoming}");
    ok(gw, Method::POST, "/v1/users/30/follow_requests:approve", Some(json!({"requesterIds": ["31"]}))).await?;
    ok(gw, Method::POST, "/v1/users/30/follow_requests:reject", Some(json!({"requesterIds": ["32"]}))).await?;
    let account = ok(gw, Method::GET, "/v1/accounts/30", None).await?;
    assert!(account.to_string().contains("ACCOUNT_STATUS_ACTIVE"), "{account}");
    let status = ok(gw, Method::PUT, "/v1/accounts/33/status", Some(json!({"status": "ACCOUNT_STATUS_DEACTIVATED"}))).await?;
    assert!(status.to_string().contains("ACCOUNT_STATUS_DEACTIVATED"), "{status}");
    ok(gw, Method::DELETE, "/v1/accounts/34", None).await?;

    // Credentials: none, or a wrong token, is 401 with a bearer challenge; the admin's passes.
    let suspend = Some(json!({"status": "ACCOUNT_STATUS_SUSPENDED"}));
    let none = gw.call(Method::PUT, "/v1/accounts/35/status", suspend.clone()).await?;
    assert_eq!((none.status, none.reason().as_str()), (401, "CREDENTIALS_MISSING"), "{}", none.json);
    assert_eq!(none.headers.get("www-authenticate").and_then(|v| v.to_str().ok()), Some("Bearer realm=\"socialgraph\""));
    let wrong = gw.call_with(Method::PUT, "/v1/accounts/35/status", suspend.clone(), &[("authorization", "Bearer not-the-token")]).await?;
    assert_eq!((wrong.status, wrong.reason().as_str()), (401, "CREDENTIALS_INVALID"), "{}", wrong.json);
    let challenge = wrong.headers.get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    let bearer = format!("Bearer {}", socialgraph_integration_tests::ADMIN_TOKEN);
    let admin = gw.call_with(Method::PUT, "/v1/accounts/35/status", suspend, &[("authorization", &bearer)]).await?;
    assert_eq!(admin.status, 200, "{}", admin.json);
    let relationship = ok(gw, Method::GET, "/v1/users/20/relationships/21", None).await?;
    for flag in ["following", "followedBy", "blocking", "blockedBy", "muting", "requested", "requestedBy"] {
        assert_eq!(relationship["relationship"][flag], false, "{flag} is printed when false: {relationship}");
    }
    Ok(())
}

/// What grpcurl (from `.venv`, installed by `make deps`) prints for `method` with `request`.
async fn grpcurl(addr: std::net::SocketAddr, method: &str, request: Value) -> anyhow::Result<Value> {
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/grpcurl");
    anyhow::ensure!(tool.exists(), "{} is missing: run `make deps`", tool.display());
    let mut command = std::process::Command::new(tool);
    command.args(["-plaintext", "-emit-defaults", "-d", &request.to_string(), &addr.to_string(), method]);
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    anyhow::ensure!(output.status.success(), "grpcurl {method}: {}", String::from_utf8_lossy(&output.stderr));
    let mut printed: Value = serde_json::from_slice(&output.stdout)?;
    drop_nulls(&mut printed);
    Ok(printed)
}

/// grpcurl's `-emit-defaults` prints an unset message field as `null`; the gateway leaves it
/// out (a message field has presence), which a JSON reader takes alike.
fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// The gateway answers the same JSON as grpcurl prints for the same RPC with `-emit-defaults`
/// (int64 strings, RFC 3339 times, enum names, zero values printed).
async fn same_as_grpcurl(gw: &GatewaySvc, mesh: &Mesh) -> anyhow::Result<()> {
    let cases = [
        (
            "/v1/users/11/following?page_size=10",
            mesh.relation.addr,
            "socialgraph.relation.v1.RelationService/ListFollowing",
            json!({"user_id": 11, "page_size": 10}),
        ),
        (
            "/v1/users/11/relationships/12",
            mesh.relation.addr,
            "socialgraph.relation.v1.RelationService/GetRelationship",
            json!({"user_id": 11, "other_user_id": 12}),
        ),
        ("/v1/accounts/33", mesh.relation.addr, "socialgraph.relation.v1.RelationService/GetAccount", json!({"user_id": 33})),
        ("/v1/users/13/followers", mesh.projection.addr, "socialgraph.projection.v1.ProjectionService/ListFollowers", json!({"user_id": 13})),
        (
            "/v1/entities/post/77/counts?metrics=METRIC_LIKE",
            mesh.counter.addr,
            "socialgraph.counter.v1.CounterService/GetEntityCounts",
            json!({"entity": {"entity_type": "post", "entity_id": 77}, "metrics": ["METRIC_LIKE"]}),
        ),
    ];
    for (path, addr, method, request) in cases {
        let via_gateway = ok(gw, Method::GET, path, None).await?;
        assert_eq!(via_gateway, grpcurl(addr, method, request).await?, "GET {path} prints what grpcurl prints for {method}");
    }
    Ok(())
}

/// Raw HTTP/1.1 on a fresh connection: what comes back before the server answers or closes
/// (at most 20 s).
async fn raw(gw: &GatewaySvc, request: &[u8]) -> anyhow::Result<(String, std::time::Duration)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = std::time::Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(gw.base.trim_start_matches("http://")).await?;
    tcp.write_all(request).await?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), tcp.read_to_end(&mut answer)).await;
    Ok((String::from_utf8_lossy(&answer).into_owned(), started.elapsed()))
}

/// With a 3 s request timeout: a declared body over the limit is refused before it is sent, a
/// body that never comes is 408 (not a 504 that blames the service), and headers that never
/// end get the connection closed.
async fn slow_and_lying_clients(gw: &GatewaySvc) -> anyhow::Result<()> {
    let head = "POST /v1/counters:batchGet HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\n";
    let (answer, took) = raw(gw, format!("{head}content-length: 99999999999\r\n\r\n{{}}").as_bytes()).await?;
    assert!(answer.starts_with("HTTP/1.1 413") && took.as_secs() < 2, "{answer} after {took:?}");
    let (answer, took) = raw(gw, format!("{head}content-length: 100\r\n\r\n{{").as_bytes()).await?;
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("\"code\":4"), "{answer}");
    assert!(took.as_secs() < 10, "{took:?}");
    let (answer, took) = raw(gw, b"GET /v1/users/1/following HTTP/1.1\r\nhost: x\r\n").await?;
    assert!(took.as_secs() < 15, "a request whose headers never end is dropped at the header timeout: {answer:?} after {took:?}");
    Ok(())
}

fn url_encode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_route_answers_over_http_against_the_real_mesh() -> anyhow::Result<()> {
    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let gw = spawn_gateway(&mesh, |_| {}).await?;
    let tokens = relation_routes(&gw).await?;
    projection_and_counter_routes(&gw, &tokens).await?;
    feed_routes(&gw).await?;
    restriction_and_account_routes(&gw).await?;
    same_as_grpcurl(&gw, &mesh).await?;
    // MessageService's routes and the unread counts: tests/gateway_messages.rs (with message-svc).
    let all: std::collections::BTreeSet<String> = socialgraph_httpapi::routes(&socialgraph_httpapi::pool()?)?
        .iter()
        .map(socialgraph_httpapi::Route::label)
        .filter(|l| !l.starts_with("MessageService.") && l != "CounterService.GetUnreadCounts")
        .collect();
    let called = gw.called.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    assert_eq!(called, all, "every route is exercised");
    let (status, metrics) = gw.admin_get("/metrics").await?;
    assert_eq!(status, 200);
    assert!(metrics.contains("sg_gateway_requests_total{code=\"200\",route=\"RelationService.Follow\"}"), "{metrics}");
    assert!(metrics.contains("sg_gateway_request_duration_seconds_bucket"));
    assert_eq!(gw.admin_get("/live").await?.0, 200);
    gw.stop().await?;
    mesh.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_limits_cors_and_traces_follow_the_http_conventions() -> anyhow::Result<()> {
    let mut mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    // relation-svc again with a follow token bucket of 5 (the tests' default is unlimited).
    let mut tight = mesh.relation_config();
    tight.limits.follow_burst = 5;
    tight.limits.follow_refill_per_day = 1;
    let old = std::mem::replace(&mut mesh.relation, socialgraph_integration_tests::spawn_relation(tight).await?);
    old.stop().await?;
    let gw = spawn_gateway(&mesh, |c| {
        c.http.cors_allowed_origins = vec![ORIGIN.into()];
        c.http.max_body_bytes = 4096;
        c.http.max_header_bytes = 2048;
        c.http.request_timeout_ms = 3000;
    })
    .await?;
    slow_and_lying_clients(&gw).await?;
    let missing = gw.call(Method::GET, "/v1/nowhere", None).await?;
    assert_eq!((missing.status, missing.json["code"].as_i64()), (404, Some(5)));
    let wrong = gw.call(Method::PATCH, "/v1/users/1/following/2", None).await?;
    assert_eq!(wrong.status, 405);
    assert_eq!(wrong.headers["allow"], "POST, DELETE");
    let not_json = gw.call_with(Method::POST, "/v1/counters:batchGet", None, &[]).await?;
    assert_eq!(not_json.status, 400, "an empty body is an empty request, which the service refuses: {}", not_json.json);
    let garbled = gw.call(Method::POST, "/v1/counters:batchGet", Some(json!("nope"))).await?;
    assert_eq!(garbled.status, 400);
    assert!(garbled.json.to_string().contains("fieldViolations"), "{}", garbled.json);
    let unknown = gw.call(Method::GET, "/v1/users/1/following?colour=red", None).await?;
    assert_eq!((unknown.status, unknown.json["details"][0]["fieldViolations"][0]["field"].as_str()), (400, Some("colour")));
    let huge = gw.call(Method::POST, "/v1/counters:batchGet", Some(json!({"userIds": vec!["1"; 2000]}))).await?;
    assert_eq!(huge.status, 413);
    let long = "x".repeat(3000);
    let headers = gw.call_with(Method::GET, "/v1/users/1/following", None, &[("x-long", long.as_str())]).await?;
    assert_eq!(headers.status, 431);

    // The follow token bucket (burst 5): the 6th follow is RESOURCE_EXHAUSTED → 429.
    let mut limited = None;
    for followee in 1000..1010 {
        let a = gw.call(Method::POST, &format!("/v1/users/500/following/{followee}"), None).await?;
        if a.status != 200 {
            limited = Some(a);
            break;
        }
    }
    let limited = limited.ok_or_else(|| anyhow::anyhow!("no follow was rate limited"))?;
    assert_eq!((limited.status, limited.reason().as_str()), (429, "RATE_LIMITED"), "{}", limited.json);
    let retry: u64 = limited.headers["retry-after"].to_str()?.parse()?;
    assert!(retry >= 1, "Retry-After in whole seconds from RetryInfo");
    assert!(limited.json.to_string().contains("google.rpc.RetryInfo"));

    let preflight =
        gw.call_with(Method::OPTIONS, "/v1/users/1/following/2", None, &[("origin", ORIGIN), ("access-control-request-method", "POST")]).await?;
    assert_eq!(preflight.headers["access-control-allow-origin"], ORIGIN);
    let foreign = gw.call_with(Method::GET, "/v1/users/1/following", None, &[("origin", "http://evil.example")]).await?;
    assert!(foreign.headers.get("access-control-allow-origin").is_none(), "an origin not configured gets no CORS grant");

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let traced = gw.call_with(Method::GET, "/v1/users/1/following", None, &[("traceparent", parent.as_str())]).await?;
    let answer = traced.headers["traceresponse"].to_str()?;
    assert!(
        answer.starts_with(&format!("00-{trace_id}-")) && !answer.contains("00f067aa0ba902b7"),
        "the gateway's span joins the caller's trace: {answer}"
    );

    let head = gw.call(Method::HEAD, "/v1/users/1/following", None).await?;
    assert_eq!(head.status, 200, "HEAD is GET without the body");
    let post_doc = gw.call(Method::POST, "/openapi.json", None).await?;
    assert_eq!((post_doc.status, post_doc.json["code"].as_i64()), (405, Some(12)), "every refusal is JSON");
    let plain = gw.call_with(Method::POST, "/v1/counters:batchGet", None, &[("content-type", "text/plain")]).await?;
    assert_eq!(plain.status, 415);

    // A service that is down: its routes answer 503 JSON, the others keep working.
    let broken = spawn_gateway(&mesh, |c| c.upstream.counter_url = "http://127.0.0.1:1".into()).await?;
    let down = broken.call(Method::GET, "/v1/users/1/counters", None).await?;
    assert_eq!((down.status, down.json["code"].as_i64()), (503, Some(14)), "{}", down.json);
    assert_eq!(broken.call(Method::GET, "/v1/users/1/following", None).await?.status, 200);
    broken.stop().await?;

    // A service still working at the deadline (a read waiting up to 2 s for a consistency token
    // of a write far ahead): always 504, whichever side's timer fires first.
    let hurried = spawn_gateway(&mesh, |c| c.http.request_timeout_ms = 700).await?;
    for _ in 0..3 {
        let late = hurried.call(Method::GET, "/v1/users/1/followers?consistency_token=djEuOTk5LjIuMQ", None).await?;
        assert_eq!((late.status, late.json["code"].as_i64()), (504, Some(4)), "{}", late.json);
    }
    hurried.stop().await?;

    let doc = reqwest::get(format!("{}/openapi.json", gw.base)).await?.text().await?;
    assert_eq!(doc, socialgraph_gateway::OPENAPI_JSON);
    let doc: Value = serde_json::from_str(&doc)?;
    assert_eq!(doc["openapi"], "3.0.3");
    gw.stop().await?;
    mesh.stop().await
}
