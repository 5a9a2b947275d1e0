//! The client's errors, with OpenStack's own messages.

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// A client error. Messages carry the method, the URL path and OpenStack's own message.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Keystone refused the credentials or answered without a token.
    #[error("keystone authentication at {url}: {message}")]
    Auth {
        /// The token URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The catalog has no endpoint for a service.
    #[error("the keystone catalog has no {interface} endpoint of type {service:?}{region}")]
    NoEndpoint {
        /// Catalog type.
        service: &'static str,
        /// Interface asked for.
        interface: String,
        /// ` in region R` or empty.
        region: String,
    },
    /// An HTTP answer other than 2xx.
    #[error("{method} {url}: HTTP {status}: {message}")]
    Http {
        /// Method.
        method: Method,
        /// URL.
        url: String,
        /// Status.
        status: StatusCode,
        /// OpenStack's message (or the body's start).
        message: String,
    },
    /// No answer (connection refused, timeout, TLS).
    #[error("{method} {url}: {}", describe_transport(.source))]
    Transport {
        /// Method.
        method: Method,
        /// URL.
        url: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// An answer that is not the JSON expected.
    #[error("{method} {url}: unexpected answer: {message}")]
    Decode {
        /// Method.
        method: Method,
        /// URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// A TLS or client setting.
    #[error("{0}")]
    Setup(String),
    /// A write not sent: the controller manager runs with `--dry-run` (shadow mode).
    #[error("dry run: {0} was not sent (the controller manager runs with --dry-run)")]
    DryRun(String),
}

/// A transport error as a user reads it: a timeout names the setting that bounds it; any
/// other with its causes (reqwest's own message is only "error sending request": the cause
/// says e.g. that the server's certificate has an unknown issuer).
pub fn describe_transport(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "no answer within the request timeout ([Metadata] request-timeout, 60 s by default)"
            .to_string();
    }
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

impl ClientError {
    /// Whether the request that failed so may be sent again as it is (see
    /// [`super::OpenStackClient::request`]).
    pub fn may_be_sent_again(&self, method: &Method) -> bool {
        let idempotent = matches!(*method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE);
        match self {
            Self::Http { status, .. } => match status.as_u16() {
                429 | 503 => true,
                500 | 502 | 504 => idempotent,
                _ => false,
            },
            Self::Transport { source, .. } => source.is_connect() || idempotent,
            _ => false,
        }
    }

    /// HTTP 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Http { status, .. } if *status == StatusCode::NOT_FOUND)
    }

    /// HTTP 409 (octavia: the load balancer is immutable while PENDING_*).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Http { status, .. } if *status == StatusCode::CONFLICT)
    }
}

/// OpenStack's error bodies: `{"badRequest": {"message": …}}` (nova),
/// `{"NeutronError": {"message": …}}`, `{"faultstring": …}` (octavia),
/// `{"error": {"message": …}}` (keystone).
pub(super) fn openstack_message(body: &Value) -> String {
    if let Some(s) = body.as_str() {
        return s.trim().to_string();
    }
    if let Some(s) = body.get("faultstring").and_then(Value::as_str) {
        return s.to_string();
    }
    if let Some(obj) = body.as_object() {
        for v in obj.values() {
            if let Some(m) = v.get("message").and_then(Value::as_str) {
                return m.to_string();
            }
        }
    }
    let s = body.to_string();
    s.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_what_cannot_happen_twice_is_sent_again() {
        let http = |status: u16| ClientError::Http {
            method: Method::POST,
            url: "/x".into(),
            status: StatusCode::from_u16(status).unwrap(),
            message: String::new(),
        };
        for m in [Method::GET, Method::PUT, Method::DELETE, Method::POST] {
            assert!(http(429).may_be_sent_again(&m), "{m} after 429");
            assert!(http(503).may_be_sent_again(&m), "{m} after 503");
            assert!(!http(404).may_be_sent_again(&m), "{m} after 404");
            assert!(!http(409).may_be_sent_again(&m), "{m} after 409");
        }
        assert!(http(500).may_be_sent_again(&Method::GET));
        assert!(http(502).may_be_sent_again(&Method::DELETE));
        assert!(
            !http(500).may_be_sent_again(&Method::POST),
            "a POST that may have been processed"
        );
        assert!(!http(504).may_be_sent_again(&Method::POST));
        assert!(!ClientError::Setup("x".into()).may_be_sent_again(&Method::GET));
    }

    #[test]
    fn error_bodies_of_each_service() {
        assert_eq!(
            openstack_message(&json!({"itemNotFound": {"code": 404, "message": "gone"}})),
            "gone"
        );
        assert_eq!(
            openstack_message(&json!({"NeutronError": {"message": "busy", "type": "x"}})),
            "busy"
        );
        assert_eq!(
            openstack_message(&json!({"faultstring": "immutable"})),
            "immutable"
        );
        assert_eq!(openstack_message(&json!("plain")), "plain");
    }
}
