//! The route table: one [`Route`] per `google.api.http` annotation of a unary RPC.

use prost_reflect::{DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, MethodDescriptor, Value};

use crate::RouteError;
use crate::template::Template;

/// Where the request fields not bound by the path come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMapping {
    /// Query parameters (`body` empty in the rule).
    Query,
    /// The JSON body (`body: "*"`); query parameters are then refused.
    Body,
}

/// One HTTP route of an RPC.
#[derive(Debug, Clone)]
pub struct Route {
    /// Upper-case HTTP method (`GET`, `POST`, `PUT`, `DELETE`, `PATCH`).
    pub method: String,
    /// The path template.
    pub template: Template,
    /// Where the unbound fields come from.
    pub body: BodyMapping,
    /// The RPC.
    pub rpc: MethodDescriptor,
}

impl Route {
    /// `Service.Method` with the service's short name (`RelationService.Follow`): the label of
    /// metrics and spans, and the OpenAPI operation id with `_` for `.`.
    pub fn label(&self) -> String {
        format!("{}.{}", self.rpc.parent_service().name(), self.rpc.name())
    }

    /// The gRPC path of the RPC (`/socialgraph.relation.v1.RelationService/Follow`).
    pub fn grpc_path(&self) -> String {
        format!("/{}/{}", self.rpc.parent_service().full_name(), self.rpc.name())
    }
}

/// The field at `path` (names or JSON names) starting from `message`.
///
/// # Errors
/// A name that is not a field, or a step through a repeated or non-message field.
pub fn field_at(message: &MessageDescriptor, path: &[String]) -> Result<FieldDescriptor, String> {
    let mut current = message.clone();
    let mut found = None;
    for (i, name) in path.iter().enumerate() {
        let field = current
            .get_field_by_name(name)
            .or_else(|| current.get_field_by_json_name(name))
            .ok_or_else(|| format!("{} has no field {name}", current.full_name()))?;
        if i + 1 < path.len() {
            match field.kind() {
                Kind::Message(m) if !field.is_list() && !field.is_map() => current = m,
                _ => return Err(format!("{name} is not a singular message field")),
            }
        }
        found = Some(field);
    }
    found.ok_or_else(|| "empty field path".to_owned())
}

fn rule_text(rule: &DynamicMessage, name: &str) -> Option<String> {
    match rule.get_field_by_name(name).as_deref() {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

fn route_of(rpc: &MethodDescriptor, rule: &DynamicMessage) -> Result<Route, RouteError> {
    let bad = |why: String| RouteError::Rule { rpc: rpc.full_name().to_owned(), why };
    if rpc.is_client_streaming() || rpc.is_server_streaming() {
        return Err(bad("streaming RPCs have no HTTP route".into()));
    }
    if rule.get_field_by_name("additional_bindings").is_some_and(|v| v.as_list().is_some_and(|l| !l.is_empty())) {
        return Err(bad("additional_bindings are not supported".into()));
    }
    if rule_text(rule, "response_body").is_some() {
        return Err(bad("response_body is not supported".into()));
    }
    let (method, text) = ["get", "put", "post", "delete", "patch"]
        .iter()
        .find_map(|m| rule_text(rule, m).map(|t| (m.to_ascii_uppercase(), t)))
        .ok_or_else(|| bad("no get, put, post, delete or patch pattern".into()))?;
    let body = match rule_text(rule, "body").as_deref() {
        None => BodyMapping::Query,
        Some("*") => BodyMapping::Body,
        Some(other) => return Err(bad(format!("body must be \"*\" or empty, got {other:?}"))),
    };
    let template = Template::parse(&text)?;
    for path in template.fields() {
        let field = field_at(&rpc.input(), path).map_err(|e| bad(format!("{text}: {e}")))?;
        if field.is_list() || field.is_map() || matches!(field.kind(), Kind::Message(_)) {
            return Err(bad(format!("{text}: path variable {} must be a scalar field", path.join("."))));
        }
    }
    Ok(Route { method, template, body, rpc: rpc.clone() })
}

/// Every route declared in `pool`, in service and method order.
///
/// # Errors
/// The pool lacks `google.api.http`, a rule is malformed or unsupported, or two routes of the
/// same method have templates that match the same paths.
pub fn routes(pool: &DescriptorPool) -> Result<Vec<Route>, RouteError> {
    let ext = pool.get_extension_by_name("google.api.http").ok_or(RouteError::NoAnnotation)?;
    let mut out: Vec<Route> = Vec::new();
    for service in pool.services() {
        for rpc in service.methods() {
            let options = rpc.options();
            if !options.has_extension(&ext) {
                continue;
            }
            let Value::Message(rule) = options.get_extension(&ext).into_owned() else { continue };
            let route = route_of(&rpc, &rule)?;
            if let Some(other) = out.iter().find(|o| o.method == route.method && same_shape(&o.template, &route.template)) {
                return Err(RouteError::Conflict { a: other.label(), b: route.label(), template: route.template.text.clone() });
            }
            out.push(route);
        }
    }
    Ok(out)
}

/// True when the two templates match exactly the same paths (same literals, verbs and
/// variable positions), which would make one of two routes unreachable.
fn same_shape(a: &Template, b: &Template) -> bool {
    use crate::template::Segment::{Field, Literal};
    a.verb == b.verb
        && a.segments.len() == b.segments.len()
        && a.segments.iter().zip(&b.segments).all(|pair| match pair {
            (Literal(x), Literal(y)) => x == y,
            (Field(_), Field(_)) => true,
            _ => false,
        })
}

/// The unary and streaming RPCs of `pool` that have no route (the admin RPCs), as
/// `Service.Method`.
///
/// # Errors
/// As [`routes`].
pub fn unrouted(pool: &DescriptorPool) -> Result<Vec<String>, RouteError> {
    let routed: Vec<String> = routes(pool)?.iter().map(Route::label).collect();
    Ok(pool
        .services()
        .flat_map(|s| {
            let service = s.name().to_owned();
            s.methods().map(move |m| format!("{service}.{}", m.name())).collect::<Vec<_>>()
        })
        .filter(|l| !routed.contains(l) && !l.starts_with("Health.") && !l.starts_with("ServerReflection."))
        .collect())
}
