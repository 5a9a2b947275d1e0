//! A Classic ELB's attributes (idle timeout, connection draining, cross-zone, access
//! logs) and policies (proxy protocol, SSL negotiation).

use super::*;

/// Whether the access-log settings match: enabled or not, and when enabled also the bucket,
/// the prefix and the emit interval (a changed bucket is applied, not ignored).
pub(crate) fn same_access_log(have: Option<&AccessLog>, want: Option<&AccessLog>) -> bool {
    let key = |a: Option<&AccessLog>| {
        a.map(|a| {
            if a.enabled() {
                (
                    true,
                    a.s3_bucket_name().unwrap_or_default().to_string(),
                    a.s3_bucket_prefix().unwrap_or_default().to_string(),
                    a.emit_interval().unwrap_or(60),
                )
            } else {
                (false, String::new(), String::new(), 0)
            }
        })
    };
    key(have) == key(want)
}

impl AwsCloud {
    pub(crate) async fn sync_classic_attributes(&self, name: &str, opts: &LbOptions) -> CloudResult<()> {
        let want = LoadBalancerAttributes::builder()
            .cross_zone_load_balancing(
                CrossZoneLoadBalancing::builder()
                    .enabled(opts.cross_zone.unwrap_or(false))
                    .build(),
            )
            .access_log({
                let mut a = AccessLog::builder().enabled(opts.access_log_enabled.unwrap_or(false));
                if opts.access_log_enabled == Some(true) {
                    a = a
                        .set_s3_bucket_name(opts.access_log_bucket.clone())
                        .set_s3_bucket_prefix(opts.access_log_prefix.clone())
                        .set_emit_interval(opts.access_log_emit_interval);
                }
                a.build()
            })
            .connection_draining({
                let mut d = ConnectionDraining::builder().enabled(opts.draining_enabled.unwrap_or(false));
                if let Some(t) = opts.draining_timeout {
                    d = d.timeout(t);
                }
                d.build()
            })
            .connection_settings(
                ConnectionSettings::builder()
                    .idle_timeout(opts.idle_timeout.unwrap_or(60))
                    .build()
                    .map_err(|e| CloudError::msg(e.to_string()))?,
            )
            .build();
        let current = self
            .api
            .call(
                "elb_describe_attributes",
                self.elb
                    .describe_load_balancer_attributes()
                    .load_balancer_name(name)
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("reading attributes of {name}"), e))?;
        let same = current.load_balancer_attributes().is_some_and(|c| {
            c.cross_zone_load_balancing().map(|x| x.enabled())
                == want.cross_zone_load_balancing().map(|x| x.enabled())
                && same_access_log(c.access_log(), want.access_log())
                && c.connection_draining().map(|x| {
                    (
                        x.enabled(),
                        x.timeout().filter(|_| opts.draining_timeout.is_some()),
                    )
                }) == want.connection_draining().map(|x| (x.enabled(), x.timeout()))
                && c.connection_settings().map(|x| x.idle_timeout())
                    == want.connection_settings().map(|x| x.idle_timeout())
        });
        if !same {
            self.api
                .call(
                    "elb_modify_attributes",
                    self.elb
                        .modify_load_balancer_attributes()
                        .load_balancer_name(name)
                        .load_balancer_attributes(want)
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("setting attributes of {name}"), e))?;
        }
        Ok(())
    }

    pub(crate) async fn sync_classic_policies(
        &self,
        name: &str,
        opts: &LbOptions,
        listeners: &[ListenerSpec],
        lb: Option<&LoadBalancerDescription>,
    ) -> CloudResult<()> {
        // What the ELB has now (nothing for one just made): policies are set only where they
        // differ, not on every sync.
        let backend_now = |port: i32| -> Option<Vec<String>> {
            let lb = lb?;
            Some(
                lb.backend_server_descriptions()
                    .iter()
                    .find(|b| b.instance_port() == Some(port))
                    .map(|b| b.policy_names().to_vec())
                    .unwrap_or_default(),
            )
        };
        let listener_now = |port: i32| -> Option<Vec<String>> {
            let lb = lb?;
            lb.listener_descriptions()
                .iter()
                .find(|d| d.listener().is_some_and(|l| l.load_balancer_port() == port))
                .map(|d| d.policy_names().to_vec())
        };
        let existing = self
            .api
            .call(
                "elb_describe_policies",
                self.elb
                    .describe_load_balancer_policies()
                    .load_balancer_name(name)
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("reading policies of {name}"), e))?;
        let names: BTreeSet<String> = existing
            .policy_descriptions()
            .iter()
            .filter_map(|p| p.policy_name().map(str::to_string))
            .collect();
        let backend_ports: BTreeSet<i32> = listeners.iter().map(|l| l.instance_port).collect();
        if opts.proxy_protocol && !names.contains(PROXY_PROTOCOL_POLICY) {
            self.create_policy(
                name,
                PROXY_PROTOCOL_POLICY,
                "ProxyProtocolPolicyType",
                "ProxyProtocol",
                "true",
            )
            .await?;
        }
        for port in &backend_ports {
            let policies: Vec<String> = if opts.proxy_protocol {
                vec![PROXY_PROTOCOL_POLICY.into()]
            } else {
                Vec::new()
            };
            if !opts.proxy_protocol && !names.contains(PROXY_PROTOCOL_POLICY) {
                continue;
            }
            if backend_now(*port).is_some_and(|now| now == policies) {
                continue;
            }
            self.api
                .call(
                    "elb_set_backend_policies",
                    self.elb
                        .set_load_balancer_policies_for_backend_server()
                        .load_balancer_name(name)
                        .instance_port(*port)
                        .set_policy_names(Some(policies))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("setting backend policies of {name}:{port}"), e))?;
        }
        if let Some(reference) = &opts.ssl_negotiation_policy {
            let policy = format!("{SSL_POLICY_PREFIX}{reference}");
            if !names.contains(&policy) {
                self.create_policy(
                    name,
                    &policy,
                    "SSLNegotiationPolicyType",
                    "Reference-Security-Policy",
                    reference,
                )
                .await?;
            }
            for l in listeners
                .iter()
                .filter(|l| l.protocol == "SSL" || l.protocol == "HTTPS")
                .filter(|l| !listener_now(l.port).is_some_and(|now| now.contains(&policy)))
            {
                self.api
                    .call(
                        "elb_set_listener_policies",
                        self.elb
                            .set_load_balancer_policies_of_listener()
                            .load_balancer_name(name)
                            .load_balancer_port(l.port)
                            .policy_names(&policy)
                            .send(),
                    )
                    .await
                    .map_err(|e| cloud_error(format!("setting the SSL policy of {name}:{}", l.port), e))?;
            }
        }
        Ok(())
    }

    pub(crate) async fn create_policy(
        &self,
        lb: &str,
        policy: &str,
        type_: &str,
        attr: &str,
        value: &str,
    ) -> CloudResult<()> {
        self.api
            .call(
                "elb_create_policy",
                self.elb
                    .create_load_balancer_policy()
                    .load_balancer_name(lb)
                    .policy_name(policy)
                    .policy_type_name(type_)
                    .policy_attributes(
                        PolicyAttribute::builder()
                            .attribute_name(attr)
                            .attribute_value(value)
                            .build(),
                    )
                    .send(),
            )
            .await
            .map(|_| ())
            .or_else(|e| {
                if e.is("DuplicatePolicyName") {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| cloud_error(format!("creating policy {policy} on {lb}"), e))
    }
}
