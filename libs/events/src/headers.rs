//! Record headers as stored in the outbox `headers` column: one `name: value` line each.

use std::collections::BTreeMap;

/// Header carrying the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
/// Header naming the message type, e.g. `socialgraph.events.v1.RelationEvent`.
pub const EVENT_TYPE: &str = "event-type";
/// Header naming the schema version (`v1`).
pub const SCHEMA: &str = "schema";
/// Header naming the outbox row a record was published from (decimal id); a new relay leader
/// reads it back to skip rows its predecessor published but could not delete.
pub const OUTBOX_ID: &str = "outbox-id";

/// The record headers of a new event of `event_type` (the full message name, e.g.
/// `socialgraph.events.v1.RelationEvent`): the W3C trace context of the current span
/// ([`TRACEPARENT`], absent when there is none), [`EVENT_TYPE`] and [`SCHEMA`] = `v1`.
pub fn event_headers(event_type: &str) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    socialgraph_telemetry::inject_headers(&tracing::Span::current(), &mut headers);
    headers.insert(EVENT_TYPE.to_owned(), event_type.to_owned());
    headers.insert(SCHEMA.to_owned(), "v1".to_owned());
    headers
}

/// Encodes headers as `name: value` lines (names and values must not contain newlines).
pub fn encode(headers: &BTreeMap<String, String>) -> String {
    headers.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

/// Decodes `name: value` lines; lines without `": "` are ignored.
pub fn decode(text: &str) -> BTreeMap<String, Vec<u8>> {
    text.lines().filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let mut h = BTreeMap::new();
        h.insert(TRACEPARENT.to_owned(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned());
        h.insert(SCHEMA.to_owned(), "v1".to_owned());
        let back = decode(&encode(&h));
        assert_eq!(back.len(), 2);
        assert_eq!(back[SCHEMA], b"v1");
    }

    #[test]
    fn an_event_outside_any_trace_carries_its_type_and_schema_only() {
        let h = event_headers("socialgraph.events.v1.RelationEvent");
        assert_eq!(h.keys().map(String::as_str).collect::<Vec<_>>(), [EVENT_TYPE, SCHEMA]);
        assert_eq!(h[EVENT_TYPE], "socialgraph.events.v1.RelationEvent");
        assert_eq!(h[SCHEMA], "v1");
    }
}
