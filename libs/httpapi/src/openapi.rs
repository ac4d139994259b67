//! The OpenAPI 3.0 document of the routes, generated from the descriptors: paths and
//! operations from the `google.api.http` rules, descriptions from the proto comments, and one
//! schema per message in the proto3 JSON mapping the gateway speaks.

use std::collections::{BTreeMap, BTreeSet};

use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

use crate::routes::{BodyMapping, Route, field_at};

/// The comment written above the element at `path` of `file` (leading comment, trimmed).
fn comment(pool: &DescriptorPool, file: &str, path: &[i32]) -> Option<String> {
    let file = pool.get_file_by_name(file)?;
    let info = file.file_descriptor_proto().source_code_info.as_ref()?;
    let loc = info.location.iter().find(|l| l.path == path)?;
    let text = loc.leading_comments.as_deref()?.lines().map(str::trim).collect::<Vec<_>>().join("\n");
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}

fn message_comment(m: &MessageDescriptor) -> Option<String> {
    comment(m.parent_pool(), m.parent_file().name(), m.path())
}

fn field_comment(f: &FieldDescriptor) -> Option<String> {
    comment(f.parent_message().parent_pool(), f.parent_message().parent_file().name(), f.path())
}

fn with_description(mut schema: Value, description: Option<String>) -> Value {
    if let (Some(d), Some(obj)) = (description, schema.as_object_mut()) {
        if obj.contains_key("$ref") {
            // In OpenAPI 3.0 siblings of $ref are ignored: wrap it.
            return json!({ "allOf": [schema], "description": d });
        }
        obj.insert("description".into(), Value::String(d));
    }
    schema
}

/// The JSON schema of one value of `kind` (not repeated), collecting message schemas in `defs`.
fn kind_schema(kind: &Kind, defs: &mut BTreeMap<String, Value>) -> Value {
    match kind {
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => json!({"type": "string", "format": "int64", "pattern": "^-?[0-9]{1,19}$"}),
        Kind::Uint64 | Kind::Fixed64 => json!({"type": "string", "format": "uint64", "pattern": "^[0-9]{1,20}$"}),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => json!({"type": "integer", "format": "int32"}),
        Kind::Uint32 | Kind::Fixed32 => json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": 4_294_967_295_u32}),
        Kind::Double => json!({"type": "number", "format": "double"}),
        Kind::Float => json!({"type": "number", "format": "float"}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::String => json!({"type": "string"}),
        Kind::Bytes => json!({"type": "string", "format": "byte"}),
        Kind::Enum(e) => json!({"type": "string", "enum": e.values().map(|v| v.name().to_owned()).collect::<Vec<_>>()}),
        Kind::Message(m) => match m.full_name() {
            "google.protobuf.Timestamp" => json!({"type": "string", "format": "date-time"}),
            "google.protobuf.Duration" => json!({"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]+)?s$"}),
            name => {
                if !defs.contains_key(name) {
                    defs.insert(name.to_owned(), Value::Null); // placeholder against recursion
                    let schema = message_schema(m, defs, &[]);
                    defs.insert(name.to_owned(), schema);
                }
                json!({"$ref": format!("#/components/schemas/{name}")})
            }
        },
    }
}

/// The JSON schema of one field's value (arrays for repeated fields, objects for maps). A
/// 64-bit integer field whose comment says `> 0` (the proto's convention for ids) is a positive
/// decimal string.
fn field_schema(f: &FieldDescriptor, defs: &mut BTreeMap<String, Value>) -> Value {
    let comment = field_comment(f);
    let mut value = kind_schema(&f.kind(), defs);
    if matches!(f.kind(), Kind::Int64 | Kind::Sint64 | Kind::Sfixed64) && comment.as_deref().is_some_and(|c| c.contains("> 0")) {
        value["pattern"] = json!("^[1-9][0-9]{0,18}$");
    }
    let schema = if f.is_map() {
        let Kind::Message(entry) = f.kind() else { return json!({}) };
        json!({"type": "object", "additionalProperties": kind_schema(&entry.map_entry_value_field().kind(), defs)})
    } else if f.is_list() {
        json!({"type": "array", "items": value})
    } else {
        value
    };
    with_description(schema, comment)
}

/// The OpenAPI name of a path variable: its field name, or for a nested field (`entity.entity_id`)
/// the last name alone when no other variable of the template ends the same way, else the names
/// joined with `_` (OpenAPI tools take dots in path parameter names for syntax).
fn path_name(template: &crate::Template, path: &[String]) -> String {
    let last = path.last().map(String::as_str).unwrap_or_default();
    let clashes = template.fields().filter(|p| p.last().map(String::as_str) == Some(last)).count() > 1;
    if path.len() == 1 || clashes { path.join("_") } else { last.to_owned() }
}

/// The route's path as OpenAPI writes it, with [`path_name`]s for its variables.
fn openapi_path(template: &crate::Template) -> String {
    let mut out = String::new();
    for segment in &template.segments {
        out.push('/');
        match segment {
            crate::Segment::Literal(l) => out.push_str(l),
            crate::Segment::Field(f) => out.push_str(&format!("{{{}}}", path_name(template, f))),
        }
    }
    if let Some(verb) = &template.verb {
        out.push(':');
        out.push_str(verb);
    }
    out
}

/// An object schema of `m`'s fields by JSON name, leaving out the top-level fields in `skip`.
fn message_schema(m: &MessageDescriptor, defs: &mut BTreeMap<String, Value>, skip: &[&str]) -> Value {
    let mut properties = Map::new();
    for f in m.fields().filter(|f| !skip.contains(&f.name())) {
        properties.insert(f.json_name().to_owned(), field_schema(&f, defs));
    }
    with_description(json!({"type": "object", "properties": properties}), message_comment(m))
}

/// Query parameters for every field not bound by the path: scalars, enums and repeated ones by
/// their proto name, singular message fields flattened with dots (`entity.entity_id`).
fn query_parameters(m: &MessageDescriptor, prefix: &str, bound: &[String], defs: &mut BTreeMap<String, Value>, out: &mut Vec<Value>) {
    for f in m.fields() {
        let name = format!("{prefix}{}", f.name());
        if bound.contains(&name) {
            continue;
        }
        match f.kind() {
            Kind::Message(inner) if !f.is_list() && !f.is_map() && !inner.full_name().starts_with("google.protobuf.") => {
                query_parameters(&inner, &format!("{name}."), bound, defs, out);
            }
            Kind::Message(_) if f.is_list() || f.is_map() => {}
            _ => {
                let mut p = json!({"name": name, "in": "query", "required": false, "schema": field_schema(&f, defs)});
                if f.is_list() {
                    p["style"] = json!("form");
                    p["explode"] = json!(true);
                }
                out.push(p);
            }
        }
    }
}

fn operation(route: &Route, defs: &mut BTreeMap<String, Value>) -> Value {
    let input = route.rpc.input();
    let bound: Vec<String> = route.template.fields().map(|p| p.join(".")).collect();
    let mut parameters = Vec::new();
    for path in route.template.fields() {
        let schema = field_at(&input, path).map(|f| field_schema(&f, defs)).unwrap_or_else(|_| json!({}));
        parameters.push(json!({"name": path_name(&route.template, path), "in": "path", "required": true, "schema": schema}));
    }
    let mut op = json!({
        "operationId": route.label().replace('.', "_"),
        "tags": [route.rpc.parent_service().name()],
        "summary": route.label(),
        "responses": {
            "200": {"description": "The RPC's response message.", "content": {"application/json": {"schema": kind_schema(&Kind::Message(route.rpc.output()), defs)}}},
            "default": {
                "description": "An error: google.rpc.Status with its details, under the HTTP status of the gRPC code (Retry-After on 429 and 503 when the service sent RetryInfo).",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/google.rpc.Status"}}}
            }
        }
    });
    if let Some(d) = comment(route.rpc.parent_pool(), route.rpc.parent_file().name(), route.rpc.path()) {
        op["description"] = Value::String(d);
    }
    match route.body {
        BodyMapping::Query => query_parameters(&input, "", &bound, defs, &mut parameters),
        BodyMapping::Body => {
            let top: Vec<&str> = route.template.fields().filter(|p| p.len() == 1).map(|p| p[0].as_str()).collect();
            let schema = message_schema(&input, defs, &top);
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": schema}}});
        }
    }
    op["parameters"] = Value::Array(parameters);
    op
}

fn status_schemas(defs: &mut BTreeMap<String, Value>) {
    defs.insert(
        "google.rpc.Status".into(),
        json!({
            "type": "object",
            "description": "The error model of gRPC and of this gateway: a google.rpc.Code, a message for developers, and details such as google.rpc.BadRequest, ErrorInfo (with a stable `reason`) and RetryInfo.",
            "properties": {
                "code": {"type": "integer", "format": "int32", "description": "The google.rpc.Code (3 INVALID_ARGUMENT, 5 NOT_FOUND, 8 RESOURCE_EXHAUSTED, 9 FAILED_PRECONDITION, 14 UNAVAILABLE, …)."},
                "message": {"type": "string"},
                "details": {"type": "array", "items": {"$ref": "#/components/schemas/google.protobuf.Any"}}
            }
        }),
    );
    defs.insert(
        "google.protobuf.Any".into(),
        json!({
            "type": "object",
            "description": "A detail message, named by `@type` (e.g. type.googleapis.com/google.rpc.ErrorInfo), with its fields beside it.",
            "properties": {"@type": {"type": "string"}},
            "additionalProperties": true
        }),
    );
}

/// Adds the names of the messages reachable from `m` through its fields (itself included).
fn reachable(m: &MessageDescriptor, out: &mut BTreeSet<String>) {
    if out.insert(m.full_name().to_owned()) {
        for f in m.fields() {
            if let Kind::Message(inner) = f.kind() {
                reachable(&inner, out);
            }
        }
    }
}

/// Marks the fields without presence (scalars, enums, repeated fields, maps) `required` in the
/// schema of every message that only responses carry: the gateway prints them at their zero
/// values too, so a client may rely on each being there. Messages that requests carry as well
/// are left as they are (a request may leave any field out).
fn require_always_printed(routes: &[Route], defs: &mut BTreeMap<String, Value>) {
    let mut in_requests = BTreeSet::new();
    for route in routes {
        reachable(&route.rpc.input(), &mut in_requests);
    }
    let Some(pool) = routes.first().map(|r| r.rpc.parent_pool().clone()) else { return };
    // The google.* schemas (Status, Any) are written by hand for the error model, not printed
    // from a message.
    for (name, schema) in defs.iter_mut().filter(|(name, _)| !in_requests.contains(*name) && !name.starts_with("google.")) {
        let Some(m) = pool.get_message_by_name(name) else { continue };
        let required: Vec<String> = m.fields().filter(|f| !f.supports_presence()).map(|f| f.json_name().to_owned()).collect();
        if !required.is_empty() {
            schema["required"] = json!(required);
        }
    }
}

/// The OpenAPI 3.0.3 document of `routes` (paths in route order, schemas by full message name),
/// as pretty JSON ending in a newline. Deterministic: the same proto gives the same bytes.
pub fn document(routes: &[Route]) -> String {
    let mut defs = BTreeMap::new();
    status_schemas(&mut defs);
    let mut paths: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for route in routes {
        let op = operation(route, &mut defs);
        paths.entry(openapi_path(&route.template)).or_default().insert(route.method.to_ascii_lowercase(), op);
    }
    require_always_printed(routes, &mut defs);
    let doc = json!({
        "openapi": "3.0.3",
        "info": {
            "title": "socialgraph HTTP/JSON API",
            "version": "v1",
            "description": "Every public RPC of relation-svc, projection-svc, counter-svc and message-svc as an HTTP route (Subscribe, a server stream, excepted), generated from the google.api.http annotations of the proto. JSON follows the proto3 JSON mapping: int64 as strings, Timestamps as RFC 3339, enums by name. Responses print every field without presence (numbers, strings, booleans, enums, lists, maps) even at its zero value (`\"0\"`, `0`, `false`, `\"\"`, `[]`), so those fields are `required` in response schemas; message-typed fields appear only when set. Requests may leave any field out. Errors are google.rpc.Status with the HTTP status of the standard gRPC mapping."
        },
        "paths": paths,
        "components": {"schemas": defs}
    });
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_describes_every_route_with_typed_parameters() -> Result<(), crate::RouteError> {
        let routes = crate::routes(&crate::pool()?)?;
        let doc: Value = serde_json::from_str(&document(&routes)).map_err(|e| crate::RouteError::Rule { rpc: String::new(), why: e.to_string() })?;
        let ops: usize = doc["paths"].as_object().map(|p| p.values().map(|m| m.as_object().map_or(0, Map::len)).sum()).unwrap_or(0);
        assert_eq!(ops, routes.len());
        let follow = &doc["paths"]["/v1/users/{follower_id}/following/{followee_id}"]["post"];
        assert_eq!(follow["operationId"], "RelationService_Follow");
        assert_eq!(follow["parameters"][0]["schema"]["type"], "string", "int64 is a string in proto3 JSON");
        assert_eq!(follow["parameters"][0]["schema"]["pattern"], "^[1-9][0-9]{0,18}$", "a field documented > 0 is a positive id");
        assert!(follow["description"].as_str().is_some_and(|d| d.contains("Idempotent")), "RPC comments become descriptions");
        let counts = &doc["paths"]["/v1/entities/{entity_type}/{entity_id}/counts"]["get"]["parameters"];
        assert_eq!(counts[0]["name"], "entity_type", "a nested path variable is named by its last field");
        assert_eq!(counts[2]["name"], "metrics");
        let counters = &doc["components"]["schemas"]["socialgraph.counter.v1.UserCounters"]["required"];
        assert_eq!(counters, &json!(["userId", "followings", "followers", "posts", "likesReceived", "favsReceived"]), "responses always print them");
        let relationship = &doc["components"]["schemas"]["socialgraph.relation.v1.Relationship"]["required"];
        assert!(relationship.as_array().is_some_and(|r| r.contains(&json!("blockedBy")) && !r.contains(&json!("followedAt"))), "{relationship}");
        let import = &doc["components"]["schemas"]["socialgraph.relation.v1.FollowRequest"];
        assert!(import.get("required").is_none(), "a request may leave fields out");
        assert!(doc["components"]["schemas"]["google.protobuf.Any"].get("required").is_none(), "error details are not printed messages");
        assert_eq!(counts[2]["schema"]["type"], "array");
        let batch = &doc["paths"]["/v1/users/{user_id}/relationships:batchGet"]["post"];
        let props = &batch["requestBody"]["content"]["application/json"]["schema"]["properties"];
        assert!(props.get("otherUserIds").is_some() && props.get("userId").is_none(), "path fields leave the body");
        let ts = &doc["components"]["schemas"]["socialgraph.relation.v1.FollowResponse"]["properties"]["followedAt"];
        assert!(ts.to_string().contains("date-time"), "{ts}");
        Ok(())
    }
}
