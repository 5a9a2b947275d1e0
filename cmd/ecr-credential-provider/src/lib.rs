//! The kubelet credential-provider plugin for Amazon ECR, as cloud-provider-aws's
//! `ecr-credential-provider` (`../shared/spec/aws-vsphere.md`, AWS-67…72).
//!
//! The kubelet runs the binary for every image its `CredentialProviderConfig` matches
//! (`matchImages`), writes a `CredentialProviderRequest` (JSON) to its stdin and reads a
//! `CredentialProviderResponse` from its stdout:
//!
//! - the image's host decides the API: the ECR Public hosts (`public.ecr.aws`,
//!   `ecr-public.aws.com`) → ECR Public's `GetAuthorizationToken` in `us-east-1`; a private
//!   registry host `<account>.dkr.ecr[-fips].<region>.<partition domain>` (also the dual-stack
//!   `dkr-ecr` form, every partition upstream knows) → ECR's `GetAuthorizationToken` in that
//!   region;
//! - the answer: `cacheKeyType: Registry`, `cacheDuration` half of the token's remaining life in
//!   whole seconds (omitted when that is not positive, `0s` when the token has no expiry), and
//!   one `auth` entry for the image's host with the user and password of the decoded token;
//! - with a service-account token in the request (kubelet ≥ 1.33) and a role ARN (the service
//!   account's annotation `eks.amazonaws.com/ecr-role-arn`, else `AWS_ECR_ROLE_ARN`), the
//!   credentials come from STS `AssumeRoleWithWebIdentity` (session `ecr-credential-provider`);
//!   otherwise from the SDK's default chain;
//! - each HTTP request times out after 30 s; one process per request, no cache of its own.
//!
//! Deliberate differences from upstream's current release, both for the kubelets and
//! registries users actually run:
//! - **Every API version**: `credentialprovider.kubelet.k8s.io/v1`, `v1beta1` and `v1alpha1` are
//!   read, and the answer is in the request's version (upstream's releases read only
//!   `v1alpha1` until 2023 and only `v1` since, so one binary did not serve old and new kubelets).
//! - **No ECR credentials for other registries**: an image whose host is neither an ECR private
//!   registry nor an ECR Public host is an error. Upstream then asks ECR in the default region
//!   and hands its token to whatever registry the image names (with a too-broad `matchImages`,
//!   e.g. `*.io`, the kubelet would send an ECR password to that registry).

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// The API group of the kubelet's credential-provider exec protocol.
pub const GROUP: &str = "credentialprovider.kubelet.k8s.io";

/// The region of ECR Public (it lives in `us-east-1` only, in the `aws` partition).
pub const ECR_PUBLIC_REGION: &str = "us-east-1";

/// The host names of ECR Public.
pub const ECR_PUBLIC_HOSTS: [&str; 2] = ["public.ecr.aws", "ecr-public.aws.com"];

/// The service-account annotation naming the role to assume with the service-account token.
pub const ROLE_ARN_ANNOTATION: &str = "eks.amazonaws.com/ecr-role-arn";

/// The environment variable naming the role when the service account does not.
pub const ROLE_ARN_ENV: &str = "AWS_ECR_ROLE_ARN";

/// STS session name of `AssumeRoleWithWebIdentity`.
pub const ROLE_SESSION_NAME: &str = "ecr-credential-provider";

/// Timeout of each HTTP request to AWS.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A private registry: `<12-digit account>.dkr.ecr[-fips].<region>.<partition domain>`, or the
/// dual-stack `….dkr-ecr…` form (upstream's `ecrPrivateHostPattern`).
static ECR_PRIVATE_HOST: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(\d{12})\.dkr[.\-]ecr(-fips)?\.([a-zA-Z0-9][a-zA-Z0-9\-_]*)\.(amazonaws\.(?:com(?:\.cn)?|eu)|on\.(?:aws|amazonwebservices\.com\.cn)|sc2s\.sgov\.gov|c2s\.ic\.gov|cloud\.adc-e\.uk|csp\.hci\.ic\.gov)$",
    )
    .expect("static regular expression")
});

/// Everything that makes the plugin answer with an error (stderr, exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// Stdin was not a JSON `CredentialProviderRequest`.
    #[error("the request on stdin is not a valid CredentialProviderRequest: {0}")]
    Malformed(String),
    /// The request's `apiVersion` is not one of the protocol's.
    #[error("apiVersion {0:?} is not supported: use {GROUP}/v1, {GROUP}/v1beta1 or {GROUP}/v1alpha1")]
    ApiVersion(String),
    /// The request's `kind` is not `CredentialProviderRequest`.
    #[error("kind was {0:?}, expected CredentialProviderRequest")]
    Kind(String),
    /// The request names no image.
    #[error("image in plugin request was empty")]
    EmptyImage,
    /// The image reference has no parseable host.
    #[error("error parsing image reference {image:?}: {reason}")]
    ImageReference {
        /// The image as the request gave it.
        image: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The image's registry is not an ECR registry.
    #[error(
        "image {image:?}: registry host {host:?} is not an Amazon ECR registry (<account>.dkr.ecr.<region>.amazonaws.com and the other partitions, or {}); no ECR credentials are given for it",
        ECR_PUBLIC_HOSTS.join(", ")
    )]
    NotEcr {
        /// The image as the request gave it.
        image: String,
        /// Its registry host.
        host: String,
    },
    /// A call to AWS failed.
    #[error("{call} failed: {message}")]
    Aws {
        /// The call (`ecr:GetAuthorizationToken`, …).
        call: &'static str,
        /// The SDK's error, with its cause chain.
        message: String,
    },
    /// AWS answered, but without what the plugin needs.
    #[error("{0}")]
    Answer(String),
}

/// A version of the protocol; the answer is written in the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    /// `credentialprovider.kubelet.k8s.io/v1` (kubelet ≥ 1.26).
    V1,
    /// `credentialprovider.kubelet.k8s.io/v1beta1` (kubelet 1.24…1.28).
    V1beta1,
    /// `credentialprovider.kubelet.k8s.io/v1alpha1` (kubelet 1.20…1.25).
    V1alpha1,
}

impl ApiVersion {
    /// Reads an `apiVersion` value.
    pub fn parse(api_version: &str) -> Result<Self, PluginError> {
        match api_version.split_once('/') {
            Some((GROUP, "v1")) => Ok(Self::V1),
            Some((GROUP, "v1beta1")) => Ok(Self::V1beta1),
            Some((GROUP, "v1alpha1")) => Ok(Self::V1alpha1),
            _ => Err(PluginError::ApiVersion(api_version.to_string())),
        }
    }

    /// The `apiVersion` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "credentialprovider.kubelet.k8s.io/v1",
            Self::V1beta1 => "credentialprovider.kubelet.k8s.io/v1beta1",
            Self::V1alpha1 => "credentialprovider.kubelet.k8s.io/v1alpha1",
        }
    }
}

/// A `CredentialProviderRequest` (fields of every version; unknown fields are ignored, as the
/// kubelet's own decoder does).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialProviderRequest {
    /// `credentialprovider.kubelet.k8s.io/<version>`.
    #[serde(default)]
    pub api_version: String,
    /// `CredentialProviderRequest`.
    #[serde(default)]
    pub kind: String,
    /// The image to pull.
    #[serde(default)]
    pub image: String,
    /// The pod's service-account token (v1, kubelet ≥ 1.33 with `tokenAttributes`).
    #[serde(default)]
    pub service_account_token: String,
    /// The annotations of the pod's service account the config asked for (v1).
    #[serde(default)]
    pub service_account_annotations: BTreeMap<String, String>,
}

/// User name and password for one registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthConfig {
    /// The user name (`AWS` for ECR).
    pub username: String,
    /// The password (the ECR authorization token's secret part).
    pub password: String,
}

/// A `CredentialProviderResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialProviderResponse {
    /// The request's `apiVersion`.
    pub api_version: &'static str,
    /// `CredentialProviderResponse`.
    pub kind: &'static str,
    /// `Registry`: the kubelet caches the answer per registry host.
    pub cache_key_type: &'static str,
    /// How long the kubelet may cache the answer (a Go duration), if at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_duration: Option<String>,
    /// Credentials by registry host.
    pub auth: BTreeMap<String, AuthConfig>,
}

/// Reads the request: JSON, a known `apiVersion`, kind `CredentialProviderRequest`, an image.
pub fn parse_request(input: &[u8]) -> Result<(ApiVersion, CredentialProviderRequest), PluginError> {
    let request: CredentialProviderRequest =
        serde_json::from_slice(input).map_err(|e| PluginError::Malformed(e.to_string()))?;
    let version = ApiVersion::parse(&request.api_version)?;
    if request.kind != "CredentialProviderRequest" {
        return Err(PluginError::Kind(request.kind));
    }
    if request.image.is_empty() {
        return Err(PluginError::EmptyImage);
    }
    Ok((version, request))
}

/// The host of an image reference (`host[:port]/repository[:tag|@digest]`), without the port,
/// as upstream reads it (a URL with `https://` prepended when there is no scheme).
pub fn image_host(image: &str) -> Result<String, PluginError> {
    let bad = |reason: String| PluginError::ImageReference {
        image: image.to_string(),
        reason,
    };
    let with_scheme = if image.contains("://") {
        image.to_string()
    } else {
        format!("https://{image}")
    };
    let url = url::Url::parse(&with_scheme).map_err(|e| bad(e.to_string()))?;
    match url.host_str() {
        Some(host) if !host.is_empty() => Ok(host.to_string()),
        _ => Err(bad("it names no registry host".into())),
    }
}

/// Which ECR API serves a registry host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registry {
    /// A private registry of an account, in a region.
    Private {
        /// The account ID (12 digits).
        account: String,
        /// The region of the registry.
        region: String,
        /// Whether the host is a FIPS endpoint.
        fips: bool,
    },
    /// ECR Public.
    Public,
}

/// Classifies an image's registry host; anything not ECR is an error.
pub fn registry_of(image: &str, host: &str) -> Result<Registry, PluginError> {
    if ECR_PUBLIC_HOSTS.contains(&host) {
        return Ok(Registry::Public);
    }
    match ECR_PRIVATE_HOST.captures(host) {
        Some(c) => Ok(Registry::Private {
            account: c[1].to_string(),
            region: c[3].to_string(),
            fips: c.get(2).is_some(),
        }),
        None => Err(PluginError::NotEcr {
            image: image.to_string(),
            host: host.to_string(),
        }),
    }
}

/// The role to assume with the request's service-account token: the service account's
/// annotation, else `AWS_ECR_ROLE_ARN` (`env` reads the environment). None without a token.
pub fn role_arn(request: &CredentialProviderRequest, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    if request.service_account_token.is_empty() {
        return None;
    }
    request
        .service_account_annotations
        .get(ROLE_ARN_ANNOTATION)
        .cloned()
        .or_else(|| env(ROLE_ARN_ENV))
        .filter(|arn| !arn.is_empty())
}

/// The `cacheDuration` of an answer: half of the token's remaining life in whole seconds (the
/// other half covers the time between the token's creation and the kubelet's use), None when
/// that is not positive, `0s` (no caching) when the token has no expiry.
pub fn cache_duration(expires_at_unix: Option<i64>, now_unix: i64) -> Option<String> {
    match expires_at_unix {
        None => Some("0s".into()),
        Some(expires) => {
            let half = expires.saturating_sub(now_unix) / 2;
            (half > 0).then(|| go_duration(half))
        }
    }
}

/// A whole number of seconds as Go's `time.Duration.String()` writes it (`6h0m0s`, `5m30s`,
/// `45s`). `k8s_controller_manager::duration::format_go_duration` does the same for any
/// duration, but linking the controller-manager crate (kube, k8s-openapi, prometheus) into a
/// plugin that the kubelet runs for every pull is not worth these six lines.
pub fn go_duration(seconds: i64) -> String {
    let (h, m, s) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Splits an ECR authorization token (base64 of `user:password`).
pub fn decode_token(token: &str) -> Result<AuthConfig, PluginError> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map_err(|e| PluginError::Answer(format!("the authorization token is not base64: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| PluginError::Answer("the authorization token is not UTF-8 text".into()))?;
    match text.split_once(':') {
        Some((user, password)) => Ok(AuthConfig {
            username: user.to_string(),
            password: password.to_string(),
        }),
        None => Err(PluginError::Answer(
            "error parsing username and password from authorization token".into(),
        )),
    }
}

/// An SDK error with its cause chain (the SDK's `Display` alone often says only "service
/// error").
fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The SDK configuration for `region` (None: the default chain's region), with the 30 s
/// request timeout and, when given, the assumed role's credentials.
async fn sdk_config(
    region: Option<String>,
    credentials: Option<aws_sdk_sts::config::Credentials>,
) -> aws_config::SdkConfig {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .operation_attempt_timeout(REQUEST_TIMEOUT)
        .build();
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).timeout_config(timeouts);
    // `app/rust-cloud-provider-ecr` in the user agent: which program called (CloudTrail).
    if let Ok(app) = aws_config::AppName::new("rust-cloud-provider-ecr") {
        loader = loader.app_name(app);
    }
    match region {
        Some(r) => loader = loader.region(aws_config::Region::new(r)),
        None => tracing::warn!(
            "no region found in the image reference, the default region will be used (AWS_REGION or the SDK's configuration)"
        ),
    }
    if let Some(c) = credentials {
        loader = loader.credentials_provider(c);
    }
    loader.load().await
}

/// Assumes `role_arn` with the service-account token (STS in `region`).
async fn assume_role(
    region: Option<String>,
    role_arn: &str,
    token: &str,
) -> Result<aws_sdk_sts::config::Credentials, PluginError> {
    let sts = aws_sdk_sts::Client::new(&sdk_config(region, None).await);
    let out = sts
        .assume_role_with_web_identity()
        .role_arn(role_arn)
        .role_session_name(ROLE_SESSION_NAME)
        .web_identity_token(token)
        .send()
        .await
        .map_err(|e| PluginError::Aws {
            call: "sts:AssumeRoleWithWebIdentity",
            message: describe(&e),
        })?;
    let c = out.credentials.ok_or_else(|| {
        PluginError::Answer("AssumeRoleWithWebIdentity answered without credentials".into())
    })?;
    Ok(aws_sdk_sts::config::Credentials::new(
        c.access_key_id,
        c.secret_access_key,
        Some(c.session_token),
        std::time::SystemTime::try_from(c.expiration).ok(),
        ROLE_SESSION_NAME,
    ))
}

/// Answers one request: asks ECR (or ECR Public) for an authorization token and returns the
/// response for the image's host. `env` reads the environment (for `AWS_ECR_ROLE_ARN`).
pub async fn get_credentials(
    version: ApiVersion,
    request: &CredentialProviderRequest,
    env: impl Fn(&str) -> Option<String>,
) -> Result<CredentialProviderResponse, PluginError> {
    let host = image_host(&request.image)?;
    let registry = registry_of(&request.image, &host)?;
    let region = match &registry {
        Registry::Private { region, .. } => Some(region.clone()),
        Registry::Public => Some(ECR_PUBLIC_REGION.to_string()),
    };
    let credentials = match role_arn(request, &env) {
        Some(arn) => {
            tracing::info!(role_arn = %arn, "assuming the role with the service-account token");
            Some(assume_role(region.clone(), &arn, &request.service_account_token).await?)
        }
        None => None,
    };
    let (token, expires_at) = match &registry {
        Registry::Private { .. } => {
            tracing::info!(image = %request.image, "getting credentials for a private ECR registry");
            let ecr = aws_sdk_ecr::Client::new(&sdk_config(region, credentials).await);
            let out = ecr
                .get_authorization_token()
                .send()
                .await
                .map_err(|e| PluginError::Aws {
                    call: "ecr:GetAuthorizationToken",
                    message: describe(&e),
                })?;
            let data = out
                .authorization_data
                .unwrap_or_default()
                .into_iter()
                .next()
                .ok_or_else(|| PluginError::Answer("authorization data was empty".into()))?;
            (data.authorization_token, data.expires_at)
        }
        Registry::Public => {
            tracing::info!(image = %request.image, "getting credentials for ECR Public");
            let ecr = aws_sdk_ecrpublic::Client::new(&sdk_config(region, credentials).await);
            let out = ecr
                .get_authorization_token()
                .send()
                .await
                .map_err(|e| PluginError::Aws {
                    call: "ecr-public:GetAuthorizationToken",
                    message: describe(&e),
                })?;
            let data = out
                .authorization_data
                .ok_or_else(|| PluginError::Answer("authorization data was empty".into()))?;
            (data.authorization_token, data.expires_at)
        }
    };
    let token = token.ok_or_else(|| PluginError::Answer("authorization token in response was nil".into()))?;
    let auth = decode_token(&token)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    Ok(CredentialProviderResponse {
        api_version: version.as_str(),
        kind: "CredentialProviderResponse",
        cache_key_type: "Registry",
        cache_duration: cache_duration(expires_at.map(|t| t.secs()), now),
        auth: BTreeMap::from([(host, auth)]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private(host: &str) -> Option<(String, bool)> {
        match registry_of("img", host) {
            Ok(Registry::Private { region, fips, .. }) => Some((region, fips)),
            _ => None,
        }
    }

    #[test]
    fn every_ecr_host_form_upstream_accepts() {
        for (host, region, fips) in [
            ("123456789012.dkr.ecr.us-west-2.amazonaws.com", "us-west-2", false),
            (
                "123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com",
                "us-gov-west-1",
                true,
            ),
            (
                "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn",
                "cn-north-1",
                false,
            ),
            (
                "123456789012.dkr.ecr.eusc-de-east-1.amazonaws.eu",
                "eusc-de-east-1",
                false,
            ),
            ("123456789012.dkr-ecr.us-east-1.on.aws", "us-east-1", false),
            (
                "123456789012.dkr-ecr.cn-northwest-1.on.amazonwebservices.com.cn",
                "cn-northwest-1",
                false,
            ),
            (
                "123456789012.dkr.ecr.us-iso-east-1.c2s.ic.gov",
                "us-iso-east-1",
                false,
            ),
            (
                "123456789012.dkr.ecr.us-isob-east-1.sc2s.sgov.gov",
                "us-isob-east-1",
                false,
            ),
            (
                "123456789012.dkr.ecr.eu-isoe-west-1.cloud.adc-e.uk",
                "eu-isoe-west-1",
                false,
            ),
            (
                "123456789012.dkr.ecr.us-isof-south-1.csp.hci.ic.gov",
                "us-isof-south-1",
                false,
            ),
        ] {
            assert_eq!(private(host), Some((region.to_string(), fips)), "{host}");
        }
        for host in ECR_PUBLIC_HOSTS {
            assert_eq!(registry_of("img", host).unwrap(), Registry::Public);
        }
        for host in [
            "docker.io",
            "registry.k8s.io",
            "12345678901.dkr.ecr.us-east-1.amazonaws.com", // 11 digits
            "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.example",
            "123456789012.dkr.ecr.us-east-1.example.com",
            "x123456789012.dkr.ecr.us-east-1.amazonaws.com",
            "123456789012.dkr.ecr..amazonaws.com",
            "public.ecr.aws.example",
        ] {
            let e = registry_of("img", host).unwrap_err().to_string();
            assert!(
                e.contains(host) && e.contains("not an Amazon ECR registry"),
                "{e}"
            );
        }
    }

    #[test]
    fn image_hosts_without_port_path_tag_or_digest() {
        for (image, host) in [
            (
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:1.0",
                "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            ),
            (
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/app@sha256:0123abcd",
                "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            ),
            ("public.ecr.aws/nginx/nginx:latest", "public.ecr.aws"),
            ("registry.example:5000/app", "registry.example"),
            (
                "https://123456789012.dkr.ecr.us-east-1.amazonaws.com/app",
                "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            ),
        ] {
            assert_eq!(image_host(image).unwrap(), host, "{image}");
        }
        let e = image_host("app:notaport").unwrap_err().to_string();
        assert!(e.contains("app:notaport"), "{e}");
    }

    #[test]
    fn requests_of_every_version_and_clear_errors() {
        for v in ["v1", "v1beta1", "v1alpha1"] {
            let input = format!(
                r#"{{"apiVersion":"{GROUP}/{v}","kind":"CredentialProviderRequest","image":"public.ecr.aws/x/y","extra":1}}"#
            );
            let (version, request) = parse_request(input.as_bytes()).unwrap();
            assert_eq!(version.as_str(), format!("{GROUP}/{v}"));
            assert_eq!(request.image, "public.ecr.aws/x/y");
        }
        let cases: [(&str, &str); 5] = [
            ("{not json", "not a valid CredentialProviderRequest"),
            (
                r#"{"apiVersion":"v1","kind":"CredentialProviderRequest","image":"a"}"#,
                r#"apiVersion "v1" is not supported"#,
            ),
            (
                r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v2","kind":"CredentialProviderRequest","image":"a"}"#,
                "credentialprovider.kubelet.k8s.io/v2",
            ),
            (
                r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"Pod","image":"a"}"#,
                r#"kind was "Pod""#,
            ),
            (
                r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest"}"#,
                "image in plugin request was empty",
            ),
        ];
        for (input, needle) in cases {
            let e = parse_request(input.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(needle), "{input}: {e}");
        }
    }

    #[test]
    fn cache_duration_is_half_the_remaining_life() {
        let now = 1_700_000_000;
        assert_eq!(
            cache_duration(Some(now + 12 * 3600), now).as_deref(),
            Some("6h0m0s")
        );
        assert_eq!(cache_duration(Some(now + 661), now).as_deref(), Some("5m30s"));
        assert_eq!(cache_duration(Some(now + 91), now).as_deref(), Some("45s"));
        assert_eq!(
            cache_duration(Some(now + 1), now),
            None,
            "half of 1 s is 0: not cached"
        );
        assert_eq!(cache_duration(Some(now - 3600), now), None, "expired: not cached");
        assert_eq!(cache_duration(None, now).as_deref(), Some("0s"));
        assert_eq!(cache_duration(Some(i64::MIN), i64::MAX), None);
    }

    #[test]
    fn tokens_and_role_arns() {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            decode_token(&b64("AWS:pass:with:colons")).unwrap(),
            AuthConfig {
                username: "AWS".into(),
                password: "pass:with:colons".into()
            }
        );
        assert!(decode_token(&b64("nocolon")).is_err());
        assert!(
            decode_token("%%%")
                .unwrap_err()
                .to_string()
                .contains("not base64")
        );

        let mut request = CredentialProviderRequest::default();
        let env = |k: &str| (k == ROLE_ARN_ENV).then(|| "arn:aws:iam::1:role/env".to_string());
        assert_eq!(role_arn(&request, env), None, "no token, no role");
        request.service_account_token = "jwt".into();
        assert_eq!(
            role_arn(&request, env).as_deref(),
            Some("arn:aws:iam::1:role/env")
        );
        request
            .service_account_annotations
            .insert(ROLE_ARN_ANNOTATION.into(), "arn:aws:iam::1:role/sa".into());
        assert_eq!(role_arn(&request, env).as_deref(), Some("arn:aws:iam::1:role/sa"));
        assert_eq!(
            role_arn(&request, |_| None).as_deref(),
            Some("arn:aws:iam::1:role/sa")
        );
    }

    #[test]
    fn response_json_as_the_kubelet_reads_it() {
        let response = CredentialProviderResponse {
            api_version: ApiVersion::V1beta1.as_str(),
            kind: "CredentialProviderResponse",
            cache_key_type: "Registry",
            cache_duration: None,
            auth: BTreeMap::from([(
                "public.ecr.aws".to_string(),
                AuthConfig {
                    username: "AWS".into(),
                    password: "p".into(),
                },
            )]),
        };
        assert_eq!(
            serde_json::to_string(&response).unwrap(),
            r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","auth":{"public.ecr.aws":{"username":"AWS","password":"p"}}}"#
        );
    }
}
