//! Credentials that rotate, and logins that never hammer vCenter's SSO.
//!
//! - A [`CredentialSource`] is asked for credentials before every login (not once at start):
//!   a provider backs it by a Kubernetes Secret or a secrets directory, so a rotated password
//!   is picked up at the next login without a restart.
//! - A [`LoginGate`] decides whether a login may be attempted now. Credentials vCenter
//!   rejected (`InvalidLogin`, HTTP 401) are not sent again for 60 s, doubling up to 15 min,
//!   unless the source returns different ones (then at once): vCenter's SSO locks an account
//!   after a few failed logins (5 within 3 min by default), and a controller retrying every
//!   few seconds must never cause that. Other login failures (vCenter unreachable) wait 1 s,
//!   doubling up to 30 s.
//! - Sessions carry a generation, so concurrent callers that all saw `NotAuthenticated` share
//!   one re-login.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};

use crate::{Error, Secret};

/// Username and password of one vCenter.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password (never shown).
    pub password: Secret,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &self.password)
            .finish()
    }
}

/// The future a [`CredentialSource`] returns.
pub type CredentialFuture = Pin<Box<dyn Future<Output = Result<Credentials, Error>> + Send>>;

/// Where a client gets its credentials, asked before every login with whether vCenter
/// rejected the previous ones (a source with several candidates, e.g. the config file's and a
/// Secret's, then offers the next).
#[derive(Clone)]
pub struct CredentialSource(Arc<dyn Fn(bool) -> CredentialFuture + Send + Sync>);

impl std::fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialSource")
    }
}

impl CredentialSource {
    /// A source that reads credentials with `f(previous_rejected)` at every login.
    pub fn new(f: impl Fn(bool) -> CredentialFuture + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Always the same credentials.
    pub fn fixed(credentials: Credentials) -> Self {
        Self::new(move |_| {
            let c = credentials.clone();
            Box::pin(async move { Ok(c) })
        })
    }

    /// The current credentials (`previous_rejected`: vCenter refused the last ones).
    pub async fn get(&self, previous_rejected: bool) -> Result<Credentials, Error> {
        (self.0)(previous_rejected).await
    }
}

impl From<Credentials> for CredentialSource {
    fn from(c: Credentials) -> Self {
        Self::fixed(c)
    }
}

/// First wait after vCenter rejected credentials.
pub const REJECTED_CREDENTIALS_BACKOFF: Duration = Duration::from_secs(60);
/// Longest wait after rejected credentials.
pub const REJECTED_CREDENTIALS_BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);
/// First wait after a login failed for another reason.
pub const LOGIN_ERROR_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait after a login failed for another reason.
pub const LOGIN_ERROR_BACKOFF_MAX: Duration = Duration::from_secs(30);

fn fingerprint(c: &Credentials) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(c.username.as_bytes());
    h.update([0]);
    h.update(c.password.expose().as_bytes());
    h.finalize().into()
}

fn doubled(first: Duration, max: Duration, failures: u32) -> Duration {
    first
        .checked_mul(1u32 << failures.saturating_sub(1).min(16))
        .unwrap_or(max)
        .min(max)
}

/// Whether logins may be attempted, and the session generation (see the module docs).
#[derive(Debug, Default)]
pub struct LoginGate {
    /// Whether a session is believed to be active.
    pub active: bool,
    /// Bumped by every successful login.
    pub generation: u64,
    rejected: Option<[u8; 32]>,
    rejections: u32,
    errors: u32,
    retry_at: Option<Instant>,
    last_error: String,
}

impl LoginGate {
    /// Whether a caller that used session `stale` (`None`: no session yet) must log in: the
    /// session is inactive, or it is still the one the caller saw fail.
    pub fn needs_login(&self, stale: Option<u64>) -> bool {
        !self.active || stale == Some(self.generation)
    }

    /// Err while a back-off after a failed login runs; `credentials` are the ones about to be
    /// sent (rejected ones wait their whole back-off, new ones go at once).
    pub fn check(&self, url: &str, credentials: &Credentials, now: Instant) -> Result<(), Error> {
        let Some(at) = self.retry_at else { return Ok(()) };
        if now >= at {
            return Ok(());
        }
        let same_as_rejected = self.rejected == Some(fingerprint(credentials));
        if self.rejected.is_some() && !same_as_rejected && self.errors == 0 {
            return Ok(());
        }
        Err(Error::LoginBackoff {
            url: url.to_string(),
            retry_in_secs: (at - now).as_secs().max(1),
            last: self.last_error.clone(),
        })
    }

    /// Records a successful login.
    pub fn succeeded(&mut self) {
        self.active = true;
        self.generation += 1;
        self.rejected = None;
        self.rejections = 0;
        self.errors = 0;
        self.retry_at = None;
        self.last_error.clear();
    }

    /// Records a failed login; `rejected` when vCenter refused the credentials themselves.
    pub fn failed(&mut self, credentials: &Credentials, rejected: bool, error: &Error, now: Instant) {
        self.active = false;
        self.last_error = error.to_string();
        let wait = if rejected {
            self.rejected = Some(fingerprint(credentials));
            self.rejections += 1;
            self.errors = 0;
            doubled(
                REJECTED_CREDENTIALS_BACKOFF,
                REJECTED_CREDENTIALS_BACKOFF_MAX,
                self.rejections,
            )
        } else {
            self.errors += 1;
            doubled(LOGIN_ERROR_BACKOFF, LOGIN_ERROR_BACKOFF_MAX, self.errors)
        };
        self.retry_at = Some(now + wait);
    }

    /// Whether vCenter rejected the credentials of the last login.
    pub fn last_rejected(&self) -> bool {
        self.rejected.is_some()
    }

    /// Marks the session as gone (logged out).
    pub fn logged_out(&mut self) {
        self.active = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(p: &str) -> Credentials {
        Credentials {
            username: "u".into(),
            password: Secret::new(p),
        }
    }

    #[test]
    fn rejected_credentials_wait_new_ones_go_at_once() {
        let t0 = Instant::now();
        let mut g = LoginGate::default();
        let e = Error::Response("InvalidLogin".into());
        g.failed(&creds("old"), true, &e, t0);
        let err = g
            .check("u", &creds("old"), t0 + Duration::from_secs(59))
            .unwrap_err();
        assert!(err.to_string().contains("again for 1 s"), "{err}");
        assert!(!err.to_string().contains("old"), "no password in errors: {err}");
        assert!(g.check("u", &creds("new"), t0 + Duration::from_secs(1)).is_ok());
        assert!(g.check("u", &creds("old"), t0 + Duration::from_secs(60)).is_ok());
        g.failed(&creds("old"), true, &e, t0);
        assert!(
            g.check("u", &creds("old"), t0 + Duration::from_secs(119))
                .is_err()
        );
        for _ in 0..20 {
            g.failed(&creds("old"), true, &e, t0);
        }
        assert!(
            g.check("u", &creds("old"), t0 + REJECTED_CREDENTIALS_BACKOFF_MAX)
                .is_ok()
        );
        g.succeeded();
        assert!(g.check("u", &creds("old"), t0).is_ok());
        assert_eq!(g.generation, 1);
    }

    #[test]
    fn other_failures_back_off_shortly_whatever_the_credentials() {
        let t0 = Instant::now();
        let mut g = LoginGate::default();
        let e = Error::Response("down".into());
        g.failed(&creds("a"), false, &e, t0);
        assert!(g.check("u", &creds("b"), t0).is_err());
        assert!(g.check("u", &creds("a"), t0 + LOGIN_ERROR_BACKOFF).is_ok());
        g.failed(&creds("a"), false, &e, t0);
        assert!(g.check("u", &creds("a"), t0 + Duration::from_secs(1)).is_err());
        assert!(g.check("u", &creds("a"), t0 + Duration::from_secs(2)).is_ok());
    }

    #[test]
    fn a_stale_session_is_relogged_once() {
        let mut g = LoginGate::default();
        assert!(g.needs_login(None));
        g.succeeded();
        assert!(!g.needs_login(None));
        assert!(g.needs_login(Some(1)), "the caller's session failed: log in");
        g.succeeded();
        assert!(!g.needs_login(Some(1)), "another caller already logged in again");
    }
}
