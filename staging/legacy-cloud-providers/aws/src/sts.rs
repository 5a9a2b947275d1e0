//! `[Global] RoleARN`: credentials of the assumed role, from `AssumeRole` calls that carry
//! upstream's confused-deputy headers — `x-amz-source-account` (the role ARN's account, always)
//! and `x-amz-source-arn` (`[Global] SourceARN`, when set). The SDK clients cache the
//! credentials and ask again before they expire.

use aws_credential_types::{
    Credentials,
    provider::{self, ProvideCredentials, error::CredentialsError},
};
use aws_smithy_runtime_api::{
    box_error::BoxError,
    client::{
        interceptors::{Intercept, context::BeforeTransmitInterceptorContextMut},
        runtime_components::RuntimeComponents,
    },
};
use aws_smithy_types::config_bag::ConfigBag;

/// Header with the account of the role ARN.
pub const HEADER_SOURCE_ACCOUNT: &str = "x-amz-source-account";
/// Header with `[Global] SourceARN`.
pub const HEADER_SOURCE_ARN: &str = "x-amz-source-arn";

/// The account of an ARN (`arn:<partition>:<service>:<region>:<account>:<resource>`).
pub fn account_of(arn: &str) -> Result<&str, String> {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    match parts.as_slice() {
        ["arn", partition, service, _region, account, resource]
            if !partition.is_empty() && !service.is_empty() && !resource.is_empty() =>
        {
            Ok(account)
        }
        _ => Err(format!(
            "[Global] RoleARN {arn:?} is not an ARN (arn:partition:service:region:account:resource)"
        )),
    }
}

/// Adds the source headers to every request of the STS client.
#[derive(Debug, Clone)]
struct SourceHeaders {
    account: String,
    source_arn: String,
}

impl Intercept for SourceHeaders {
    fn name(&self) -> &'static str {
        "k8s-aws-sts-source-headers"
    }

    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let headers = context.request_mut().headers_mut();
        headers.insert(HEADER_SOURCE_ACCOUNT, self.account.clone());
        if !self.source_arn.is_empty() {
            headers.insert(HEADER_SOURCE_ARN, self.source_arn.clone());
        }
        Ok(())
    }
}

/// The assumed role's credentials.
#[derive(Debug, Clone)]
pub struct AssumeRoleWithSource {
    client: aws_sdk_sts::Client,
    role_arn: String,
}

impl AssumeRoleWithSource {
    /// An STS client from `sdk` (its endpoint: the STS override, if any) that adds the source
    /// headers; fails on a role ARN that is not an ARN.
    pub fn new(sdk: &aws_config::SdkConfig, role_arn: &str, source_arn: &str) -> Result<Self, String> {
        let account = account_of(role_arn)?.to_string();
        let conf = aws_sdk_sts::config::Builder::from(sdk)
            .interceptor(SourceHeaders {
                account,
                source_arn: source_arn.to_string(),
            })
            .build();
        Ok(Self {
            client: aws_sdk_sts::Client::from_conf(conf),
            role_arn: role_arn.to_string(),
        })
    }

    async fn assume(&self) -> provider::Result {
        let out = self
            .client
            .assume_role()
            .role_arn(&self.role_arn)
            .role_session_name("cloud-controller-manager")
            .send()
            .await
            .map_err(|e| {
                CredentialsError::provider_error(format!(
                    "assuming role {}: {}",
                    self.role_arn,
                    aws_smithy_types::error::display::DisplayErrorContext(&e)
                ))
            })?;
        let c = out
            .credentials()
            .ok_or_else(|| CredentialsError::provider_error("AssumeRole returned no credentials"))?;
        let expiry = std::time::SystemTime::try_from(*c.expiration()).ok();
        Ok(Credentials::new(
            c.access_key_id(),
            c.secret_access_key(),
            Some(c.session_token().to_string()),
            expiry,
            "AssumeRoleWithSource",
        ))
    }
}

impl ProvideCredentials for AssumeRoleWithSource {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        provider::future::ProvideCredentials::new(self.assume())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_comes_from_the_role_arn() {
        assert_eq!(
            account_of("arn:aws:iam::123456789012:role/ccm").unwrap(),
            "123456789012"
        );
        assert_eq!(
            account_of("arn:aws-cn:iam::210987654321:role/path/ccm").unwrap(),
            "210987654321"
        );
        let e = account_of("role/ccm").unwrap_err();
        assert!(e.contains("RoleARN") && e.contains("role/ccm"), "{e}");
    }
}
