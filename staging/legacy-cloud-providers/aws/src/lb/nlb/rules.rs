//! An NLB's rules on the node security groups: clients, health checks and path-MTU
//! discovery (AWS-52), granted, revoked and handed over between NLBs.

use super::*;

/// Which of an NLB's node-group rules a reconciliation manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NlbRules {
    /// Client and health-check rules.
    ClientAndHealth,
    /// Client rules only: health-check rules are neither made nor revoked (upstream, when the
    /// client rule covers them).
    ClientOnly,
}

impl AwsCloud {
    /// Client and health-check rules of the NLB `name` on the target instances' groups
    /// (AWS-52), removed from the other groups of the cluster, and the path-MTU rules of each
    /// touched group recomputed as upstream does (one ICMP 3/4 rule, described
    /// `kubernetes.io/rule/nlb/mtu`, per CIDR of any NLB's client rule in that group).
    pub(crate) async fn sync_nlb_node_rules(
        &self,
        name: &str,
        ports: &[LbPort],
        client_cidrs: &[String],
        health_cidrs: &[String],
        h: &TgHealth,
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<()> {
        // The groups are read and changed under the lock (see `AwsCloud::nlb_rules`).
        let _shared_rules = self.nlb_rules.lock().await;
        let (client_d, health_d) = (format!("{RULE_CLIENT}{name}"), format!("{RULE_HEALTH}{name}"));
        let client_protocol = if ports.iter().any(|p| p.protocol == "UDP") {
            "udp"
        } else {
            "tcp"
        };
        let client_ports: BTreeSet<i32> = ports.iter().map(|p| p.node_port).collect();
        let health_ports: BTreeSet<i32> = match h.port.parse::<i32>() {
            Ok(p) => [p].into(),
            Err(_) => client_ports.clone(),
        };
        let mut rules = Vec::new();
        for port in &client_ports {
            for c in client_cidrs {
                rules.push(CidrRule {
                    protocol: client_protocol.into(),
                    from: *port,
                    to: *port,
                    cidr: c.clone(),
                    description: client_d.clone(),
                });
            }
        }
        // The health rules are a subset of the client rule when that admits everyone over TCP
        // on the same ports: then, as upstream, none is made, and health rules that exist (an
        // older provider made them) are left as they are.
        let covered =
            client_cidrs == ["0.0.0.0/0"] && client_protocol == "tcp" && health_ports == client_ports;
        if !covered {
            for port in &health_ports {
                for cidr in health_cidrs {
                    rules.push(CidrRule {
                        protocol: "tcp".into(),
                        from: *port,
                        to: *port,
                        cidr: cidr.clone(),
                        description: health_d.clone(),
                    });
                }
            }
        }
        let refs: Vec<&InstanceInfo> = instances.iter().map(|i| i.as_ref()).collect();
        let node_groups = self.node_security_groups(&refs).await?;
        let managed = if covered {
            NlbRules::ClientOnly
        } else {
            NlbRules::ClientAndHealth
        };
        for g in node_groups.values() {
            self.reconcile_nlb_rules(g, name, &rules, managed).await?;
        }
        for g in self.cluster_security_groups().await? {
            if !node_groups.contains_key(g.group_id().unwrap_or_default()) {
                self.reconcile_nlb_rules(&g, name, &[], NlbRules::ClientAndHealth)
                    .await?;
            }
        }
        Ok(())
    }

    /// Makes the rules of `group` described as the NLB `name`'s client (and, with
    /// [`NlbRules::ClientAndHealth`], health) rules exactly `wanted`, then the group's
    /// path-MTU rules match its client rules (any NLB's). A path-MTU rule in the form of
    /// earlier versions of this provider (`…/mtu=<name>`) is taken over and re-described,
    /// never doubled.
    pub(crate) async fn reconcile_nlb_rules(
        &self,
        group: &SecurityGroup,
        name: &str,
        wanted: &[CidrRule],
        managed: NlbRules,
    ) -> CloudResult<()> {
        let id = group.group_id().unwrap_or_default();
        let mut ours = vec![format!("{RULE_CLIENT}{name}")];
        if managed == NlbRules::ClientAndHealth {
            ours.push(format!("{RULE_HEALTH}{name}"));
        }
        let mut have = crate::lb::network::cidr_rules(group);
        let revoke: Vec<CidrRule> = have
            .iter()
            .filter(|r| ours.contains(&r.description) && !wanted.contains(r))
            .cloned()
            .collect();
        let grant: Vec<CidrRule> = wanted.iter().filter(|r| !have.contains(r)).cloned().collect();
        // Grant before revoke: a changed health check or source range never leaves a window
        // in which the nodes admit neither the old nor the new rule (a failed health check
        // takes every target out). Only a wanted rule that is an existing permission under
        // another description (EC2 keys rules by protocol, ports and source) waits for that
        // one's revocation.
        let key = |r: &CidrRule| (r.protocol.clone(), r.from, r.to, r.cidr.clone());
        let existing: BTreeSet<_> = have.iter().map(key).collect();
        let (after_revoke, first): (Vec<CidrRule>, Vec<CidrRule>) =
            grant.iter().cloned().partition(|r| existing.contains(&key(r)));
        self.grant_rules(id, &first).await?;
        self.revoke_rules(id, &revoke).await?;
        self.grant_rules(id, &after_revoke).await?;
        have.retain(|r| !revoke.contains(r));
        have.extend(grant);

        let client_cidrs: BTreeSet<&str> = have
            .iter()
            .filter(|r| r.description.starts_with(RULE_CLIENT))
            .map(|r| r.cidr.as_str())
            .collect();
        let mtu_have: Vec<&CidrRule> = have
            .iter()
            .filter(|r| r.description == RULE_MTU || r.description.starts_with(&format!("{RULE_MTU}=")))
            .collect();
        let mtu_rule = |cidr: &str| CidrRule {
            protocol: "icmp".into(),
            from: 3,
            to: 4,
            cidr: cidr.into(),
            description: RULE_MTU.into(),
        };
        let stale: Vec<CidrRule> = mtu_have
            .iter()
            .filter(|r| !client_cidrs.contains(r.cidr.as_str()))
            .map(|r| (*r).clone())
            .collect();
        let redescribe: Vec<CidrRule> = mtu_have
            .iter()
            .filter(|r| client_cidrs.contains(r.cidr.as_str()) && r.description != RULE_MTU)
            .map(|r| mtu_rule(&r.cidr))
            .collect();
        let missing: Vec<CidrRule> = client_cidrs
            .iter()
            .filter(|c| !mtu_have.iter().any(|r| r.cidr == **c))
            .map(|c| mtu_rule(c))
            .collect();
        self.revoke_rules(id, &stale).await?;
        self.grant_rules(id, &missing).await?;
        if !redescribe.is_empty() {
            self.api
                .call(
                    "update_security_group_rule_descriptions_ingress",
                    self.ec2
                        .update_security_group_rule_descriptions_ingress()
                        .group_id(id)
                        .set_ip_permissions(Some(redescribe.iter().map(CidrRule::to_permission).collect()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("re-describing path-MTU rules on {id}"), e))?;
        }
        Ok(())
    }

    /// Removes the client and health-check rules of the NLB `name` from every group of the VPC
    /// that has them, and the path-MTU rules no client rule needs any more — also in a group
    /// of the cluster where the NLB's rules are gone already (a deletion retried after its
    /// client rules were revoked must still remove the path-MTU rule they needed).
    pub(crate) async fn release_nlb_rules(&self, name: &str) -> CloudResult<()> {
        // The groups are read and changed under the lock (see `AwsCloud::nlb_rules`).
        let _shared_rules = self.nlb_rules.lock().await;
        let ours = [
            format!("{RULE_CLIENT}{name}"),
            format!("{RULE_HEALTH}{name}"),
            format!("{RULE_MTU}={name}"),
        ];
        for g in self.vpc_security_groups().await? {
            let rules = crate::lb::network::cidr_rules(&g);
            let mtu = |r: &CidrRule| {
                r.description == RULE_MTU || r.description.starts_with(&format!("{RULE_MTU}="))
            };
            // Only in the cluster's own groups: another cluster's rules are never touched.
            let ours_to_heal = self.tagged_for_cluster(&crate::lb::network::tags_of(&g));
            let stale_mtu = ours_to_heal
                && rules.iter().filter(|r| mtu(r)).any(|m| {
                    !rules
                        .iter()
                        .any(|r| r.description.starts_with(RULE_CLIENT) && r.cidr == m.cidr)
                });
            if stale_mtu || rules.iter().any(|r| ours.contains(&r.description)) {
                self.reconcile_nlb_rules(&g, name, &[], NlbRules::ClientAndHealth)
                    .await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn grant_rules(&self, group: &str, rules: &[CidrRule]) -> CloudResult<()> {
        self.authorize_ingress(group, rules.iter().map(CidrRule::to_permission).collect(), || {
            format!("authorizing ingress on {group}")
        })
        .await
    }

    pub(crate) async fn revoke_rules(&self, group: &str, rules: &[CidrRule]) -> CloudResult<()> {
        self.revoke_ingress(group, rules.iter().map(CidrRule::to_permission).collect(), || {
            format!("revoking ingress on {group}")
        })
        .await
    }
}
