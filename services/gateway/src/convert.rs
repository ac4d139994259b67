//! An HTTP request as the RPC's request message: path variables, then query parameters (routes
//! without a body) or the JSON body (`body: "*"`), read with the proto3 JSON mapping. Field
//! names may be the proto names (`page_size`) or the JSON names (`pageSize`); unknown fields,
//! repeated singular parameters and values of the wrong type are refused.

use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor};
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
        // Integers in canonical decimal only: no `+`, no leading zeros (what the OpenAPI
        // pattern documents), and within the field's range.
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => text.parse::<i32>().ok().filter(|n| n.to_string() == text).map(Value::from),
        Kind::Uint32 | Kind::Fixed32 => text.parse::<u32>().ok().filter(|n| n.to_string() == text).map(Value::from),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            text.parse::<i64>().ok().filter(|n| n.to_string() == text).map(|_| Value::String(text.to_owned()))
        }
        Kind::Uint64 | Kind::Fixed64 => text.parse::<u64>().ok().filter(|n| n.to_string() == text).map(|_| Value::String(text.to_owned())),
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

/// Deserializes any JSON and fails on an object that names a key twice, at any depth (a
/// `serde_json::Value` would keep the last one silently).
struct NoDuplicateKeys;

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeys)
    }
}

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeys {
    type Value = NoDuplicateKeys;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(self)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("the key {key:?} is given twice")));
            }
            map.next_value::<NoDuplicateKeys>()?;
        }
        Ok(self)
    }
}

/// Every key of `object` names a field of `message`, each field once whatever its spelling, at
/// every depth: so an unknown or doubled field is refused by name.
fn check_fields(message: &MessageDescriptor, object: &Map<String, Value>, prefix: &str) -> Result<(), BadRequest> {
    let mut seen = std::collections::HashSet::new();
    for (key, value) in object {
        let field = message
            .get_field_by_name(key)
            .or_else(|| message.get_field_by_json_name(key))
            .ok_or_else(|| bad(format!("{prefix}{key}"), "unknown field"))?;
        let name = format!("{prefix}{}", field.name());
        if !seen.insert(field.number()) {
            return Err(bad(name, "given twice (as its proto name and its JSON name)"));
        }
        let Kind::Message(inner) = field.kind() else { continue };
        if field.is_map() || inner.full_name().starts_with("google.protobuf.") {
            continue;
        }
        match value {
            Value::Object(o) => check_fields(&inner, o, &format!("{name}."))?,
            Value::Array(items) if field.is_list() => {
                for (i, item) in items.iter().enumerate() {
                    if let Value::Object(o) = item {
                        check_fields(&inner, o, &format!("{name}[{i}]."))?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn parse_body(route: &Route, body: &[u8]) -> Result<Map<String, Value>, BadRequest> {
    let empty = body.iter().all(u8::is_ascii_whitespace);
    if route.body == BodyMapping::Query {
        return if empty { Ok(Map::new()) } else { Err(bad("", "this route takes no body: its fields come from the path and the query")) };
    }
    if empty {
        return Err(bad("", "this route takes a JSON object as its body"));
    }
    serde_json::from_slice::<NoDuplicateKeys>(body).map_err(|e| bad("", format!("the body is not JSON: {e}")))?;
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => {
            check_fields(&route.rpc.input(), &map, "")?;
            Ok(map)
        }
        Ok(_) => Err(bad("", "the body must be a JSON object")),
        Err(e) => Err(bad("", format!("the body is not JSON: {e}"))),
    }
}

/// A body value that repeats a path variable must say the same (`5` or `"5"` for `/…/5`).
fn agrees_with_path(object: &Map<String, Value>, field: &FieldDescriptor, text: &str) -> bool {
    [field.name(), field.json_name()].iter().filter_map(|k| object.get(*k)).all(|v| match v {
        Value::String(s) => s == text,
        Value::Number(n) => n.to_string() == text,
        Value::Bool(b) => b.to_string() == text,
        _ => false,
    })
}

/// One text value placed in the request: the field's dotted proto name, whether it repeats,
/// its JSON value, and the object (created as needed) and key it goes under.
struct Slot<'a> {
    name: String,
    field: FieldDescriptor,
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
    Ok(Slot { key: key.clone(), field, value, object, name })
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
        let field = &s.field;
        if !agrees_with_path(s.object, field, text) {
            return Err(bad(&s.name, "the body gives another value than the path"));
        }
        // The path's value stands under the proto name; a body's JSON spelling goes.
        if field.json_name() != s.key {
            s.object.remove(field.json_name());
        }
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
            Some(Value::Array(items)) if s.field.is_list() => items.push(s.value),
            Some(_) => return Err(bad(&s.name, "given more than once")),
            None if s.field.is_list() => {
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
    fn the_body_takes_either_spelling_and_may_repeat_the_path() {
        let r = route("RelationService.BatchGetRelationships");
        let b = r.template.matches("/v1/users/7/relationships:batchGet").expect("matches");
        let m = request_message(&r, &b, None, br#"{"userId": 7, "other_user_ids": ["1", 2]}"#).expect("valid");
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
        let err = request_message(&r, &b, Some("pageSize=99999999999"), b"").map(|_| ()).unwrap_err();
        assert_eq!(err.field, "page_size", "int32 range is checked, naming the field: {err:?}");
        let r = route("RelationService.BatchGetRelationships");
        let b = r.template.matches("/v1/users/7/relationships:batchGet").expect("matches");
        assert!(request_message(&r, &b, None, b"[1]").is_err());
        assert!(request_message(&r, &b, None, b"{\"bogus\": 1}").is_err());
        assert!(request_message(&r, &b, Some("x=1"), b"{}").is_err());
        let field = |body: &[u8]| request_message(&r, &b, None, body).map(|_| ()).unwrap_err().field;
        assert_eq!(field(br#"{"userId": "9"}"#), "user_id", "a body that contradicts the path");
        assert_eq!(field(br#"{"bogus": 1}"#), "bogus", "unknown fields are named");
        assert_eq!(field(br#"{"otherUserIds": ["1"], "other_user_ids": ["2"]}"#), "other_user_ids", "one field in two spellings");
        assert!(request_message(&r, &b, None, br#"{"otherUserIds": ["1"], "otherUserIds": ["2"]}"#).is_err(), "a key given twice");
        assert!(request_message(&r, &b, None, b"").is_err(), "a body route needs a body");
        let r = route("RelationService.ListFollowing");
        for id in ["+5", "05", "-0"] {
            let b = r.template.matches(&format!("/v1/users/{id}/following")).expect("matches");
            assert!(request_message(&r, &b, None, b"").is_err(), "{id} is not a canonical integer");
        }
    }
}
