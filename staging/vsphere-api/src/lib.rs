//! Typed bindings for VMware vCenter: the vim25 SOAP API ([`soap`]) and the vSphere
//! Automation REST tagging API ([`rest`]), on reqwest with rustls.
//!
//! - One long-lived SOAP session and one REST session per client, re-created only when vCenter
//!   says they expired (`NotAuthenticated` / HTTP 401); concurrent callers share one re-login.
//! - Credentials come from a [`CredentialSource`] asked at every login (rotation without a
//!   restart); rejected credentials are not retried for minutes ([`login`]).
//! - TLS verification is on by default; a CA bundle, a pinned thumbprint, or an explicit
//!   insecure flag change it ([`tls::TlsOptions`]).
//! - SOAP faults are typed ([`SoapFault::kind`] is the fault type, e.g. `NotAuthenticated`,
//!   `InvalidLogin`, `ManagedObjectNotFound`).
//! - Passwords are [`Secret`]s: never in `Debug`, logs or errors.
//!
//! Only the operations a cloud provider needs are bound (see [`soap`]); the XML layer
//! ([`xml`]) is small and reads any namespace prefix.

pub mod login;
pub mod rest;
pub mod soap;
pub mod tls;
pub mod xml;

pub use login::{CredentialSource, Credentials};
pub use soap::{Client, GuestNicInfo, MoRef, PropertySet, ServiceContent};

/// A password or token: its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A SOAP fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("vCenter fault {kind}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
pub struct SoapFault {
    /// The fault type (`NotAuthenticated`, `InvalidLogin`, `ManagedObjectNotFound`, …).
    pub kind: String,
    /// `faultstring`.
    pub message: String,
}

/// Errors of the bindings. None carries a password.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The server could not be reached, or TLS failed (e.g. an untrusted certificate or a
    /// thumbprint mismatch).
    #[error("cannot reach {url}: {reason}")]
    Connect {
        /// The URL.
        url: String,
        /// Why (with the TLS error, if any).
        reason: String,
    },
    /// An HTTP error status without a SOAP fault.
    #[error("{url} answered HTTP {status}{}", if body.is_empty() { String::new() } else { format!(": {body}") })]
    Status {
        /// The URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// A SOAP fault.
    #[error(transparent)]
    Fault(#[from] SoapFault),
    /// The answer is not well-formed XML.
    #[error(transparent)]
    Xml(#[from] xml::XmlError),
    /// The answer lacks something expected.
    #[error("unexpected answer: {0}")]
    Response(String),
    /// Bad client settings (TLS files, thumbprint format).
    #[error("{0}")]
    Config(String),
    /// A login is not attempted while the back-off after a failed one runs.
    #[error("not logging in to {url} again for {retry_in_secs} s after a failed login: {last}")]
    LoginBackoff {
        /// The endpoint.
        url: String,
        /// Seconds until the next attempt.
        retry_in_secs: u64,
        /// Why the last login failed.
        last: String,
    },
    /// The credential source failed (e.g. the Secret could not be read).
    #[error("credentials: {0}")]
    Credentials(String),
}

impl Error {
    /// Whether this is the SOAP fault `kind`.
    pub fn is_fault(&self, kind: &str) -> bool {
        matches!(self, Self::Fault(f) if f.kind == kind)
    }
}

/// `server` as the host of a URL: an IPv6 address in brackets.
pub(crate) fn url_host(server: &str) -> String {
    if server.contains(':') && !server.starts_with('[') {
        format!("[{server}]")
    } else {
        server.to_string()
    }
}

/// An error with its whole `source()` chain, for messages (TLS details live deep in it).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_show() {
        let c = Credentials {
            username: "admin".into(),
            password: Secret::new("hunter2"),
        };
        let dbg = format!("{c:?} {}", c.password);
        assert!(!dbg.contains("hunter2") && dbg.contains("[redacted]"), "{dbg}");
    }
}
