//! Server reflection as a generic client uses it (grpcurl, a reflection-driven BFF): both
//! protocol versions answer, and the google.rpc details of an error status are described, so
//! the client decodes BadRequest and ErrorInfo instead of printing "not recognized".

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use socialgraph_integration_tests::relation_on;
use socialgraph_proto::relation::v1::FollowRequest;
use socialgraph_testkit::Backend;
use tonic::transport::Channel;
use tonic_reflection::pb::{v1, v1alpha};

/// Asks reflection v1 for `request` (a symbol or a file name); the encoded files it answers.
async fn ask_v1(channel: Channel, request: v1::server_reflection_request::MessageRequest) -> anyhow::Result<Vec<Vec<u8>>> {
    use v1::server_reflection_response::MessageResponse;
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let asked = format!("{request:?}");
    let request = v1::ServerReflectionRequest { host: String::new(), message_request: Some(request) };
    let mut answers = client.server_reflection_info(futures::stream::iter([request])).await?.into_inner();
    match answers.message().await?.and_then(|a| a.message_response) {
        Some(MessageResponse::FileDescriptorResponse(f)) => Ok(f.file_descriptor_proto),
        other => anyhow::bail!("reflection v1 has no file for {asked}: {other:?}"),
    }
}

/// The file descriptors (encoded) reflection v1 answers for `symbol`.
async fn files_v1(channel: Channel, symbol: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    ask_v1(channel, v1::server_reflection_request::MessageRequest::FileContainingSymbol(symbol.into())).await
}

/// The file defining `symbol` and every file it imports, fetched by name as a reflection
/// client does, in an order where each file comes after its imports.
async fn files_with_imports(channel: Channel, symbol: &str) -> anyhow::Result<Vec<prost_types::FileDescriptorProto>> {
    let decode = |files: Vec<Vec<u8>>| -> anyhow::Result<Vec<prost_types::FileDescriptorProto>> {
        Ok(files.iter().map(|f| prost_types::FileDescriptorProto::decode(f.as_slice())).collect::<Result<_, _>>()?)
    };
    let mut held = decode(files_v1(channel.clone(), symbol).await?)?;
    let mut i = 0;
    while i < held.len() {
        for import in held[i].dependency.clone() {
            if !held.iter().any(|f| f.name() == import) {
                let by_name = v1::server_reflection_request::MessageRequest::FileByFilename(import.clone());
                held.extend(decode(ask_v1(channel.clone(), by_name).await?)?);
            }
        }
        i += 1;
    }
    held.reverse();
    Ok(held)
}

/// The same through reflection v1alpha.
async fn files_v1alpha(channel: Channel, symbol: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    use v1alpha::server_reflection_request::MessageRequest;
    use v1alpha::server_reflection_response::MessageResponse;
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request =
        v1alpha::ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::FileContainingSymbol(symbol.into())) };
    let mut answers = client.server_reflection_info(futures::stream::iter([request])).await?.into_inner();
    match answers.message().await?.and_then(|a| a.message_response) {
        Some(MessageResponse::FileDescriptorResponse(f)) => Ok(f.file_descriptor_proto),
        other => anyhow::bail!("reflection v1alpha has no file for {symbol}: {other:?}"),
    }
}

#[tokio::test]
async fn reflection_describes_the_services_and_the_error_details_they_send() -> anyhow::Result<()> {
    let (db, svc, _topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let channel = svc.channel().await?;
    for symbol in ["socialgraph.relation.v1.RelationService", "google.rpc.ErrorInfo", "google.rpc.BadRequest", "google.rpc.RetryInfo"] {
        let v1 = files_v1(channel.clone(), symbol).await?;
        let v1alpha = files_v1alpha(channel.clone(), symbol).await?;
        assert!(!v1.is_empty() && v1 == v1alpha, "both protocol versions describe {symbol} alike");
    }
    // A refused call: every detail in its status must decode with what reflection gave.
    let mut client = svc.client().await?;
    let status = client.follow(FollowRequest { follower_id: 7, followee_id: 7 }).await.expect_err("a self-follow is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let details = tonic_types::pb::Status::decode(status.details())?;
    assert!(!details.details.is_empty(), "the status carries details");
    let mut reasons = Vec::new();
    for any in &details.details {
        let name = any.type_url.rsplit('/').next().unwrap_or_default();
        let mut pool = DescriptorPool::new();
        pool.add_file_descriptor_protos(files_with_imports(channel.clone(), name).await?)?;
        let descriptor = pool.get_message_by_name(name).ok_or_else(|| anyhow::anyhow!("reflection gave no {name}"))?;
        let message = DynamicMessage::decode(descriptor, any.value.as_slice())?;
        if name == "google.rpc.ErrorInfo" {
            reasons.push(message.get_field_by_name("reason").map(|v| v.into_owned()));
            let domain = message.get_field_by_name("domain").map(|v| v.into_owned());
            assert_eq!(domain, Some(Value::String("socialgraph".into())));
        }
    }
    assert_eq!(reasons, vec![Some(Value::String("SELF_FOLLOW".into()))], "one ErrorInfo, decoded through reflection");
    svc.stop().await?;
    db.drop_db().await
}
