//! One project with a private network, an external network behind a router, a server whose
//! Node is initialised, and the CCM configured with both networks.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use rcp_e2e::{
    TestCluster,
    ccm::CcmProcess,
    k8s::{ingress_ip, initialised, load_balancer_service, tainted_node, wait_for},
    openstack::{NEUTRON, Network, OpenStack, Project, start_ccm_with_env},
};

/// The bound of every wait on the shared cloud: generous, as three tests share one Octavia on two
/// cores in CI (a wait bound, not a timing target).
pub const T: Duration = Duration::from_secs(180);

/// One project with a private network (a server `node-0` on it, its Node initialised), an
/// external network behind a router, and the CCM configured with both.
pub struct Env {
    pub os: OpenStack,
    pub cluster: TestCluster,
    pub project: Project,
    pub public: Network,
    pub private: Network,
    pub client: kube::Client,
    pub services: Api<Service>,
    pub ccm: CcmProcess,
    /// The private network's IPv6 subnet (`fd00:2::/64`), with [`Setup::dual_stack`].
    pub private_v6_subnet: Option<String>,
    /// The external network's second subnet (`172.24.9.0/24`), when the config names it.
    pub public_second_subnet: Option<String>,
    /// The barbican secret (a PKCS#12 certificate) the config names, when it names one.
    pub tls_secret: Option<String>,
}

/// What an [`Env`] is made with beyond the defaults.
#[derive(Default)]
pub struct Setup<'a> {
    /// Extra CCM flags; with `--dry-run` the Node is not waited for (it stays tainted).
    pub ccm_flags: &'a [&'a str],
    /// Lines added to the config's `[LoadBalancer]` (and sections after it);
    /// `${SECOND_FLOATING_SUBNET}` in them stands for a second subnet of the external network
    /// (172.24.9.0/24), made for them; `${TLS_SECRET}` for the reference of a certificate
    /// stored in barbican by the project's user ([`Env::tls_secret`]).
    pub load_balancer_lines: &'a str,
    /// A dual-stack cluster, and an IPv6 subnet on the private network before `node-0` boots
    /// (its server then has an address of each family).
    pub dual_stack: bool,
    /// A config without `subnet-id` and `floating-network-id`: the CCM detects them (OCCM).
    pub detect_networks: bool,
    /// Environment variables for the CCM.
    pub ccm_env: &'a [(&'a str, &'a str)],
}

pub async fn env(test: &str) -> Result<Env> {
    env_with(test, &[]).await
}

/// Like [`env`], with these extra CCM flags; with `--dry-run` the Node is not waited for (it
/// stays tainted).
pub async fn env_with(test: &str, extra: &[&str]) -> Result<Env> {
    env_full(
        test,
        Setup {
            ccm_flags: extra,
            ..Default::default()
        },
    )
    .await
}

/// An [`Env`] made as `setup` says.
pub async fn env_full(test: &str, setup: Setup<'_>) -> Result<Env> {
    let Setup {
        ccm_flags: extra,
        load_balancer_lines,
        dual_stack,
        detect_networks,
        ccm_env,
    } = setup;
    let os = OpenStack::shared().await?;
    // The API server starts while the cloud is made (each takes seconds).
    let cluster = async {
        if dual_stack {
            TestCluster::start_dual_stack().await
        } else {
            TestCluster::start().await
        }
    };
    let cloud = async {
        let project = os.project(test).await?;
        let private = project.network("private", "10.2.0.0/24").await?;
        let private_v6_subnet = if dual_stack {
            let v6 = project
                .session
                .post(
                    &format!("{NEUTRON}/subnets"),
                    serde_json::json!({"subnet": {"name": "private-v6", "network_id": private.id, "ip_version": 6,
                           "cidr": "fd00:2::/64"}}),
                )
                .await?;
            Some(v6["subnet"]["id"].as_str().context("subnet id")?.to_string())
        } else {
            None
        };
        // The external side while the server boots.
        let edge = async {
            let public = project.external_network("public", "172.24.4.0/24").await?;
            project.router("edge", &public, &private).await?;
            // A second subnet of the external network, for configs that name it.
            let second = if load_balancer_lines.contains("${SECOND_FLOATING_SUBNET}") {
                let second = project
                    .admin
                    .post(
                        &format!("{NEUTRON}/subnets"),
                        serde_json::json!({"subnet": {"name": "public-second", "network_id": public.id, "ip_version": 4,
                               "cidr": "172.24.9.0/24", "project_id": project.id}}),
                    )
                    .await?;
                Some(second["subnet"]["id"].as_str().context("subnet id")?.to_string())
            } else {
                None
            };
            anyhow::Ok((public, second))
        };
        let ((public, public_second_subnet), _) = tokio::try_join!(edge, project.server("node-0", &private))?;
        anyhow::Ok((project, private, private_v6_subnet, public, public_second_subnet))
    };
    let (cluster, (project, private, private_v6_subnet, public, public_second_subnet)) =
        tokio::try_join!(cluster, cloud)?;
    let mut load_balancer_lines = match &public_second_subnet {
        Some(id) => load_balancer_lines.replace("${SECOND_FLOATING_SUBNET}", id),
        None => load_balancer_lines.to_string(),
    };
    // A certificate in barbican, for configs that name one.
    let tls_secret = if load_balancer_lines.contains("${TLS_SECRET}") {
        let reference = project.tls_secret("config.example").await?;
        load_balancer_lines = load_balancer_lines.replace("${TLS_SECRET}", &reference);
        Some(reference)
    } else {
        None
    };
    let networks = if detect_networks {
        String::new()
    } else {
        format!(
            "subnet-id = {}\nfloating-network-id = {}\n",
            private.subnet_id, public.id
        )
    };
    let config = format!(
        "{}[LoadBalancer]\n{networks}{load_balancer_lines}",
        project.global_section(),
    );
    let ccm = start_ccm_with_env(&cluster, &config, &format!("ccm-{test}"), extra, ccm_env)?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node("node-0"))
        .await?;
    if !extra.contains(&"--dry-run") {
        wait_for("node-0 initialised", T, || initialised(&nodes, "node-0")).await?;
    }
    Ok(Env {
        os,
        cluster,
        project,
        public,
        private,
        services: Api::namespaced(client.clone(), "default"),
        client,
        ccm,
        private_v6_subnet,
        public_second_subnet,
        tls_secret,
    })
}

impl Env {
    /// Creates the Service `name` (port 80), with `spec.loadBalancerIP` when given.
    pub async fn service(&self, name: &str, load_balancer_ip: Option<&str>) -> Result<()> {
        let mut svc = load_balancer_service(name, &[], &[(80, "http")]);
        if let Some(ip) = load_balancer_ip {
            svc.spec.as_mut().context("spec")?.load_balancer_ip = Some(ip.to_string());
        }
        self.services.create(&PostParams::default(), &svc).await?;
        Ok(())
    }

    /// Waits for the Service's address in its status.
    pub async fn ingress(&self, name: &str) -> Result<String> {
        let address = wait_for(&format!("{name}'s ingress"), T, || async {
            ingress_ip(&self.services.get(name).await.ok()?)
        })
        .await;
        if address.is_err() {
            eprintln!("{}", self.octavia_state().await);
            eprintln!("{}", self.ccm.log());
        }
        address
    }

    /// For a failing test's output: the project's load balancers with their states, and what
    /// Octavia logged of them (and its warnings and errors).
    pub async fn octavia_state(&self) -> String {
        let lbs = match self.project.octavia_list("loadbalancers", "loadbalancers").await {
            Ok(lbs) => lbs,
            Err(e) => return format!("(the project's load balancers could not be listed: {e:#})"),
        };
        let mut ids = Vec::new();
        let mut out = String::from("the project's load balancers:\n");
        for lb in &lbs {
            let id = lb["id"].as_str().unwrap_or_default().to_string();
            out.push_str(&format!(
                "  {id} {} provisioning={} operating={}\n",
                lb["name"], lb["provisioning_status"], lb["operating_status"]
            ));
            ids.push(id);
        }
        out + &self.os.octavia_log_excerpt(&ids, 80)
    }

    /// The Service's Octavia load balancer (exactly one).
    pub async fn load_balancer(&self, name: &str) -> Result<serde_json::Value> {
        let lbs = self
            .project
            .load_balancers(&format!("kube_service_kubernetes_default_{name}"))
            .await?;
        anyhow::ensure!(lbs.len() == 1, "{name}: {lbs:?}");
        Ok(lbs[0].clone())
    }

    /// Deletes the Service and waits until it is gone (finalizer removed) and Octavia has no
    /// load balancer of it.
    pub async fn delete_service(&self, name: &str) -> Result<()> {
        self.services.delete(name, &DeleteParams::default()).await?;
        let lb_name = format!("kube_service_kubernetes_default_{name}");
        let gone = wait_for(&format!("{name} and its load balancer gone"), T, || async {
            let svc = self.services.get_opt(name).await.ok()?;
            let lbs = self.project.load_balancers(&lb_name).await.ok()?;
            (svc.is_none() && lbs.is_empty()).then_some(())
        })
        .await;
        if gone.is_err() {
            // Where it stalled: Octavia's states and log first, then the CCM's.
            eprintln!("{}", self.octavia_state().await);
            eprintln!("{}", self.ccm.log());
        }
        gone
    }

    /// The floating IP `id` as neutron has it.
    pub async fn floating_ip(&self, id: &str) -> Result<serde_json::Value> {
        Ok(self
            .project
            .session
            .get(&format!("{NEUTRON}/floatingips/{id}"))
            .await?["floatingip"]
            .clone())
    }
}

/// The number of Events of `reason` about the Service `name` (a repeat raises an Event's count).
pub async fn event_count(client: &kube::Client, name: &str, reason: &str) -> Result<i32> {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason))
        .map(|e| e.count.unwrap_or(1))
        .sum())
}

impl Env {
    /// Makes the CCM sync the Service again (an annotation changes) and waits until that sync
    /// ensured its load balancer (one more `EnsuredLoadBalancer`).
    pub async fn sync_again(&self, name: &str) -> Result<()> {
        let before = wait_for(&format!("{name} ensured"), T, || async {
            let n = event_count(&self.client, name, "EnsuredLoadBalancer")
                .await
                .ok()?;
            (n > 0).then_some(n)
        })
        .await?;
        self.services
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"test.example/sync": before.to_string()}}})),
            )
            .await?;
        wait_for(&format!("{name} ensured again"), T, || async {
            let n = event_count(&self.client, name, "EnsuredLoadBalancer")
                .await
                .ok()?;
            (n > before).then_some(())
        })
        .await
        .inspect_err(|_| eprintln!("{}", self.ccm.log()))
    }

    /// The node port of the Service's first port.
    pub async fn node_port(&self, name: &str) -> Result<i32> {
        self.services
            .get(name)
            .await?
            .spec
            .context("spec")?
            .ports
            .context("ports")?[0]
            .node_port
            .context("node port")
    }
}

/// What Octavia has of a load balancer.
pub struct OctaviaObjects {
    /// Its listeners.
    pub listeners: Vec<serde_json::Value>,
    /// Its pools.
    pub pools: Vec<serde_json::Value>,
    /// The members of its first pool.
    pub members: Vec<serde_json::Value>,
    /// The project's health monitors.
    pub monitors: Vec<serde_json::Value>,
}

impl Env {
    /// The load balancer `lb_id`'s listeners, pools, first pool's members, and the project's
    /// health monitors.
    pub async fn octavia_objects(&self, lb_id: &str) -> Result<OctaviaObjects> {
        let p = &self.project;
        let listeners = p
            .octavia_list(&format!("listeners?loadbalancer_id={lb_id}"), "listeners")
            .await?;
        let pools = p
            .octavia_list(&format!("pools?loadbalancer_id={lb_id}"), "pools")
            .await?;
        let members = match pools.first().and_then(|p| p["id"].as_str()) {
            Some(pool) => {
                p.octavia_list(&format!("pools/{pool}/members"), "members")
                    .await?
            }
            None => Vec::new(),
        };
        let monitors = p.octavia_list("healthmonitors", "healthmonitors").await?;
        Ok(OctaviaObjects {
            listeners,
            pools,
            members,
            monitors,
        })
    }
}

impl Env {
    /// A floating IP the user made (not for a Service): its ID and address.
    pub async fn users_own_floating_ip(&self) -> Result<(String, String)> {
        let f = self
            .project
            .session
            .post(
                &format!("{NEUTRON}/floatingips"),
                serde_json::json!({"floatingip": {"floating_network_id": self.public.id, "description": "the user's own"}}),
            )
            .await?;
        Ok((
            f["floatingip"]["id"].as_str().context("id")?.to_string(),
            f["floatingip"]["floating_ip_address"]
                .as_str()
                .context("address")?
                .to_string(),
        ))
    }

    /// Whether the project has the floating IP `address`.
    pub async fn has_floating_ip(&self, address: &str) -> Result<bool> {
        Ok(self
            .project
            .floating_ips()
            .await?
            .iter()
            .any(|f| f["floating_ip_address"] == address))
    }
}
