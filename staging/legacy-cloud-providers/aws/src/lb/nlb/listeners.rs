//! An NLB's listeners: one per Service port, changed in place when they differ.

use super::*;

/// A listener as the Service wants it.
#[derive(Debug, Clone)]
pub(crate) struct WantedListener {
    pub(crate) port: i32,
    pub(crate) protocol: String,
    pub(crate) target_group: String,
    pub(crate) certificate: Option<String>,
    pub(crate) ssl_policy: Option<String>,
}

impl WantedListener {
    /// The listener's certificate (TLS listeners).
    pub(crate) fn certificate(&self) -> Certificate {
        Certificate::builder()
            .set_certificate_arn(self.certificate.clone())
            .build()
    }

    /// Whether `l` must be modified: another protocol or target group; for TLS another
    /// certificate or (when the Service names one) SSL policy; for TCP/UDP a certificate left
    /// over. (Upstream also compares the SSL policy when none is asked for, and so rewrites
    /// every TLS listener carrying AWS's default policy on every sync; an SSL policy reported on
    /// a TCP listener — moto does — is no reason to touch it either.)
    pub(crate) fn differs_from(&self, l: &Listener) -> bool {
        let protocol = l.protocol().map(|p| p.as_str()).unwrap_or_default();
        let target = l.default_actions().first().and_then(|a| a.target_group_arn());
        if !protocol.eq_ignore_ascii_case(&self.protocol) || target != Some(self.target_group.as_str()) {
            return true;
        }
        let certificate = l.certificates().first().and_then(|c| c.certificate_arn());
        if self.protocol == "TLS" {
            certificate != self.certificate.as_deref()
                || self
                    .ssl_policy
                    .as_deref()
                    .is_some_and(|p| l.ssl_policy() != Some(p))
        } else {
            certificate.is_some()
        }
    }
}

pub(crate) fn forward(tg_arn: &str) -> Action {
    Action::builder()
        .r#type(ActionTypeEnum::Forward)
        .target_group_arn(tg_arn)
        .build()
}

impl AwsCloud {
    /// The listeners of the NLB `arn` (paginated).
    pub(crate) async fn nlb_listeners(&self, name: &str, arn: &str) -> CloudResult<Vec<Listener>> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .api
                .call(
                    "elbv2_describe_listeners",
                    self.elbv2
                        .describe_listeners()
                        .load_balancer_arn(arn)
                        .set_marker(marker.take())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("listing listeners of {name}"), e))?;
            out.extend(page.listeners().iter().cloned());
            marker = page.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                return Ok(out);
            }
        }
    }

    pub(crate) async fn create_listener(
        &self,
        name: &str,
        lb_arn: &str,
        want: &WantedListener,
        resource_tags: &[(String, String)],
    ) -> CloudResult<()> {
        let mut req = self
            .elbv2
            .create_listener()
            .load_balancer_arn(lb_arn)
            .port(want.port)
            .protocol(ProtocolEnum::from(want.protocol.as_str()))
            .default_actions(forward(&want.target_group))
            .set_tags(Some(tags(resource_tags)));
        if want.protocol == "TLS" {
            req = req
                .certificates(want.certificate())
                .set_ssl_policy(want.ssl_policy.clone());
        }
        self.api
            .call("elbv2_create_listener", req.send())
            .await
            .map_err(|e| cloud_error(format!("creating listener {} on {name}", want.port), e))?;
        Ok(())
    }

    /// Changes a listener in place (`ModifyListener`: protocol, certificate, SSL policy, target
    /// group), so that a port switching between TCP and TLS never meets `DuplicateListener`
    /// and keeps its listener ARN.
    pub(crate) async fn modify_listener(
        &self,
        name: &str,
        l: &Listener,
        want: &WantedListener,
    ) -> CloudResult<()> {
        // Only what changes: the protocol is sent when it differs.
        let mut req = self
            .elbv2
            .modify_listener()
            .listener_arn(l.listener_arn().unwrap_or_default())
            .port(want.port)
            .default_actions(forward(&want.target_group));
        if !l
            .protocol()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case(&want.protocol))
        {
            req = req.protocol(ProtocolEnum::from(want.protocol.as_str()));
        }
        if want.protocol == "TLS" {
            req = req
                .certificates(want.certificate())
                .set_ssl_policy(want.ssl_policy.clone());
        }
        self.api
            .call("elbv2_modify_listener", req.send())
            .await
            .map_err(|e| cloud_error(format!("updating listener {} of {name}", want.port), e))?;
        tracing::info!(lb = name, port = want.port, protocol = %want.protocol, "updated NLB listener in place");
        Ok(())
    }
}
