//! The CLI's one error type, and gRPC statuses rendered as one readable line with their
//! google.rpc details (field violations, ErrorInfo reason, RetryInfo).

use std::path::PathBuf;

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// Anything a command can fail with. `Display` is one line meant for a person.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A service could not be reached.
    #[error("cannot connect to {service} at {url}: {reason}")]
    Connect {
        /// `relation-svc`, `projection-svc` or `counter-svc`.
        service: &'static str,
        /// The endpoint tried.
        url: String,
        /// The transport error and its causes, joined.
        reason: String,
    },
    /// A service answered with an error status.
    #[error("{}", describe_status(.service, .status))]
    Rpc {
        /// The service that answered.
        service: &'static str,
        /// Its status (boxed: statuses are large).
        status: Box<Status>,
    },
    /// A line of an input file is not what its format says.
    #[error("{source_name}:{line}: {message}")]
    Input {
        /// The file (or `<input>`).
        source_name: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong and, where it helps, what to do.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The arguments cannot work together.
    #[error("{0}")]
    Usage(String),
    /// A wait ran out.
    #[error("timed out: {0}")]
    Timeout(String),
}

/// Result of the CLI's functions.
pub type CliResult<T> = Result<T, CliError>;

impl CliError {
    /// Wraps a status returned by `service`.
    pub fn rpc(service: &'static str, status: Status) -> Self {
        Self::Rpc { service, status: Box::new(status) }
    }

    /// The gRPC code when this is an RPC error.
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Rpc { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

/// The canonical upper-case name of a gRPC code, as in the gRPC specification.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// One line: `service: CODE: message; field violations: f (why), …; reason R (domain);
/// retry after Ns`, plus a hint for missing admin credentials.
pub fn describe_status(service: &str, status: &Status) -> String {
    let mut out = format!("{service}: {}", code_name(status.code()));
    let message = one_line(status.message());
    if !message.is_empty() {
        out.push_str(": ");
        out.push_str(&message);
    }
    let details = status.get_error_details();
    if let Some(bad) = details.bad_request() {
        // Servers often spell the violations out in the message already: name only the rest.
        let fields: Vec<String> = bad
            .field_violations
            .iter()
            .filter(|v| !message.contains(&format!("{}: {}", v.field, one_line(&v.description))))
            .map(|v| format!("{} ({})", v.field, one_line(&v.description)))
            .collect();
        if !fields.is_empty() {
            out.push_str("; field violations: ");
            out.push_str(&fields.join(", "));
        }
    }
    if let Some(info) = details.error_info() {
        out.push_str(&format!("; reason {}", info.reason));
        if !info.domain.is_empty() {
            out.push_str(&format!(" ({})", info.domain));
        }
        let mut meta: Vec<String> = info.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
        meta.sort();
        if !meta.is_empty() {
            out.push_str(&format!(" [{}]", meta.join(", ")));
        }
    }
    if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
        out.push_str(&format!("; retry after {:.1}s", delay.as_secs_f64()));
    }
    // PERMISSION_DENIED (NOT_A_MEMBER, …) is about the resource; UNAUTHENTICATED about the
    // credentials.
    if status.code() == Code::Unauthenticated {
        out.push_str(" (admin RPCs need --admin-token or SG_ADMIN_TOKEN, matching the service's auth.admin_token)");
    }
    out
}

/// An error and its causes joined with `: `, on one line.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = s.source();
    }
    one_line(&parts.join(": "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tonic_types::{ErrorDetails, FieldViolation};

    #[test]
    fn status_with_details_reads_as_one_line() {
        let mut d = ErrorDetails::with_bad_request(vec![
            FieldViolation::new("follower_id", "must be > 0, got 0"),
            FieldViolation::new("followee_id", "must be > 0,\n got -1"),
        ]);
        d.set_error_info("SELF_FOLLOW", "socialgraph", [("limit".to_owned(), "5000".to_owned())]);
        d.set_retry_info(Some(Duration::from_millis(2500)));
        let s = Status::with_error_details(Code::InvalidArgument, "invalid argument", d);
        let line = describe_status("relation-svc", &s);
        assert_eq!(
            line,
            "relation-svc: INVALID_ARGUMENT: invalid argument; field violations: follower_id (must be > 0, got 0), \
             followee_id (must be > 0, got -1); reason SELF_FOLLOW (socialgraph) [limit=5000]; retry after 2.5s"
        );
        assert!(!line.contains('\n'));
        let d = ErrorDetails::with_bad_request(vec![FieldViolation::new("user_id", "must be > 0, got 0")]);
        let s = Status::with_error_details(Code::InvalidArgument, "invalid argument: user_id: must be > 0, got 0", d);
        assert_eq!(
            describe_status("projection-svc", &s),
            "projection-svc: INVALID_ARGUMENT: invalid argument: user_id: must be > 0, got 0",
            "violations already in the message are not repeated"
        );
    }

    #[test]
    fn missing_credentials_get_a_hint() {
        let s = Status::unauthenticated("missing or wrong admin bearer token");
        let line = CliError::rpc("relation-svc", s).to_string();
        assert!(line.starts_with("relation-svc: UNAUTHENTICATED: missing or wrong admin bearer token"), "{line}");
        assert!(line.contains("--admin-token"));
    }
}
