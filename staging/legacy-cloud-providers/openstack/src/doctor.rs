//! The OpenStack checks of `cloud-controller-manager-openstack doctor` (not part of OCCM):
//! keystone authentication, the catalog (an endpoint of the configured interface and region for
//! nova, neutron and — with load balancers on — Octavia, each read once), what the cloud config
//! names (the load balancers' subnets and networks, the floating network, the router), the
//! project's floating-IP and load-balancer quotas, and every Node's server. Nothing is created,
//! changed or deleted: every request is a `GET` (and keystone's token request).

use k8s_cloud_provider::{
    doctor::Check,
    node::helpers::{node_name, provider_id},
};
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::{
    OpenStackCloud,
    client::{ClientError, Service},
};

/// The fix to print for a failed request.
fn fix(e: &ClientError) -> &'static str {
    match e {
        ClientError::NoEndpoint { .. } => "fix: the catalog, [Global] region or os-endpoint-type",
        ClientError::Http { status, .. } if status.as_u16() == 403 => {
            "fix: the roles of the CCM's user in the project (member, load-balancer_member)"
        }
        ClientError::Http { status, .. } if status.as_u16() == 404 => "fix: the ID in --cloud-config",
        _ => "fix: the endpoint's reachability from where the CCM runs",
    }
}

/// `used` of `limit`: a warning when it is reached (new ones would be refused).
fn quota(name: &str, used: i64, limit: i64) -> Check {
    let name = format!("quota: {name}");
    if limit < 0 {
        Check::pass(name, format!("{used} used, no limit"))
    } else if used >= limit {
        Check::warn(
            name,
            format!("{used} of {limit} used: a new one would be refused (fix: raise the project's quota)"),
        )
    } else {
        Check::pass(name, format!("{used} of {limit} used"))
    }
}

impl OpenStackCloud {
    /// One `GET`: a passing check saying `ok`, or a failing one with the error and a fix.
    async fn read_check(
        &self,
        name: &str,
        service: Service,
        path: &str,
        ok: impl FnOnce(&Value) -> String,
    ) -> Check {
        match self.client.get(service, path).await {
            Ok(v) => Check::pass(name, ok(&v)),
            Err(e) => Check::fail(name, format!("GET {path}: {e} ({})", fix(&e))),
        }
    }

    /// Runs the OpenStack checks for a cluster whose Nodes are `nodes`.
    pub async fn doctor(&self, nodes: &[Node]) -> Vec<Check> {
        let c = &self.config;
        let mut checks = Vec::new();
        match self.client.check().await {
            Ok(()) => checks.push(Check::pass(
                "keystone",
                format!(
                    "authenticated at {}{}; {} endpoints",
                    c.global.auth.auth_url,
                    if c.global.region.is_empty() {
                        String::new()
                    } else {
                        format!(", region {}", c.global.region)
                    },
                    c.global.interface
                ),
            )),
            Err(e) => {
                let fix = if matches!(e, ClientError::NoEndpoint { .. }) {
                    fix(&e)
                } else if e.to_string().to_ascii_lowercase().contains("certificate") {
                    "fix: [Global] ca-file (the CA that signed keystone's certificate), cert-file and key-file (when keystone asks for a client certificate)"
                } else {
                    "fix: the [Global] credentials, auth-url and region"
                };
                checks.push(Check::fail("keystone", format!("{e} ({fix})")));
                return checks;
            }
        }
        let count = |key: &'static str| {
            move |v: &Value| {
                format!(
                    "endpoint answers ({} {key} on the first page)",
                    v[key].as_array().map_or(0, Vec::len)
                )
            }
        };
        checks.push(
            self.read_check(
                "nova",
                Service::Compute,
                "/servers/detail?limit=1",
                count("servers"),
            )
            .await,
        );
        checks.push(
            self.read_check(
                "neutron",
                Service::Network,
                "/networks?limit=1",
                count("networks"),
            )
            .await,
        );
        let lb = &c.load_balancer;
        if lb.enabled {
            checks.push(
                self.read_check(
                    "octavia",
                    Service::LoadBalancer,
                    "/v2/lbaas/loadbalancers?limit=1",
                    count("loadbalancers"),
                )
                .await,
            );
            for (key, id, path) in [
                ("[LoadBalancer] subnet-id", &lb.subnet_id, "subnets"),
                ("[LoadBalancer] member-subnet-id", &lb.member_subnet_id, "subnets"),
                ("[LoadBalancer] network-id", &lb.network_id, "networks"),
                (
                    "[LoadBalancer] floating-subnet-id",
                    &lb.floating_subnet_id,
                    "subnets",
                ),
            ] {
                if !id.is_empty() {
                    let what = path.trim_end_matches('s');
                    checks.push(
                        self.read_check(key, Service::Network, &format!("/{path}/{id}"), |v| {
                            format!("{what} {id} ({})", v[what]["name"].as_str().unwrap_or_default())
                        })
                        .await,
                    );
                }
            }
            // The default certificate: barbican has it and lets these credentials read it.
            if lb.container_store == crate::config::ContainerStore::Barbican
                && let Ok(reference) = crate::loadbalancer::tls::barbican_reference(&lb.tls_container_ref)
            {
                checks.push(
                    self.read_check(
                        "[LoadBalancer] default-tls-container-ref",
                        Service::KeyManager,
                        &reference.path(),
                        |v| {
                            format!(
                                "barbican has it ({}, {})",
                                v["name"].as_str().unwrap_or_default(),
                                v["status"].as_str().unwrap_or_default()
                            )
                        },
                    )
                    .await,
                );
            }
            if !lb.floating_network_id.is_empty() {
                let path = format!("/networks/{}", lb.floating_network_id);
                checks.push(match self.client.get(Service::Network, &path).await {
                    Ok(v) if v["network"]["router:external"] == Value::Bool(true) => Check::pass(
                        "[LoadBalancer] floating-network-id",
                        format!("external network {}", v["network"]["name"].as_str().unwrap_or_default()),
                    ),
                    Ok(_) => Check::fail(
                        "[LoadBalancer] floating-network-id",
                        format!(
                            "network {} is not external: no floating IP comes from it (fix: name an external network)",
                            lb.floating_network_id
                        ),
                    ),
                    Err(e) => Check::fail(
                        "[LoadBalancer] floating-network-id",
                        format!("GET {path}: {e} ({})", fix(&e)),
                    ),
                });
            }
        }
        if !c.route.router_id.is_empty() {
            let id = &c.route.router_id;
            checks.push(
                self.read_check(
                    "[Route] router-id",
                    Service::Network,
                    &format!("/routers/{id}"),
                    |v| {
                        format!(
                            "router {id} ({}), {} routes",
                            v["router"]["name"].as_str().unwrap_or_default(),
                            v["router"]["routes"].as_array().map_or(0, Vec::len)
                        )
                    },
                )
                .await,
            );
        }
        match self.client.project_id().await {
            Ok(Some(project)) => {
                if let Ok(v) = self
                    .client
                    .get(Service::Network, &format!("/quotas/{project}/details"))
                    .await
                {
                    let q = &v["quota"]["floatingip"];
                    if let (Some(used), Some(limit)) = (q["used"].as_i64(), q["limit"].as_i64()) {
                        checks.push(quota("floating IPs", used, limit));
                    }
                }
                if lb.enabled
                    && let Ok(v) = self
                        .client
                        .get(Service::LoadBalancer, &format!("/v2/lbaas/quotas/{project}"))
                        .await
                    && let Some(limit) = v["quota"]["load_balancer"].as_i64()
                {
                    let used = self
                        .client
                        .list::<Value>(
                            Service::LoadBalancer,
                            &format!("/v2/lbaas/loadbalancers?project_id={project}"),
                            "loadbalancers",
                        )
                        .await
                        .map_or(0, |l| l.len() as i64);
                    checks.push(quota("load balancers", used, limit));
                }
            }
            Ok(None) => checks.push(Check::warn(
                "quotas",
                "the token is not scoped to a project: quotas not read",
            )),
            Err(e) => checks.push(Check::warn("quotas", format!("not read: {e}"))),
        }
        for node in nodes {
            let name = node_name(node);
            checks.push(match self.server_for_node(node).await {
                Ok(Some(s)) => Check::pass(
                    format!("node {name}"),
                    format!("server {} ({}), {}", s.name, s.id, s.status),
                ),
                Ok(None) => Check::fail(
                    format!("node {name}"),
                    format!(
                        "no server {} in this project and region: the node lifecycle controller would delete this Node (fix: the Node's name or spec.providerID {:?}, or [Global] region)",
                        if provider_id(node).is_empty() { "of that name" } else { "with that ID" },
                        provider_id(node)
                    ),
                ),
                Err(e) => Check::fail(format!("node {name}"), e.to_string()),
            });
        }
        checks
    }
}
