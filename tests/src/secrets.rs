//! Sentinel secrets: every credential the tests hand to a CCM (the AWS secret key moto is
//! used with, the vCenter password of vcsim, the OpenStack passwords of keystone, the API
//! server's admin token and the service account tokens minted by TokenRequest) is registered here when it is made. When a
//! [`crate::ccm::CcmProcess`] is dropped its whole log is searched for them, and when a
//! [`crate::TestCluster`] is dropped every Event of the cluster: a secret found fails the test
//! that leaked it, whichever test it is.

use std::sync::Mutex;

static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The AWS secret access key the tests give the CCM (moto accepts any).
pub const AWS_SECRET_ACCESS_KEY: &str = "rcpSentinelAwsSecretAccessKey0123456789";

/// Registers a secret (values shorter than 8 characters are too common to search for).
pub fn register(secret: &str) {
    if secret.len() >= 8 {
        let mut s = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
        if !s.iter().any(|x| x == secret) {
            s.push(secret.to_string());
        }
    }
}

/// The registered secrets found in `text`, each shown by its first 4 characters only.
pub fn leaked_in(text: &str) -> Vec<String> {
    let mut all = SECRETS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    all.push(AWS_SECRET_ACCESS_KEY.to_string());
    all.iter()
        .filter(|s| text.contains(s.as_str()))
        .map(|s| format!("{}… ({} chars)", &s[..4], s.len()))
        .collect()
}

/// Fails (panics) when `text`, the content of `what`, holds a registered secret; does nothing
/// while the thread is already panicking (a test that failed anyway).
pub fn assert_none_in(what: &str, text: &str) {
    if std::thread::panicking() {
        return;
    }
    let found = leaked_in(text);
    assert!(found.is_empty(), "secrets leaked into {what}: {found:?}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn registered_secrets_are_found_and_shown_redacted() {
        super::register("pw-1234567890");
        assert_eq!(
            super::leaked_in("login failed for pw-1234567890"),
            vec!["pw-1… (13 chars)"]
        );
        assert!(super::leaked_in("nothing here").is_empty());
        assert_eq!(super::leaked_in(super::AWS_SECRET_ACCESS_KEY).len(), 1);
    }
}
