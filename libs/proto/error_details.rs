//! The descriptor of the google.rpc error details socialgraph statuses carry (BadRequest,
//! ErrorInfo, RetryInfo), built at compile time so server reflection can describe them and a
//! generic client (grpcurl, a reflection-based BFF) decodes `grpc-status-details-bin` instead of
//! printing "not recognized". Only these three messages are declared, with the names, field
//! numbers and types of the public google.rpc API (`google/rpc/error_details.proto` of
//! googleapis), which is the wire contract tonic-types encodes.
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto, MessageOptions};

fn field(name: &str, number: i32, ty: Type, label: Label, type_name: Option<&str>) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        label: Some(label as i32),
        r#type: Some(ty as i32),
        type_name: type_name.map(Into::into),
        json_name: Some(json_name(name)),
        ..Default::default()
    }
}

fn string(name: &str, number: i32) -> FieldDescriptorProto {
    field(name, number, Type::String, Label::Optional, None)
}

/// protoc's JSON name: lowerCamelCase of the field name.
fn json_name(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn message(name: &str, field: Vec<FieldDescriptorProto>, nested_type: Vec<DescriptorProto>) -> DescriptorProto {
    DescriptorProto { name: Some(name.into()), field, nested_type, ..Default::default() }
}

/// `google/rpc/error_details.proto` with BadRequest, ErrorInfo and RetryInfo (proto3).
pub fn file() -> FileDescriptorProto {
    let metadata_entry = DescriptorProto {
        options: Some(MessageOptions { map_entry: Some(true), ..Default::default() }),
        ..message("MetadataEntry", vec![string("key", 1), string("value", 2)], vec![])
    };
    let error_info = message(
        "ErrorInfo",
        vec![
            string("reason", 1),
            string("domain", 2),
            field("metadata", 3, Type::Message, Label::Repeated, Some(".google.rpc.ErrorInfo.MetadataEntry")),
        ],
        vec![metadata_entry],
    );
    let retry_info = message("RetryInfo", vec![field("retry_delay", 1, Type::Message, Label::Optional, Some(".google.protobuf.Duration"))], vec![]);
    let bad_request = message(
        "BadRequest",
        vec![field("field_violations", 1, Type::Message, Label::Repeated, Some(".google.rpc.BadRequest.FieldViolation"))],
        vec![message("FieldViolation", vec![string("field", 1), string("description", 2)], vec![])],
    );
    FileDescriptorProto {
        name: Some("google/rpc/error_details.proto".into()),
        package: Some("google.rpc".into()),
        dependency: vec!["google/protobuf/duration.proto".into()],
        message_type: vec![error_info, retry_info, bad_request],
        syntax: Some("proto3".into()),
        ..Default::default()
    }
}

/// `google/rpc/status.proto`: the Status a gRPC error carries in `grpc-status-details-bin`
/// (code, message, and the details as `google.protobuf.Any`), with the public field numbers.
pub fn status_file() -> FileDescriptorProto {
    let status = message(
        "Status",
        vec![
            field("code", 1, Type::Int32, Label::Optional, None),
            string("message", 2),
            field("details", 3, Type::Message, Label::Repeated, Some(".google.protobuf.Any")),
        ],
        vec![],
    );
    FileDescriptorProto {
        name: Some("google/rpc/status.proto".into()),
        package: Some("google.rpc".into()),
        dependency: vec!["google/protobuf/any.proto".into()],
        message_type: vec![status],
        syntax: Some("proto3".into()),
        ..Default::default()
    }
}
