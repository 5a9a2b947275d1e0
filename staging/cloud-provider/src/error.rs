//! The errors a cloud provider returns to the controllers (upstream `cloud.go` sentinels and
//! `api.RetryError`), in one enum.

use std::time::Duration;

/// A boxed error from a provider's own error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a [`crate::CloudProvider`] method can fail with.
///
/// The controllers act on the first five variants exactly as upstream does; everything else
/// is [`CloudError::Other`] and is retried with back-off. `#[non_exhaustive]`: a variant may be
/// added in a minor release, so a `match` needs a wildcard arm (or use the `is_*` methods).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloudError {
    /// The instance does not exist. Must **not** be returned for stopped instances: the
    /// node-lifecycle controller deletes the Node when it sees this.
    #[error("instance not found")]
    InstanceNotFound,
    /// The optional method is not supported by this provider.
    #[error("unimplemented")]
    NotImplemented,
    /// The load balancer is handled by another controller (e.g. the AWS Load Balancer
    /// Controller); the service controller treats ensure/update as a successful no-op.
    #[error("implemented by alternate to cloud provider")]
    ImplementedElsewhere,
    /// A volume does not exist (volume helpers only).
    #[error("disk is not found")]
    DiskNotFound,
    /// Retry after exactly this delay instead of exponential back-off (service controller).
    #[error("{message}")]
    Retry {
        /// Why the provider wants a retry.
        message: String,
        /// The delay before the next attempt.
        after: Duration,
    },
    /// Any other failure; the message should name the object, field and value involved.
    #[error("{message}")]
    Other {
        /// What went wrong.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl CloudError {
    /// An [`CloudError::Other`] with a message and no source.
    pub fn msg(message: impl Into<String>) -> Self {
        Self::Other {
            message: message.into(),
            source: None,
        }
    }

    /// An [`CloudError::Other`] wrapping `source`, described by `context`. The source's message
    /// is appended so that it shows in logs and events.
    pub fn wrap(context: impl std::fmt::Display, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Self::Other {
            message: format!("{context}: {source}"),
            source: Some(source),
        }
    }

    /// A [`CloudError::Retry`].
    pub fn retry_after(message: impl Into<String>, after: Duration) -> Self {
        Self::Retry {
            message: message.into(),
            after,
        }
    }

    /// Whether this is [`CloudError::InstanceNotFound`].
    pub fn is_instance_not_found(&self) -> bool {
        matches!(self, Self::InstanceNotFound)
    }

    /// Whether this is [`CloudError::NotImplemented`].
    pub fn is_not_implemented(&self) -> bool {
        matches!(self, Self::NotImplemented)
    }

    /// The fixed retry delay, if this is [`CloudError::Retry`].
    pub fn retry_delay(&self) -> Option<Duration> {
        match self {
            Self::Retry { after, .. } => Some(*after),
            _ => None,
        }
    }
}

/// Result of a cloud call.
pub type CloudResult<T> = Result<T, CloudError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_messages_match_upstream() {
        assert_eq!(CloudError::InstanceNotFound.to_string(), "instance not found");
        assert_eq!(CloudError::NotImplemented.to_string(), "unimplemented");
        assert_eq!(
            CloudError::ImplementedElsewhere.to_string(),
            "implemented by alternate to cloud provider"
        );
        assert_eq!(CloudError::DiskNotFound.to_string(), "disk is not found");
    }

    #[test]
    fn wrap_keeps_the_source_and_its_message() {
        let io = std::io::Error::other("connection refused");
        let e = CloudError::wrap("DescribeInstances for i-123", io);
        assert_eq!(e.to_string(), "DescribeInstances for i-123: connection refused");
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(
            CloudError::retry_after("busy", Duration::from_secs(7)).retry_delay(),
            Some(Duration::from_secs(7))
        );
    }
}
