//! An HTTP request as the RPC's request message: path variables, then query parameters (routes
//! without a body) or the JSON body (`body: "*"`), read with the proto3 JSON mapping. Field
//! names may be the proto names (`page_size`) or the JSON names (`pageSize`); unknown fields,
//! repeated singular parameters and values of the wrong type are refused.

use prost_reflect::{DynamicMessage, FieldDescriptor, Kind};
use serde_json::{Map, Value};
use socialgraph_httpapi::{Bindings, BodyMapping, Route, field_at};

/// A request the RPC cannot take: which field and why (a google.rpc.BadRequest violation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    /// The field path (`user_id`, `entity.entity_id`), or empty for the body as a whole.
    pub field: String,
    /// What is wrong.
    pub description: String,
}

fn bad(field: impl Into<String>, description: impl Into<String>) -> BadRequest {
    BadRequest { field: field.into(), description: description.into() }
}

/// The JSON value of one path or query text for a field of `kind`: numbers for 32-bit
/// integers, floats and enum numbers, booleans for bools, strings for the rest (the mapping
/// reads 64-bit integers, bytes, Timestamps and Durations from strings).
fn scalar(field: &FieldDescriptor, name: &str, text: &str) -> Result<Value, BadRequest> {
    let parsed = match field.kind() {
        Kind::Bool => match text {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 | Kind::Uint32 | Kind::Fixed32 => text.parse::<i64>().ok().map(Value::from),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => text.parse::<i64>().ok().map(|_| Value::String(text.to_owned())),
        Kind::Uint64 | Kind::Fixed64 => text.parse::<u64>().ok().map(|_| Value::String(text.to_owned())),
        Kind::Float | Kind::Double => {
            text.parse::<f64>().ok().filter(|f| f.is_finite()).map(Value::from).or_else(|| Some(Value::String(text.to_owned())))
        }
        Kind::Enum(_) => Some(text.parse::<i64>().map(Value::from).unwrap_or_else(|_| Value::String(text.to_owned()))),
        Kind::String | Kind::Bytes => Some(Value::String(text.to_owned())),
        Kind::Message(m) if matches!(m.full_name(), "google.protobuf.Timestamp" | "google.protobuf.Duration") => Some(Value::String(text.to_owned())),
        Kind::Message(_) => return Err(bad(name, "a message field cannot be given as text")),
    };
    parsed.ok_or_else(|| bad(name, format!("{text:?} is not a valid {:?} value", field.kind())))
}

/// The object at `path` below `root`, created as needed (`path` names proto fields).
fn object_at<'a>(root: &'a mut Map<String, Value>, path: &[String], name: &str) -> Result<&'a mut Map<String, Value>, BadRequest> {
    let mut current = root;
    for key in path {
        let slot = current.entry(key.clone()).or_insert_with(|| Value::Object(Map::new()));
        current = slot.as_object_mut().ok_or_else(|| bad(name, format!("{key} is not an object")))?;
    }
    Ok(current)
}

/// Canonical proto names of the fields along `path`, checked against the request message.
fn resolve(route: &Route, path: &[String]) -> Result<(Vec<String>, FieldDescriptor), BadRequest> {
    let name = path.join(".");
    let input = route.rpc.input();
    let field = field_at(&input, path).map_err(|e| bad(&name, e))?;
    let mut names = Vec::with_capacity(path.len());
    let mut message = input;
    for step in path {
        let f = message.get_field_by_name(step).or_else(|| message.get_field_by_json_name(step)).ok_or_else(|| bad(&name, "unknown field"))?;
        names.push(f.name().to_owned());
        if let Kind::Message(m) = f.kind() {
            message = m;
        }
    }
    Ok((names, field))
}

fn parse_body(route: &Route, body: &[u8]) -> Result<Map<String, Value>, BadRequest> {
    if route.body == BodyMapping::Query || body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad("", "the body must be a JSON object")),
        Err(e) => Err(bad("", format!("the body is not JSON: {e}"))),
    }
}

/// One text value placed in the request: the field's dotted proto name, whether it repeats,
/// its JSON value, and the object (created as needed) and key it goes under.
struct Slot<'a> {
    name: String,
    repeated: bool,
    value: Value,
    object: &'a mut Map<String, Value>,
    key: String,
}

fn slot<'a>(root: &'a mut Map<String, Value>, route: &Route, path: &[String], text: &str) -> Result<Slot<'a>, BadRequest> {
    let (names, field) = resolve(route, path)?;
    let name = names.join(".");
    if field.is_map() {
        return Err(bad(&name, "map fields cannot be path or query parameters"));
    }
    let value = scalar(&field, &name, text)?;
    let (key, parents) = names.split_last().ok_or_else(|| bad(&name, "empty field path"))?;
    let object = object_at(root, parents, &name)?;
    // A body's JSON spelling of the field gives way to the path value (the proto spelling is
    // overwritten under `key`).
    if field.json_name() != key.as_str() {
        object.remove(field.json_name());
    }
    Ok(Slot { key: key.clone(), repeated: field.is_list(), value, object, name })
}

/// The request message of `route` from its path `bindings`, the raw `query` string and `body`.
///
/// # Errors
/// A field that does not exist or is bound twice, a value of the wrong type, a body that is not
/// a JSON object, or query parameters on a route that takes a body.
pub fn request_message(route: &Route, bindings: &Bindings, query: Option<&str>, body: &[u8]) -> Result<DynamicMessage, BadRequest> {
    let mut root = parse_body(route, body)?;
    let query = query.unwrap_or("");
    if route.body == BodyMapping::Body && !query.is_empty() {
        return Err(bad("", "this route takes its fields from the JSON body, not from query parameters"));
    }
    let mut bound = Vec::new();
    for (path, text) in bindings {
        let s = slot(&mut root, route, path, text)?;
        s.object.insert(s.key, s.value);
        bound.push(s.name);
    }
    for (key, text) in url::form_urlencoded::parse(query.as_bytes()) {
        let path: Vec<String> = key.split('.').map(str::to_owned).collect();
        let s = slot(&mut root, route, &path, &text)?;
        if bound.contains(&s.name) {
            return Err(bad(&s.name, "already given in the path"));
        }
        match s.object.get_mut(&s.key) {
            Some(Value::Array(items)) if s.repeated => items.push(s.value),
            Some(_) => return Err(bad(&s.name, "given more than once")),
            None if s.repeated => {
                s.object.insert(s.key, Value::Array(vec![s.value]));
            }
            None => {
                s.object.insert(s.key, s.value);
            }
        }
    }
    DynamicMessage::deserialize(route.rpc.input(), Value::Object(root)).map_err(|e| bad("", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_reflect::Value as PValue;

    fn route(label: &str) -> Route {
        let pool = socialgraph_httpapi::pool().expect("descriptors");
        socialgraph_httpapi::routes(&pool).expect("routes").into_iter().find(|r| r.label() == label).expect("route")
    }

    #[test]
    fn path_and_query_fill_nested_and_repeated_fields() {
        let r = route("CounterService.GetEntityCounts");
        let b = r.template.matches("/v1/entities/post/42/counts").expect("matches");
        let m = request_message(&r, &b, Some("metrics=METRIC_LIKE&metrics=2"), b"").expect("valid");
        let entity = m.get_field_by_name("entity").expect("entity");
        let entity = entity.as_message().expect("message");
        assert_eq!(entity.get_field_by_name("entity_id").as_deref(), Some(&PValue::I64(42)));
        assert_eq!(m.get_field_by_name("metrics").expect("metrics").as_list().map(<[_]>::len), Some(2));
    }

    #[test]
    fn the_body_takes_either_spelling_and_the_path_wins() {
        let r = route("RelationService.BatchGetRelationships");
        let b = r.template.matches("/v1/users/7/relationships:batchGet").expect("matches");
        let m = request_message(&r, &b, None, br#"{"userId": "9", "other_user_ids": ["1", 2]}"#).expect("valid");
        assert_eq!(m.get_field_by_name("user_id").as_deref(), Some(&PValue::I64(7)));
        assert_eq!(m.get_field_by_name("other_user_ids").expect("ids").as_list().map(<[_]>::len), Some(2));
    }

    #[test]
    fn bad_input_names_the_field() {
        let r = route("RelationService.ListFollowing");
        let b = r.template.matches("/v1/users/abc/following").expect("matches");
        assert_eq!(request_message(&r, &b, None, b"").map(|_| ()).unwrap_err().field, "user_id");
        let b = r.template.matches("/v1/users/5/following").expect("matches");
        assert_eq!(request_message(&r, &b, Some("nope=1"), b"").map(|_| ()).unwrap_err().field, "nope");
        assert_eq!(request_message(&r, &b, Some("page_size=1&page_size=2"), b"").map(|_| ()).unwrap_err().field, "page_size");
        assert_eq!(request_message(&r, &b, Some("user_id=6"), b"").map(|_| ()).unwrap_err().field, "user_id");
        assert!(request_message(&r, &b, Some("pageSize=99999999999"), b"").is_err(), "int32 range is checked");
        let r = route("RelationService.BatchGetRelationships");
        let b = r.template.matches("/v1/users/7/relationships:batchGet").expect("matches");
        assert!(request_message(&r, &b, None, b"[1]").is_err());
        assert!(request_message(&r, &b, None, b"{\"bogus\": 1}").is_err());
        assert!(request_message(&r, &b, Some("x=1"), b"{}").is_err());
    }
}
