//! MessageService through the HTTP/JSON gateway, against message-svc on PostgreSQL and
//! counter-svc's unread counters: a group's whole life (create, send, list, read, edit, delete,
//! rename, leave, remove) over HTTP, the unread counts from counter-svc's route, the errors as
//! HTTP statuses, and 501 from a gateway with no message-svc behind it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::Method;
use serde_json::{Value, json};
use socialgraph_integration_tests::gateway::{GatewayConfig, GatewaySvc, spawn_gateway_with};
use socialgraph_integration_tests::messages::{message_on, unread_counter_config};
use socialgraph_integration_tests::spawn_counter;
use socialgraph_testkit::Backend;

async fn ok(gw: &GatewaySvc, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let a = gw.call(method.clone(), path, body).await?;
    anyhow::ensure!(a.status == 200, "{method} {path}: {} {}", a.status, a.json);
    Ok(a.json)
}

fn b64(text: &str) -> String {
    STANDARD.encode(text)
}

/// counter-svc's unread total of `user` over HTTP, once it equals `want`.
async fn unread_becomes(gw: &GatewaySvc, user: i64, want: &str) -> anyhow::Result<()> {
    socialgraph_testkit::eventually(std::time::Duration::from_secs(60), &format!("user {user}'s unread to be {want}"), || async {
        let counts = ok(gw, Method::GET, &format!("/v1/users/{user}/unread_counts"), None).await?;
        Ok((counts["totalUnread"] == want).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_lives_its_whole_life_over_http() -> anyhow::Result<()> {
    let (db, msg, topic, relation) = message_on(Backend::Postgres, true).await?;
    let counter = spawn_counter(unread_counter_config(&msg, &topic).0).await?;
    let mut config = GatewayConfig::default();
    config.upstream.relation_url = format!("http://{}", relation.addr);
    config.upstream.projection_url = "http://127.0.0.1:9".into();
    config.upstream.counter_url = format!("http://{}", counter.addr);
    config.upstream.message_url = format!("http://{}", msg.addr);
    let gw = spawn_gateway_with(config.clone()).await?;
    for u in [1, 2, 3] {
        ok(&gw, Method::GET, &format!("/v1/users/{u}/unread_counts"), None).await?;
    }

    let created = ok(&gw, Method::POST, "/v1/users/2/groups", Some(json!({"memberIds": ["1", "3"], "title": "g"}))).await?;
    let g = created["conversationId"].as_str().unwrap_or_default().to_owned();
    let send = |id: &str, text: &str| json!({"conversationId": g, "clientMessageId": id, "body": b64(text)});
    let m1 = ok(&gw, Method::POST, "/v1/users/2/messages", Some(send("m1", "one"))).await?["message"]["messageId"].clone();
    let m2 = ok(&gw, Method::POST, "/v1/users/2/messages", Some(send("m2", "two"))).await?["message"]["messageId"].clone();
    let list = ok(&gw, Method::GET, "/v1/users/1/conversations", None).await?;
    assert_eq!((list["conversations"][0]["unreadCount"].clone(), list["conversations"][0]["active"].clone()), (json!("2"), json!(true)), "{list}");
    let page = ok(&gw, Method::GET, &format!("/v1/users/1/conversations/{g}/messages"), None).await?;
    assert_eq!(page["messages"].as_array().map(Vec::len), Some(2), "{page}");
    unread_becomes(&gw, 1, "2").await?;

    let m1 = m1.as_str().unwrap_or_default();
    let read = ok(&gw, Method::POST, &format!("/v1/users/1/conversations/{g}:markRead"), Some(json!({"upToMessageId": m1}))).await?;
    assert_eq!(read["unreadCount"], "1", "{read}");
    let m2 = m2.as_str().unwrap_or_default();
    let edited = ok(&gw, Method::PATCH, &format!("/v1/users/2/messages/{m2}"), Some(json!({"body": b64("two, edited")}))).await?;
    assert!(edited["changed"] == true && edited["message"]["editedAt"].is_string(), "{edited}");
    let deleted = ok(&gw, Method::DELETE, &format!("/v1/users/2/messages/{m2}"), None).await?;
    assert_eq!(deleted["changed"], true);
    unread_becomes(&gw, 1, "0").await?;
    unread_becomes(&gw, 3, "1").await?;
    assert_eq!(ok(&gw, Method::PUT, &format!("/v1/users/3/conversations/{g}/title"), Some(json!({"title": "renamed"}))).await?["changed"], true);
    assert_eq!(ok(&gw, Method::POST, &format!("/v1/users/3/conversations/{g}:leave"), None).await?["changed"], true);
    unread_becomes(&gw, 3, "0").await?;
    let added = ok(&gw, Method::POST, &format!("/v1/users/2/conversations/{g}/members"), Some(json!({"userIds": ["4", "1"]}))).await?;
    assert_eq!((added["added"].clone(), added["memberCount"].clone()), (json!(1), json!(3)), "{added}");
    assert_eq!(ok(&gw, Method::DELETE, &format!("/v1/users/2/conversations/{g}/members/1"), None).await?["changed"], true);
    let list = ok(&gw, Method::GET, "/v1/users/1/conversations", None).await?;
    assert_eq!(list["conversations"][0]["title"], "renamed");
    assert_eq!(list["conversations"][0]["active"], false, "printed when false: {list}");

    // Errors, as HTTP statuses with their reasons.
    let outsider = gw.call(Method::GET, &format!("/v1/users/9/conversations/{g}/messages"), None).await?;
    assert_eq!((outsider.status, outsider.reason().as_str()), (403, "NOT_A_MEMBER"), "{}", outsider.json);
    let unknown = gw.call(Method::DELETE, "/v1/users/2/messages/999999999", None).await?;
    assert_eq!((unknown.status, unknown.reason().as_str()), (404, "UNKNOWN_MESSAGE"), "{}", unknown.json);
    let not_sender = gw.call(Method::DELETE, &format!("/v1/users/1/messages/{m1}"), None).await?;
    assert_eq!((not_sender.status, not_sender.reason().as_str()), (403, "NOT_THE_SENDER"), "{}", not_sender.json);
    // Zero values are printed: an empty list and a total of "0".
    assert_eq!(ok(&gw, Method::GET, "/v1/users/9/unread_counts", None).await?, json!({"conversations": [], "totalUnread": "0"}));
    let routed: std::collections::BTreeSet<String> = socialgraph_httpapi::routes(&socialgraph_httpapi::pool()?)?
        .iter()
        .map(socialgraph_httpapi::Route::label)
        .filter(|l| l.starts_with("MessageService.") || l == "CounterService.GetUnreadCounts")
        .collect();
    let called = gw.called.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    assert_eq!(called, routed, "every message route is exercised");
    gw.stop().await?;

    // Without message-svc behind it the gateway says so for every message route.
    config.upstream.message_url = String::new();
    let bare = spawn_gateway_with(config).await?;
    let none = bare.call(Method::POST, "/v1/users/2/messages", Some(send("m3", "three"))).await?;
    assert_eq!(none.status, 501, "{}", none.json);
    bare.stop().await?;
    drop((msg, counter, relation));
    db.drop_db().await
}
