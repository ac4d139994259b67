//! One HTTP request end to end: limits, route match, request message, the gRPC call with the
//! caller's credentials, trace context and deadline, and the response or error as JSON.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};
use socialgraph_httpapi::Route;
use tonic::Code;
use tracing::Instrument;

use crate::errors::{from_status, gateway_error};
use crate::upstream::Upstreams;

/// Request-level metrics: `sg_gateway_requests_total{route,code}` (route = `Service.Method`
/// or `unmatched`, code = HTTP status) and `sg_gateway_request_duration_seconds{route}`.
#[derive(Clone)]
pub struct Metrics {
    /// Requests by route and HTTP status.
    pub requests: prometheus::IntCounterVec,
    /// Time from the request's arrival to its response, by route.
    pub duration: prometheus::HistogramVec,
}

impl Metrics {
    /// Registers both metrics in `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &prometheus::Registry) -> prometheus::Result<Self> {
        let requests = prometheus::IntCounterVec::new(
            prometheus::Opts::new("sg_gateway_requests_total", "HTTP requests by route (Service.Method, or unmatched) and HTTP status"),
            &["route", "code"],
        )?;
        let buckets = vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
        let duration = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("sg_gateway_request_duration_seconds", "Time to answer an HTTP request, by route").buckets(buckets),
            &["route"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(Self { requests, duration })
    }
}

/// What every request shares.
pub struct Gateway {
    /// Routes, most literal template first (so `/following:count` is tried before a variable).
    pub routes: Vec<Route>,
    /// Channels to the services.
    pub upstreams: Upstreams,
    /// google.rpc.Status, for error bodies.
    pub status_desc: MessageDescriptor,
    /// Deadline of one request.
    pub timeout: Duration,
    /// Largest body read.
    pub max_body_bytes: usize,
    /// Largest sum of header name and value lengths.
    pub max_header_bytes: usize,
    /// Requests in flight (try-acquired; none free → 503).
    pub slots: Arc<tokio::sync::Semaphore>,
    /// Request metrics.
    pub metrics: Metrics,
}

impl Gateway {
    /// The gateway's shared state over `pool`'s routes.
    ///
    /// # Errors
    /// The descriptors hold no google.rpc.Status, or the route table is invalid.
    pub fn new(pool: &DescriptorPool, upstreams: Upstreams, settings: &crate::config::HttpSettings, metrics: Metrics) -> anyhow::Result<Self> {
        let mut routes = socialgraph_httpapi::routes(pool)?;
        routes.sort_by_key(|r| std::cmp::Reverse(r.template.literal_count()));
        for r in &routes {
            anyhow::ensure!(Upstreams::knows(r.rpc.parent_service().full_name()), "no upstream serves {}", r.label());
        }
        let status_desc = pool.get_message_by_name("google.rpc.Status").ok_or_else(|| anyhow::anyhow!("descriptors lack google.rpc.Status"))?;
        Ok(Self {
            routes,
            upstreams,
            status_desc,
            timeout: Duration::from_millis(settings.request_timeout_ms),
            max_body_bytes: settings.max_body_bytes,
            max_header_bytes: settings.max_header_bytes,
            slots: Arc::new(tokio::sync::Semaphore::new(settings.concurrency_limit)),
            metrics,
        })
    }
}

fn header_bytes(headers: &HeaderMap) -> usize {
    headers.iter().map(|(k, v)| k.as_str().len() + v.len()).sum()
}

/// The axum fallback: every request.
pub async fn handle(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let started = Instant::now();
    let (label, response) = dispatch(&gw, req, started).await;
    gw.metrics.requests.with_label_values(&[label.as_str(), response.status().as_str()]).inc();
    gw.metrics.duration.with_label_values(&[label.as_str()]).observe(started.elapsed().as_secs_f64());
    response
}

fn openapi(method: &Method) -> Response {
    if method == Method::GET || method == Method::HEAD {
        let body = if method == Method::HEAD { Body::empty() } else { Body::from(crate::OPENAPI_JSON) };
        return (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response();
    }
    let mut response = gateway_error(StatusCode::METHOD_NOT_ALLOWED, Code::Unimplemented, &format!("{method} is not served for /openapi.json"), &[]);
    response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    response
}

/// The route and path bindings for `req`, or the 404/405 answer.
fn find<'a>(gw: &'a Gateway, req: &Request) -> Result<(&'a Route, socialgraph_httpapi::Bindings), Box<Response>> {
    let path = req.uri().path();
    let mut matching: Vec<(&Route, socialgraph_httpapi::Bindings)> =
        gw.routes.iter().filter_map(|r| r.template.matches(path).map(|b| (r, b))).collect();
    if matching.is_empty() {
        return Err(Box::new(gateway_error(StatusCode::NOT_FOUND, Code::NotFound, &format!("no route for {path}"), &[])));
    }
    // HEAD is GET without the body.
    let wanted = if req.method() == Method::HEAD { "GET" } else { req.method().as_str() };
    if let Some(i) = matching.iter().position(|(r, _)| r.method == wanted) {
        return Ok(matching.swap_remove(i));
    }
    let mut allow: Vec<&str> = matching.iter().map(|(r, _)| r.method.as_str()).collect();
    if allow.contains(&"GET") {
        allow.push("HEAD");
    }
    let mut response = gateway_error(StatusCode::METHOD_NOT_ALLOWED, Code::Unimplemented, &format!("{} is not served for {path}", req.method()), &[]);
    if let Ok(v) = HeaderValue::from_str(&allow.join(", ")) {
        response.headers_mut().insert(header::ALLOW, v);
    }
    Err(Box::new(response))
}

/// Refusals that need only the request head: header size, repeated credentials, a declared
/// body over the limit, a body that is not (plain) JSON.
fn check_head(gw: &Gateway, route: &Route, req: &Request) -> Result<(), Box<Response>> {
    let headers = req.headers();
    if header_bytes(headers) > gw.max_header_bytes {
        let msg = format!("request headers are larger than {} bytes", gw.max_header_bytes);
        return Err(Box::new(gateway_error(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, Code::InvalidArgument, &msg, &[])));
    }
    if headers.get_all(header::AUTHORIZATION).iter().count() > 1 {
        return Err(Box::new(gateway_error(StatusCode::BAD_REQUEST, Code::InvalidArgument, "more than one Authorization header", &[])));
    }
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > gw.max_body_bytes as u64) {
        let msg = format!("the request body is larger than {} bytes", gw.max_body_bytes);
        return Err(Box::new(gateway_error(StatusCode::PAYLOAD_TOO_LARGE, Code::InvalidArgument, &msg, &[])));
    }
    if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v != "identity") {
        return Err(Box::new(gateway_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::InvalidArgument,
            "compressed request bodies are not accepted",
            &[],
        )));
    }
    let json = |v: &HeaderValue| v.to_str().ok().and_then(|t| t.split(';').next()).is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if route.body == socialgraph_httpapi::BodyMapping::Body && headers.get(header::CONTENT_TYPE).is_some_and(|v| !json(v)) {
        return Err(Box::new(gateway_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::InvalidArgument,
            "the body must be Content-Type: application/json",
            &[],
        )));
    }
    Ok(())
}

async fn dispatch(gw: &Gateway, req: Request, started: Instant) -> (String, Response) {
    if req.uri().path() == "/openapi.json" {
        return ("openapi".into(), openapi(req.method()));
    }
    let (route, bindings) = match find(gw, &req) {
        Ok(found) => found,
        Err(response) => return ("unmatched".into(), *response),
    };
    let label = route.label();
    if let Err(response) = check_head(gw, route, &req) {
        return (label, *response);
    }
    let Ok(_permit) = gw.slots.try_acquire() else {
        return (label, gateway_error(StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable, "the gateway is at its concurrency limit", &[]));
    };
    let span = tracing::info_span!(
        "http",
        otel.name = format!("{} {}", route.method, route.template.text),
        otel.kind = "server",
        http.request.method = route.method.as_str(),
        http.route = route.template.text.as_str(),
        rpc.service = route.rpc.parent_service().full_name(),
        rpc.method = route.rpc.name(),
    );
    socialgraph_telemetry::set_parent_from_metadata(&span, &tonic::metadata::MetadataMap::from_headers(req.headers().clone()));
    let response = call(gw, route, &bindings, req, &span, started).instrument(span.clone()).await;
    (label, response)
}

/// The W3C headers of `span`, to send upstream and to echo as `traceresponse`.
pub fn trace_headers(span: &tracing::Span) -> std::collections::BTreeMap<String, String> {
    let mut headers = std::collections::BTreeMap::new();
    socialgraph_telemetry::inject_headers(span, &mut headers);
    headers
}

/// The gRPC request for `message`: the caller's `authorization`, the gateway span's trace
/// context (`trace`, from [`trace_headers`]) and the request deadline.
pub fn grpc_request(
    message: &DynamicMessage,
    headers: &HeaderMap,
    trace: &std::collections::BTreeMap<String, String>,
    timeout: Duration,
) -> tonic::Request<Bytes> {
    let mut request = tonic::Request::new(Bytes::from(message.encode_to_vec()));
    request.set_timeout(timeout);
    let metadata = request.metadata_mut();
    if let Some(auth) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()) {
        metadata.insert("authorization", auth);
    }
    for (k, v) in trace {
        if let (Ok(k), Ok(v)) = (k.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(), v.parse()) {
            metadata.insert(k, v);
        }
    }
    request
}

/// The request body, read within the request's time budget: 413 past the size limit, 400 for
/// a malformed (e.g. chunked) body, 408 for a client that sends it too slowly.
async fn read_body(gw: &Gateway, body: Body, deadline: tokio::time::Instant) -> Result<Bytes, Box<Response>> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, gw.max_body_bytes);
    match tokio::time::timeout_at(deadline, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            let msg = format!("the request body is larger than {} bytes", gw.max_body_bytes);
            Err(Box::new(gateway_error(StatusCode::PAYLOAD_TOO_LARGE, Code::InvalidArgument, &msg, &[])))
        }
        Ok(Err(e)) => {
            Err(Box::new(gateway_error(StatusCode::BAD_REQUEST, Code::InvalidArgument, &format!("the request body could not be read: {e}"), &[])))
        }
        Err(_) => Err(Box::new(gateway_error(
            StatusCode::REQUEST_TIMEOUT,
            Code::DeadlineExceeded,
            "the request body did not arrive within the request timeout",
            &[],
        ))),
    }
}

fn timed_out() -> Response {
    gateway_error(StatusCode::GATEWAY_TIMEOUT, Code::DeadlineExceeded, "the service did not answer within the request timeout", &[])
}

async fn call(
    gw: &Gateway,
    route: &Route,
    bindings: &socialgraph_httpapi::Bindings,
    req: Request,
    span: &tracing::Span,
    started: Instant,
) -> Response {
    let deadline = tokio::time::Instant::from_std(started + gw.timeout);
    let (parts, body) = req.into_parts();
    let body = match read_body(gw, body, deadline).await {
        Ok(b) => b,
        Err(response) => return *response,
    };
    let message = match crate::convert::request_message(route, bindings, parts.uri.query(), &body) {
        Ok(m) => m,
        Err(e) => {
            let violation = [(e.field.clone(), e.description.clone())];
            return gateway_error(StatusCode::BAD_REQUEST, Code::InvalidArgument, &format!("bad request: {}", e.description), &violation);
        }
    };
    let Some(pool) = gw.upstreams.for_service(route.rpc.parent_service().full_name()) else {
        return gateway_error(StatusCode::NOT_IMPLEMENTED, Code::Unimplemented, "no service behind this route", &[]);
    };
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    if remaining.is_zero() {
        return timed_out();
    }
    let trace = trace_headers(span);
    let answer = tokio::time::timeout(remaining, pool.unary(&route.grpc_path(), grpc_request(&message, &parts.headers, &trace, remaining))).await;
    let mut response = match answer {
        Err(_) => timed_out(),
        Ok(Ok(bytes)) => match DynamicMessage::decode(route.rpc.output(), bytes) {
            Ok(out) => match response_json(&out) {
                Ok(json) => {
                    (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], Body::from(json)).into_response()
                }
                Err(e) => gateway_error(StatusCode::BAD_GATEWAY, Code::Internal, &format!("the response could not be printed: {e}"), &[]),
            },
            Err(e) => gateway_error(StatusCode::BAD_GATEWAY, Code::Internal, &format!("the service's response did not decode: {e}"), &[]),
        },
        // The service gives up at the deadline the gateway sent (tonic answers CANCELLED
        // "Timeout expired"), racing the gateway's own timer: either way the answer is 504.
        Ok(Err(status))
            if matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded) && tokio::time::Instant::now() + gw.timeout / 20 >= deadline =>
        {
            timed_out()
        }
        Ok(Err(status)) => from_status(&status, &gw.status_desc),
    };
    if let Some(v) = trace.get("traceparent").and_then(|v| HeaderValue::from_str(v).ok()) {
        response.headers_mut().insert("traceresponse", v);
    }
    if parts.method == Method::HEAD {
        *response.body_mut() = Body::empty();
    }
    response
}

/// The proto3 JSON of a response with every field that has no presence printed at its zero
/// value too (`0`, `"0"` for 64-bit integers, `false`, `""`, `[]`, `{}`), as protobuf's
/// `always_print_fields_with_no_presence` option does: a JavaScript caller reads `0` or `false`,
/// never `undefined`. Message fields, oneof members and `optional` fields appear only when set.
///
/// # Errors
/// The message cannot be printed (a value JSON has no form for).
pub fn response_json(out: &DynamicMessage) -> Result<Vec<u8>, serde_json::Error> {
    let mut json = Vec::new();
    out.serialize_with_options(&mut serde_json::Serializer::new(&mut json), &SerializeOptions::new().skip_default_fields(false))?;
    Ok(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_request_carries_the_callers_trace_and_credentials() {
        socialgraph_telemetry::init_for_tests();
        let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_str(&format!("00-{trace_id}-00f067aa0ba902b7-01")).expect("header"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer s3cret"));
        let span = tracing::info_span!("http");
        socialgraph_telemetry::set_parent_from_metadata(&span, &tonic::metadata::MetadataMap::from_headers(headers.clone()));
        let pool = socialgraph_httpapi::pool().expect("descriptors");
        let desc = pool.get_message_by_name("socialgraph.relation.v1.FollowRequest").expect("FollowRequest");
        let request = grpc_request(&DynamicMessage::new(desc), &headers, &trace_headers(&span), Duration::from_secs(3));
        let md = request.metadata();
        assert_eq!(md.get("authorization").and_then(|v| v.to_str().ok()), Some("Bearer s3cret"));
        let traceparent = md.get("traceparent").and_then(|v| v.to_str().ok()).expect("traceparent sent upstream");
        assert!(traceparent.starts_with(&format!("00-{trace_id}-")), "{traceparent}");
        assert!(!traceparent.contains("00f067aa0ba902b7"), "the gateway's own span is the parent upstream");
        assert_eq!(md.get("grpc-timeout").and_then(|v| v.to_str().ok()), Some("3000000u"));
    }
    #[test]
    fn responses_print_every_field_without_presence_even_at_zero() {
        let pool = socialgraph_httpapi::pool().expect("descriptors");
        let counters = pool.get_message_by_name("socialgraph.counter.v1.GetUserCountersResponse").expect("GetUserCountersResponse");
        let mut out = DynamicMessage::new(counters.clone());
        let mut inner = DynamicMessage::new(pool.get_message_by_name("socialgraph.counter.v1.UserCounters").expect("UserCounters"));
        inner.set_field_by_name("user_id", prost_reflect::Value::I64(4037));
        inner.set_field_by_name("followings", prost_reflect::Value::U64(15));
        out.set_field_by_name("counters", prost_reflect::Value::Message(inner));
        let json: serde_json::Value = serde_json::from_slice(&response_json(&out).expect("prints")).expect("json");
        let c = &json["counters"];
        assert_eq!(c["userId"], "4037");
        assert_eq!(c["followings"], "15");
        for zero in ["followers", "posts", "likesReceived", "favsReceived"] {
            assert_eq!(c[zero], "0", "{zero} is printed at zero: {json}");
        }
        let relationship = pool.get_message_by_name("socialgraph.relation.v1.Relationship").expect("Relationship");
        let json: serde_json::Value = serde_json::from_slice(&response_json(&DynamicMessage::new(relationship)).expect("prints")).expect("json");
        for flag in ["following", "followedBy", "blocking", "blockedBy", "muting", "requested", "requestedBy"] {
            assert_eq!(json[flag], false, "{flag} is printed when false: {json}");
        }
        // A message field has presence: unset, it stays out rather than reading as 1970.
        assert!(json.get("followedAt").is_none(), "{json}");
        // Repeated fields print as [] when empty.
        let page = pool.get_message_by_name("socialgraph.relation.v1.ListFollowingResponse").expect("ListFollowingResponse");
        let json: serde_json::Value = serde_json::from_slice(&response_json(&DynamicMessage::new(page)).expect("prints")).expect("json");
        assert_eq!(json["nextPageToken"], "", "{json}");
        assert!(json.as_object().is_some_and(|o| o.values().any(|v| v == &serde_json::json!([]))), "{json}");
    }
}
