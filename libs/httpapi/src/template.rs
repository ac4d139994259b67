//! Path templates of `google.api.http` rules: literal segments, `{field}` or `{message.field}`
//! variables that each bind one whole segment, and an optional `:verb` after the last segment
//! (the subset of the HttpRule grammar socialgraph's routes use; `*`, `**` and `{f=pattern}` are
//! refused when the routes are read, never silently mis-matched).

use crate::RouteError;

/// One `/`-separated part of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Must equal this text.
    Literal(String),
    /// Binds the segment's percent-decoded text to this field path (`["entity", "entity_id"]`).
    Field(Vec<String>),
}

/// A parsed path template such as `/v1/users/{user_id}/following:count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The text it was parsed from, as written in the proto (also the OpenAPI path).
    pub text: String,
    /// The segments after the leading `/`.
    pub segments: Vec<Segment>,
    /// The custom verb after the last segment, without its `:`.
    pub verb: Option<String>,
}

/// A path's values for the template's variables: (field path, percent-decoded text).
pub type Bindings = Vec<(Vec<String>, String)>;

impl Template {
    /// Parses `text`.
    ///
    /// # Errors
    /// No leading `/`, an empty segment, a wildcard or a `{field=pattern}` variable, or a
    /// malformed field path.
    pub fn parse(text: &str) -> Result<Self, RouteError> {
        let bad = |why: &str| RouteError::Template { template: text.to_owned(), why: why.to_owned() };
        let rest = text.strip_prefix('/').ok_or_else(|| bad("must start with /"))?;
        let (body, verb) = match rest.rsplit_once(':') {
            Some((body, verb)) if !verb.contains('/') && !verb.contains('}') => (body, Some(verb.to_owned())),
            _ => (rest, None),
        };
        let mut segments = Vec::new();
        for part in body.split('/') {
            if part.is_empty() {
                return Err(bad("empty segment"));
            }
            if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                if inner.contains('=') || inner.contains('*') {
                    return Err(bad("only whole-segment {field} variables are supported"));
                }
                let path: Vec<String> = inner.split('.').map(str::to_owned).collect();
                if path.iter().any(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')) {
                    return Err(bad("malformed field path"));
                }
                segments.push(Segment::Field(path));
            } else if part.contains(['{', '}', '*']) {
                return Err(bad("wildcards and partial-segment variables are not supported"));
            } else {
                segments.push(Segment::Literal(part.to_owned()));
            }
        }
        Ok(Self { text: text.to_owned(), segments, verb })
    }

    /// The field paths bound by the template, in path order.
    pub fn fields(&self) -> impl Iterator<Item = &[String]> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Field(f) => Some(f.as_slice()),
            Segment::Literal(_) => None,
        })
    }

    /// How many segments are literals: a more literal template wins over a more general one.
    pub fn literal_count(&self) -> usize {
        self.segments.len() - self.fields().count()
    }

    /// The variables' values when `path` (a request path, without query) matches, else `None`.
    /// Values are percent-decoded (bytes that are not UTF-8 become U+FFFD).
    pub fn matches(&self, path: &str) -> Option<Bindings> {
        let rest = path.strip_prefix('/')?;
        let body = match &self.verb {
            Some(verb) => rest.strip_suffix(verb.as_str())?.strip_suffix(':')?,
            None => rest,
        };
        let parts: Vec<&str> = body.split('/').collect();
        if parts.len() != self.segments.len() {
            return None;
        }
        let mut bound = Vec::new();
        for (segment, part) in self.segments.iter().zip(parts) {
            match segment {
                Segment::Literal(l) if l == part => {}
                Segment::Literal(_) => return None,
                Segment::Field(_) if part.is_empty() => return None,
                Segment::Field(f) => {
                    // Undecodable bytes become U+FFFD: the value is then refused by name (400),
                    // not mistaken for a missing route.
                    let value = percent_encoding::percent_decode_str(part).decode_utf8_lossy();
                    bound.push((f.clone(), value.into_owned()));
                }
            }
        }
        Some(bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Template {
        match Template::parse(s) {
            Ok(t) => t,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn variables_bind_whole_segments_and_decode_percent_escapes() {
        let tpl = t("/v1/entities/{entity.entity_type}/{entity.entity_id}/likes/{actor_id}");
        let b = tpl.matches("/v1/entities/po%73t/7/likes/3").expect("matches");
        assert_eq!(b[0], (vec!["entity".to_owned(), "entity_type".to_owned()], "post".to_owned()));
        assert_eq!(b[1].1, "7");
        assert_eq!(b[2], (vec!["actor_id".to_owned()], "3".to_owned()));
        assert!(tpl.matches("/v1/entities/post/7/likes").is_none());
        assert!(tpl.matches("/v1/entities/post/7/favs/3").is_none());
        assert!(tpl.matches("/v1/entities/post//likes/3").is_none());
    }

    #[test]
    fn a_verb_must_be_present_exactly_when_the_template_has_one() {
        let count = t("/v1/users/{user_id}/following:count");
        let list = t("/v1/users/{user_id}/following");
        assert_eq!(count.verb.as_deref(), Some("count"));
        assert!(count.matches("/v1/users/5/following:count").is_some());
        assert!(count.matches("/v1/users/5/following").is_none());
        assert!(list.matches("/v1/users/5/following:count").is_none());
        assert!(list.matches("/v1/users/5:count/following").is_some(), "a colon inside a variable is its text");
        assert_eq!(t("/v1/counters:batchGet").literal_count(), 2);
    }

    #[test]
    fn unsupported_templates_are_refused() {
        for bad in ["v1/x", "/v1//x", "/v1/{name=users/*}", "/v1/*", "/v1/x{y}", "/v1/{a..b}", "/v1/{}"] {
            assert!(Template::parse(bad).is_err(), "{bad} should be refused");
        }
    }
}
