//! gRPC-Web on the services: a browser-style HTTP/1.1 request framed as
//! `application/grpc-web+proto` reaches the same RPC as gRPC, and the status travels in a
//! trailer frame in the body, as browsers cannot read HTTP trailers.

use prost::Message;
use socialgraph_integration_tests::relation_on;
use socialgraph_proto::relation::v1::{FollowRequest, FollowResponse};
use socialgraph_testkit::Backend;

/// One gRPC-Web call over HTTP/1.1: the data frames' payload and the status lines, from the
/// trailer frame or, for a trailers-only answer (an error before any message), from the headers.
async fn grpc_web(addr: std::net::SocketAddr, path: &str, message: &impl Message) -> anyhow::Result<(Vec<u8>, String)> {
    let payload = message.encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(payload.len())?.to_be_bytes());
    body.extend_from_slice(&payload);
    let resp = reqwest::Client::builder()
        .http1_only()
        .build()?
        .post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(body)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/grpc-web+proto");
    let mut trailers: String = resp
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("grpc-"))
        .map(|(k, v)| format!("{}:{}\r\n", k, v.to_str().unwrap_or_default()))
        .collect();
    let bytes = resp.bytes().await?;
    let (mut data, mut at) = (Vec::new(), 0);
    while at + 5 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at + 1..at + 5].try_into()?) as usize;
        let frame = &bytes[at + 5..at + 5 + len];
        if bytes[at] & 0x80 == 0 {
            data.extend_from_slice(frame);
        } else {
            trailers.push_str(std::str::from_utf8(frame)?);
        }
        at += 5 + len;
    }
    assert_eq!(at, bytes.len(), "the body is whole frames");
    Ok((data, trailers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_web_call_over_http1_follows_and_reports_errors_in_trailers() -> anyhow::Result<()> {
    let (db, svc, _topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let path = "/socialgraph.relation.v1.RelationService/Follow";
    let (data, trailers) = grpc_web(svc.addr, path, &FollowRequest { follower_id: 1, followee_id: 2 }).await?;
    assert!(FollowResponse::decode(data.as_slice())?.changed, "the follow was made");
    assert!(trailers.contains("grpc-status:0"), "{trailers}");
    let (data, trailers) = grpc_web(svc.addr, path, &FollowRequest { follower_id: 3, followee_id: 3 }).await?;
    assert!(data.is_empty());
    assert!(trailers.contains("grpc-status:3"), "a self-follow is INVALID_ARGUMENT: {trailers}");
    assert!(trailers.contains("grpc-status-details-bin"), "with its google.rpc details: {trailers}");
    let mut c = svc.client().await?;
    let page =
        c.list_following(socialgraph_proto::relation::v1::ListFollowingRequest { user_id: 1, page_size: 10, page_token: String::new() }).await?;
    assert_eq!(page.into_inner().following.len(), 1, "gRPC sees what gRPC-Web wrote");
    svc.stop().await?;
    db.drop_db().await
}
