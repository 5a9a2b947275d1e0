//! Octavia load balancers of `cloud-controller-manager-openstack` in the states and with the
//! floating IPs of a real cloud (`hack/openstack.sh`): a load balancer in `ERROR` (forced in
//! Octavia's database: the no-op drivers never fail), a user's own floating IP chosen through
//! `spec.loadBalancerIP`, and a floating IP made with the address the Service asks for.

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
    k8s::{
        events_for, ingress_ip, initialised, load_balancer_service, tainted_node, wait_for, wait_for_event,
    },
    openstack::{NEUTRON, Network, OCTAVIA, OpenStack, Project, start_ccm},
};
use serde_json::json;

const T: Duration = Duration::from_secs(90);

/// One project with a private network (a server `node-0` on it, its Node initialised), an
/// external network behind a router, and the CCM configured with both.
struct Env {
    os: OpenStack,
    cluster: TestCluster,
    project: Project,
    public: Network,
    private: Network,
    client: kube::Client,
    services: Api<Service>,
    ccm: CcmProcess,
}

async fn env(test: &str) -> Result<Env> {
    env_with(test, &[]).await
}

/// Like [`env`], with these extra CCM flags; with `--dry-run` the Node is not waited for (it
/// stays tainted).
async fn env_with(test: &str, extra: &[&str]) -> Result<Env> {
    let os = OpenStack::shared().await?;
    let cluster = TestCluster::start().await?;
    let project = os.project(test).await?;
    let private = project.network("private", "10.2.0.0/24").await?;
    let public = project.external_network("public", "172.24.4.0/24").await?;
    project.router("edge", &public, &private).await?;
    project.server("node-0", &private).await?;
    let config = format!(
        "{}[LoadBalancer]\nsubnet-id = {}\nfloating-network-id = {}\n",
        project.global_section(),
        private.subnet_id,
        public.id
    );
    let ccm = start_ccm(&cluster, &config, &format!("ccm-{test}"), extra)?;
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
    })
}

impl Env {
    /// Creates the Service `name` (port 80), with `spec.loadBalancerIP` when given.
    async fn service(&self, name: &str, load_balancer_ip: Option<&str>) -> Result<()> {
        let mut svc = load_balancer_service(name, &[], &[(80, "http")]);
        if let Some(ip) = load_balancer_ip {
            svc.spec.as_mut().context("spec")?.load_balancer_ip = Some(ip.to_string());
        }
        self.services.create(&PostParams::default(), &svc).await?;
        Ok(())
    }

    /// Waits for the Service's address in its status.
    async fn ingress(&self, name: &str) -> Result<String> {
        wait_for(&format!("{name}'s ingress"), T, || async {
            ingress_ip(&self.services.get(name).await.ok()?)
        })
        .await
        .inspect_err(|_| eprintln!("{}", self.ccm.log()))
    }

    /// The Service's Octavia load balancer (exactly one).
    async fn load_balancer(&self, name: &str) -> Result<serde_json::Value> {
        let lbs = self
            .project
            .load_balancers(&format!("kube_service_kubernetes_default_{name}"))
            .await?;
        anyhow::ensure!(lbs.len() == 1, "{name}: {lbs:?}");
        Ok(lbs[0].clone())
    }

    /// Deletes the Service and waits until it is gone (finalizer removed) and Octavia has no
    /// load balancer of it.
    async fn delete_service(&self, name: &str) -> Result<()> {
        self.services.delete(name, &DeleteParams::default()).await?;
        let lb_name = format!("kube_service_kubernetes_default_{name}");
        wait_for(&format!("{name} and its load balancer gone"), T, || async {
            let svc = self.services.get_opt(name).await.ok()?;
            let lbs = self.project.load_balancers(&lb_name).await.ok()?;
            (svc.is_none() && lbs.is_empty()).then_some(())
        })
        .await
        .inspect_err(|_| eprintln!("{}", self.ccm.log()))
    }

    /// The floating IP `id` as neutron has it.
    async fn floating_ip(&self, id: &str) -> Result<serde_json::Value> {
        Ok(self
            .project
            .session
            .get(&format!("{NEUTRON}/floatingips/{id}"))
            .await?["floatingip"]
            .clone())
    }
}

/// A user's own floating IP named in `spec.loadBalancerIP` is attached to the load balancer's
/// VIP port and is the Service's address; a second Service asking for it while it is attached
/// gets a Warning that says so; deleting the Service deletes the load balancer but never the
/// user's floating IP (detached, free again). An address the project does not hold is asked of
/// neutron, whose default policy refuses it to non-admins: a Warning says so.
#[tokio::test]
async fn a_users_own_floating_ip_in_load_balancer_ip_is_used_and_survives_the_service() -> Result<()> {
    let env = env("lb-own-fip").await?;
    let mine = env
        .project
        .session
        .post(
            &format!("{NEUTRON}/floatingips"),
            json!({"floatingip": {"floating_network_id": env.public.id, "description": "the user's own"}}),
        )
        .await?;
    let (fip_id, address) = (
        mine["floatingip"]["id"].as_str().context("id")?.to_string(),
        mine["floatingip"]["floating_ip_address"]
            .as_str()
            .context("address")?
            .to_string(),
    );
    env.service("own", Some(&address)).await?;
    assert_eq!(env.ingress("own").await?, address, "the requested address");
    let lb = env.load_balancer("own").await?;
    assert_eq!(env.floating_ip(&fip_id).await?["port_id"], lb["vip_port_id"]);

    // Asked for by a second Service while attached: a Warning saying so, no address.
    env.service("thief", Some(&address)).await?;
    wait_for_event(&env.client, "default", "thief", T, |_, message| {
        message.contains(&format!("spec.loadBalancerIP {address}")) && message.contains("not free")
    })
    .await?;
    assert_eq!(ingress_ip(&env.services.get("thief").await?), None);
    env.delete_service("thief").await?;

    env.delete_service("own").await?;
    let left = env.floating_ip(&fip_id).await?;
    assert_eq!(
        left["floating_ip_address"],
        address.as_str(),
        "the user's floating IP is kept"
    );
    assert!(left["port_id"].is_null(), "and free again: {left}");

    // An address the project does not hold: the CCM asks neutron for a floating IP of that
    // address, which neutron's default policy allows admins only — a Warning names the address
    // and neutron's refusal, and the Service gets no address (nothing else is made instead).
    let wanted = "172.24.4.200";
    env.service("made", Some(wanted)).await?;
    wait_for_event(&env.client, "default", "made", T, |_, message| {
        message.contains(&format!(
            "creating the floating IP {wanted} (spec.loadBalancerIP)"
        )) && message.contains("disallowed by policy")
    })
    .await?;
    assert_eq!(ingress_ip(&env.services.get("made").await?), None);
    env.delete_service("made").await?;
    let after: Vec<_> = env
        .project
        .floating_ips()
        .await?
        .into_iter()
        .map(|f| f["floating_ip_address"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(after, [address], "only the user's floating IP is left");
    assert!(!env.ccm.log().contains(&env.project.password));
    Ok(())
}

/// A load balancer that served and went into `ERROR` is left as it is (it may still serve) with
/// a Warning saying so; deleting the Service deletes it (Octavia deletes a load balancer in
/// `ERROR`) and the floating IP made for it, and the finalizer goes.
#[tokio::test]
async fn a_load_balancer_in_error_is_left_while_its_service_lives_and_deleted_with_it() -> Result<()> {
    let env = env("lb-error").await?;
    env.service("broken", None).await?;
    let address = env.ingress("broken").await?;
    let lb = env.load_balancer("broken").await?;
    let lb_id = lb["id"].as_str().context("id")?.to_string();
    env.os
        .octavia_sql(&format!(
            "UPDATE load_balancer SET provisioning_status = 'ERROR' WHERE id = '{lb_id}'"
        ))
        .await?;
    assert_eq!(env.load_balancer("broken").await?["provisioning_status"], "ERROR");

    // A change makes the controller sync the Service: the load balancer is left alone.
    env.services
        .patch(
            "broken",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"loadbalancer.openstack.org/lb-method": "LEAST_CONNECTIONS"}}})),
        )
        .await?;
    wait_for_event(&env.client, "default", "broken", T, |_, message| {
        message.contains("is in ERROR in Octavia: left as it is")
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    let still = env.load_balancer("broken").await?;
    assert_eq!(still["id"], lb_id.as_str(), "not deleted on doubt");
    assert_eq!(ingress_ip(&env.services.get("broken").await?), Some(address));

    env.delete_service("broken").await?;
    assert!(
        env.project.floating_ips().await?.is_empty(),
        "the floating IP made for the Service went with it"
    );
    Ok(())
}

/// A load balancer of the Service's name found in `ERROR` before the Service ever had an
/// address (its creating sync was cut short) is deleted and made again, as OCCM does with one
/// that goes into `ERROR` when it is made; the Service gets an address and a Warning said why.
#[tokio::test]
async fn a_load_balancer_in_error_that_never_served_is_deleted_and_made_again() -> Result<()> {
    let env = env("lb-remake").await?;
    let first = env
        .project
        .session
        .post(
            &format!("{OCTAVIA}/lbaas/loadbalancers"),
            json!({"loadbalancer": {"name": "kube_service_kubernetes_default_fresh", "vip_subnet_id": env.private.subnet_id}}),
        )
        .await?;
    let first_id = first["loadbalancer"]["id"].as_str().context("id")?.to_string();
    wait_for("the first load balancer settled", T, || async {
        let lbs = env
            .project
            .load_balancers("kube_service_kubernetes_default_fresh")
            .await
            .ok()?;
        (lbs.first()?["provisioning_status"] == "ACTIVE").then_some(())
    })
    .await?;
    env.os
        .octavia_sql(&format!(
            "UPDATE load_balancer SET provisioning_status = 'ERROR' WHERE id = '{first_id}'"
        ))
        .await?;
    env.service("fresh", None).await?;
    env.ingress("fresh").await?;
    let lb = env.load_balancer("fresh").await?;
    assert_ne!(lb["id"], first_id.as_str(), "a new load balancer");
    assert_eq!(lb["provisioning_status"], "ACTIVE");
    let events = events_for(&env.client, "default", "fresh").await?;
    assert!(
        events
            .iter()
            .any(|(_, message, _)| message.contains("went into ERROR in Octavia when it was made")),
        "{events:?}"
    );
    env.delete_service("fresh").await?;
    Ok(())
}

/// Shadow mode (`--dry-run`) writes nothing in OpenStack: the controllers announce the load
/// balancer they would make, and nova, neutron and octavia (each behind the project's proxy)
/// see reads only; no load balancer exists and the Node stays tainted. (The OpenStack client
/// also refuses every write itself under `--dry-run`: a unit test of `client.rs`.)
#[tokio::test]
async fn shadow_mode_sends_no_write_to_openstack() -> Result<()> {
    let env = env_with("lb-shadow", &["--dry-run"]).await?;
    env.service("shadow", None).await?;
    wait_for("the shadow run to announce the load balancer", T, || {
        let log = env.ccm.log();
        let announced = log.lines().any(|l| {
            l.contains("would write") && l.contains("EnsureLoadBalancer") && l.contains("default/shadow")
        });
        async move { announced.then_some(()) }
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    // The node controller's pass and a lifecycle pass happen meanwhile.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut seen = std::collections::BTreeMap::new();
    for proxy in [
        &env.project.nova_proxy,
        &env.project.neutron_proxy,
        &env.project.octavia_proxy,
    ] {
        seen.extend(proxy.counts_by_method());
    }
    println!("OpenStack requests of the shadow run: {seen:?}");
    assert!(
        seen.keys().any(|k| k.starts_with("GET ")),
        "the shadow run read the cloud: {seen:?}"
    );
    let writes: Vec<&String> = seen.keys().filter(|k| !k.starts_with("GET ")).collect();
    assert!(writes.is_empty(), "writes sent in shadow mode: {writes:?}");
    assert!(
        env.project
            .load_balancers("kube_service_kubernetes_default_shadow")
            .await?
            .is_empty()
    );
    let nodes: Api<Node> = Api::all(env.client.clone());
    assert!(
        initialised(&nodes, "node-0").await.is_none(),
        "node-0 is still tainted"
    );
    Ok(())
}

/// Runs `cloud-controller-manager-openstack orphans <args>` for the Env's cloud config:
/// `(exit code, stdout)`.
async fn orphans(env: &Env, test: &str, extra: &[&str]) -> Result<(i32, String)> {
    let out = tokio::process::Command::new(rcp_e2e::paths::workspace_binary(
        "cloud-controller-manager-openstack",
    )?)
    .arg("orphans")
    .arg(format!(
        "--cloud-config={}",
        env.cluster.dir().join(format!("ccm-{test}.conf")).display()
    ))
    .arg(format!(
        "--kubeconfig={}",
        env.cluster.ccm_kubeconfig("openstack/base")?.display()
    ))
    .args(extra)
    .env("RUST_LOG", "off")
    .output()
    .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), stdout))
}

/// What a stopped CCM left behind — the load balancer and floating IP of a Service deleted
/// without its cleanup — is listed by `orphans` (and nothing else: not the load balancer of a
/// live Service, not a user's own floating IP), deleted by `orphans --delete --yes`, and then
/// there are none.
#[tokio::test]
async fn orphans_lists_and_deletes_only_what_no_service_wants() -> Result<()> {
    let mut env = env("lb-orphans").await?;
    for name in ["live", "gone"] {
        env.service(name, None).await?;
    }
    let gone_address = env.ingress("gone").await?;
    env.ingress("live").await?;
    let mine = env
        .project
        .session
        .post(
            &format!("{NEUTRON}/floatingips"),
            json!({"floatingip": {"floating_network_id": env.public.id, "description": "the user's own"}}),
        )
        .await?;
    let mine = mine["floatingip"]["floating_ip_address"]
        .as_str()
        .context("address")?
        .to_string();
    // The CCM stops for good; then "gone" is deleted without its cleanup.
    env.ccm.signal(nix::sys::signal::Signal::SIGTERM)?;
    env.ccm.wait_exit(Duration::from_secs(30))?;
    env.services
        .patch(
            "gone",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    env.services.delete("gone", &DeleteParams::default()).await?;
    wait_for("gone deleted", T, || async {
        env.services.get_opt("gone").await.ok()?.is_none().then_some(())
    })
    .await?;

    let (code, out) = orphans(&env, "lb-orphans", &[]).await?;
    assert_eq!(code, 0, "{out}");
    let listed: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() == 5).then(|| (f[0].to_string(), f[1].to_string()))
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("floating-ip".to_string(), gone_address.clone()),
            (
                "load-balancer".to_string(),
                "kube_service_kubernetes_default_gone".to_string()
            ),
        ],
        "{out}"
    );
    assert_eq!(
        env.project
            .load_balancers("kube_service_kubernetes_default_gone")
            .await?
            .len(),
        1,
        "listing deletes nothing"
    );

    let (code, out) = orphans(&env, "lb-orphans", &["--delete", "--yes"]).await?;
    assert_eq!(code, 0, "{out}");
    assert!(
        env.project
            .load_balancers("kube_service_kubernetes_default_gone")
            .await?
            .is_empty()
    );
    assert_eq!(
        env.project
            .load_balancers("kube_service_kubernetes_default_live")
            .await?
            .len(),
        1
    );
    let addresses: Vec<String> = env
        .project
        .floating_ips()
        .await?
        .iter()
        .filter_map(|f| f["floating_ip_address"].as_str().map(str::to_string))
        .collect();
    assert!(
        addresses.contains(&mine),
        "the user's own floating IP is kept: {addresses:?}"
    );
    assert!(!addresses.contains(&gone_address), "{addresses:?}");
    assert_eq!(addresses.len(), 2, "live's and the user's: {addresses:?}");
    let (code, out) = orphans(&env, "lb-orphans", &[]).await?;
    assert_eq!(code, 0);
    assert!(out.starts_with("No orphans"), "{out}");
    Ok(())
}

/// OCCM's listener, pool, monitor and status annotations, read back from Octavia: connection
/// limit and timeouts on the listener, PROXY protocol on the pool, the monitor's settings, the
/// status's hostname; changed on the Service, each is changed in Octavia (the pool made again
/// for a new protocol, the monitor updated in place).
#[tokio::test]
async fn annotations_reach_octavia_and_follow_changes() -> Result<()> {
    let env = env("lb-annotations").await?;
    let a = |pairs: &[(&str, &str)]| -> serde_json::Value {
        json!({"metadata": {"annotations": pairs
            .iter()
            .map(|(k, v)| (format!("loadbalancer.openstack.org/{k}"), serde_json::Value::String(v.to_string())))
            .collect::<serde_json::Map<_, _>>()}})
    };
    let mut svc = load_balancer_service("tuned", &[], &[(80, "http")]);
    svc.metadata.annotations = serde_json::from_value(
        a(&[
            ("connection-limit", "100"),
            ("timeout-client-data", "60000"),
            ("timeout-member-connect", "4000"),
            ("proxy-protocol", "v2"),
            ("enable-health-monitor", "true"),
            ("health-monitor-delay", "10"),
            ("health-monitor-max-retries", "2"),
            ("hostname", "tuned.example.test"),
        ])["metadata"]["annotations"]
            .clone(),
    )?;
    env.services.create(&PostParams::default(), &svc).await?;
    let hostname = wait_for("tuned's hostname", T, || async {
        let s = env.services.get("tuned").await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.hostname.clone()
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    assert_eq!(hostname, "tuned.example.test");
    let lb = env.load_balancer("tuned").await?;
    let lb_id = lb["id"].as_str().context("id")?.to_string();
    let read = || async {
        let listeners = env
            .project
            .octavia_list(&format!("listeners?loadbalancer_id={lb_id}"), "listeners")
            .await?;
        let pools = env
            .project
            .octavia_list(&format!("pools?loadbalancer_id={lb_id}"), "pools")
            .await?;
        let monitors = env
            .project
            .octavia_list("healthmonitors", "healthmonitors")
            .await?;
        anyhow::Ok((listeners, pools, monitors))
    };
    let (listeners, pools, monitors) = read().await?;
    assert_eq!(listeners.len(), 1, "{listeners:?}");
    assert_eq!(listeners[0]["connection_limit"], 100);
    assert_eq!(listeners[0]["timeout_client_data"], 60000);
    assert_eq!(listeners[0]["timeout_member_connect"], 4000);
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert_eq!(pools[0]["protocol"], "PROXYV2");
    assert_eq!(monitors.len(), 1, "{monitors:?}");
    assert_eq!(monitors[0]["delay"], 10);
    assert_eq!(monitors[0]["max_retries"], 2);
    let first_pool = pools[0]["id"].clone();

    // Changed: no PROXY protocol (a new pool), another delay, no connection limit.
    env.services
        .patch(
            "tuned",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "loadbalancer.openstack.org/proxy-protocol": null,
                "loadbalancer.openstack.org/health-monitor-delay": "20",
                "loadbalancer.openstack.org/connection-limit": "-1",
            }}})),
        )
        .await?;
    let (listeners, pools, monitors) = wait_for("the changes in Octavia", T, || async {
        let (l, p, m) = read().await.ok()?;
        (p.len() == 1
            && p[0]["protocol"] == "TCP"
            && m.len() == 1
            && m[0]["delay"] == 20
            && l[0]["connection_limit"] == -1)
            .then_some((l, p, m))
    })
    .await
    .inspect_err(|_| eprintln!("{}", env.ccm.log()))?;
    assert_ne!(
        pools[0]["id"], first_pool,
        "a pool cannot change its protocol: made again"
    );
    assert_eq!(monitors[0]["max_retries"], 2, "the rest kept");
    assert_eq!(listeners[0]["timeout_client_data"], 60000);
    let members = env
        .project
        .octavia_list(
            &format!("pools/{}/members", pools[0]["id"].as_str().unwrap_or_default()),
            "members",
        )
        .await?;
    assert_eq!(members.len(), 1, "the new pool has the member: {members:?}");
    env.delete_service("tuned").await?;
    Ok(())
}

/// Taking over from OCCM: a load balancer made the way OCCM makes it (its names for the load
/// balancer, listener, pool and members, its floating-IP description), found by the CCM when
/// the Service becomes `type: LoadBalancer`, is adopted with zero writes to Octavia and neutron:
/// the Service gets its address, nothing is made again, and deleting the Service deletes both.
#[tokio::test]
async fn a_load_balancer_made_by_occm_is_adopted_without_a_write() -> Result<()> {
    let env = env("lb-adopt").await?;
    // The Service first as NodePort: its node port, which OCCM's members use.
    let mut svc = load_balancer_service("adopt", &[], &[(80, "http")]);
    svc.spec.as_mut().context("spec")?.type_ = Some("NodePort".into());
    env.services.create(&PostParams::default(), &svc).await?;
    let node_port = env
        .services
        .get("adopt")
        .await?
        .spec
        .context("spec")?
        .ports
        .context("ports")?[0]
        .node_port
        .context("node port")?;
    let name = "kube_service_kubernetes_default_adopt";
    let s = &env.project.session;
    let lb = s
        .post(
            &format!("{OCTAVIA}/lbaas/loadbalancers"),
            json!({"loadbalancer": {"name": name, "vip_subnet_id": env.private.subnet_id, "tags": [name],
                   "description": "Kubernetes external service default/adopt from cluster kubernetes"}}),
        )
        .await?;
    let lb_id = lb["loadbalancer"]["id"].as_str().context("id")?.to_string();
    let vip_port = lb["loadbalancer"]["vip_port_id"]
        .as_str()
        .context("vip port")?
        .to_string();
    let active = || async {
        let lbs = env.project.load_balancers(name).await.ok()?;
        (lbs.first()?["provisioning_status"] == "ACTIVE").then_some(())
    };
    wait_for("OCCM's load balancer active", T, active).await?;
    let listener = s
        .post(
            &format!("{OCTAVIA}/lbaas/listeners"),
            json!({"listener": {"name": format!("listener_0_{name}"), "protocol": "TCP", "protocol_port": 80,
                   "loadbalancer_id": lb_id, "connection_limit": -1, "tags": [name]}}),
        )
        .await?;
    wait_for("listener made", T, active).await?;
    let pool = s
        .post(
            &format!("{OCTAVIA}/lbaas/pools"),
            json!({"pool": {"name": format!("pool_0_{name}"), "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN",
                   "listener_id": listener["listener"]["id"], "tags": [name]}}),
        )
        .await?;
    wait_for("pool made", T, active).await?;
    let pool_id = pool["pool"]["id"].as_str().context("pool id")?.to_string();
    let servers = s
        .get(&format!("{}/servers/detail", rcp_e2e::openstack::NOVA))
        .await?;
    let ip = servers["servers"][0]["addresses"]["private"][0]["addr"]
        .as_str()
        .context("node-0's address")?
        .to_string();
    s.put(
        &format!("{OCTAVIA}/lbaas/pools/{pool_id}/members"),
        json!({"members": [{"name": "node-0", "address": ip, "protocol_port": node_port, "subnet_id": env.private.subnet_id}]}),
    )
    .await?;
    wait_for("member made", T, active).await?;
    let fip = s
        .post(
            &format!("{NEUTRON}/floatingips"),
            json!({"floatingip": {"floating_network_id": env.public.id, "port_id": vip_port,
                   "description": "Floating IP for Kubernetes external service default/adopt from cluster kubernetes"}}),
        )
        .await?;
    let address = fip["floatingip"]["floating_ip_address"]
        .as_str()
        .context("address")?
        .to_string();

    // The take-over.
    for p in [&env.project.neutron_proxy, &env.project.octavia_proxy] {
        p.reset_counts();
    }
    env.services
        .patch(
            "adopt",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "LoadBalancer"}})),
        )
        .await?;
    assert_eq!(env.ingress("adopt").await?, address, "OCCM's floating IP");
    // A second sync (a node sync or a resync) finds nothing to change either.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut seen = std::collections::BTreeMap::new();
    for p in [&env.project.neutron_proxy, &env.project.octavia_proxy] {
        seen.extend(p.counts_by_method());
    }
    let writes: Vec<&String> = seen.keys().filter(|k| !k.starts_with("GET ")).collect();
    assert!(
        seen.keys().any(|k| k.starts_with("GET ")),
        "the CCM read OCCM's load balancer: {seen:?}"
    );
    assert!(writes.is_empty(), "adoption wrote: {writes:?}");
    assert_eq!(
        env.load_balancer("adopt").await?["id"],
        lb_id.as_str(),
        "not made again"
    );

    env.delete_service("adopt").await?;
    assert!(
        !env.project
            .floating_ips()
            .await?
            .iter()
            .any(|f| f["floating_ip_address"] == address.as_str()),
        "OCCM's floating IP, made for the Service, went with it"
    );
    Ok(())
}
