//! Reliability rig for `cloud-controller-manager-aws`: a real kube-apiserver, moto behind a
//! [`FaultProxy`], and the CCM as a process that can be SIGKILLed and restarted at any moment.
//! One Service's whole load-balancer life ([`AwsChaosRig::service_lifecycle`]: create a Classic
//! ELB, add a port, switch to an NLB, delete) is driven through the Kubernetes API and checked
//! in the cloud itself (read from moto directly, never through the proxy): exactly one load
//! balancer per Service at every converged step, and nothing cluster-owned left once the
//! Service is gone.
//!
//! Used by the crash trials and cloud-fault tests (`tests/tests/reliability.rs`, short forms)
//! and their benchmarks (`bench-crash-trials`, `bench-cloud-faults`).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use aws_sdk_ec2::types::Filter;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;

use crate::{
    Moto, TestCluster,
    ccm::CcmProcess,
    fault_proxy::FaultProxy,
    k8s::{ingress_hostname, load_balancer_service, register_tainted_nodes},
    moto::World,
};

/// The cluster ID of the rig's world and `--cluster-name`.
pub const CLUSTER: &str = "chaos";
const SERVICE_TAG: &str = "kubernetes.io/service-name";

/// What the cloud holds for the cluster, read from moto directly.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Cluster-owned Classic ELB names by Service (`namespace/name`).
    pub classic: BTreeMap<String, Vec<String>>,
    /// Cluster-owned NLB names by Service.
    pub network: BTreeMap<String, Vec<String>>,
    /// Cluster-owned target group names by Service.
    pub target_groups: BTreeMap<String, Vec<String>>,
    /// Cluster-tagged security groups other than the world's node group: name → count.
    pub security_groups: BTreeMap<String, usize>,
    /// Ingress rules of the node security group that reference another group or carry an
    /// NLB rule description (`kubernetes.io/rule/nlb/…`), as text.
    pub node_group_rules: Vec<String>,
}

impl Inventory {
    /// Load balancers (classic + network) of `service`.
    pub fn load_balancers(&self, service: &str) -> usize {
        self.classic.get(service).map_or(0, Vec::len) + self.network.get(service).map_or(0, Vec::len)
    }

    /// Everything that names `service` (load balancers and target groups).
    pub fn owned_by(&self, service: &str) -> usize {
        self.load_balancers(service) + self.target_groups.get(service).map_or(0, Vec::len)
    }

    /// Security groups named `k8s-elb-<lb>` whose load balancer does not exist.
    pub fn orphan_security_groups(&self) -> Vec<String> {
        let lbs: BTreeSet<&String> = self
            .classic
            .values()
            .flatten()
            .chain(self.network.values().flatten())
            .collect();
        self.security_groups
            .keys()
            .filter(|g| {
                g.strip_prefix("k8s-elb-")
                    .is_none_or(|lb| !lbs.iter().any(|l| l.as_str() == lb))
            })
            .cloned()
            .collect()
    }

    /// Security groups that exist more than once under one name.
    pub fn duplicate_security_groups(&self) -> Vec<String> {
        self.security_groups
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(g, _)| g.clone())
            .collect()
    }
}

/// One step of [`AwsChaosRig::service_lifecycle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Created: a Classic ELB with port 80, in the status.
    Create,
    /// Port 443 added to the Classic ELB.
    AddPort,
    /// Switched to an NLB: the NLB in the status, the Classic ELB gone.
    SwitchToNlb,
    /// Deleted: the Service gone (finalizer removed), nothing of it in the cloud.
    Delete,
}

/// When each step of one lifecycle converged.
#[derive(Debug, Clone, Default)]
pub struct Lifecycle {
    /// When it started.
    pub started: Option<Instant>,
    /// `(step, when it converged)`.
    pub converged: Vec<(Step, Instant)>,
    /// Problems found at converged steps (a second load balancer, leftovers after delete).
    pub problems: Vec<String>,
}

/// The rig. The CCM is restarted by [`AwsChaosRig::kill_and_restart`].
pub struct AwsChaosRig {
    /// The Kubernetes control plane.
    pub cluster: TestCluster,
    /// moto.
    pub moto: Moto,
    /// The cluster's VPC, subnets, instances.
    pub world: World,
    /// The proxy between the CCM and moto.
    pub proxy: FaultProxy,
    /// Services in `default`.
    pub services: Api<Service>,
    ccm: tokio::sync::Mutex<Option<CcmProcess>>,
    starts: std::sync::atomic::AtomicUsize,
    config: PathBuf,
    kubeconfig: PathBuf,
    env: Vec<(String, String)>,
    extra_args: Vec<String>,
    node_rules_at_start: std::sync::Mutex<Vec<String>>,
}

impl AwsChaosRig {
    /// Starts the cluster, moto with a world of `nodes` instances, the proxy and the CCM
    /// (`--leader-elect=false`: a restarted process need not wait out its predecessor's lease),
    /// and registers the Nodes (initialised by the CCM before this returns).
    pub async fn start(nodes: usize, extra_args: &[&str]) -> Result<Arc<Self>> {
        let cluster = TestCluster::start().await?;
        let moto = Moto::start().await?;
        let world = moto.build_world(CLUSTER, nodes).await?;
        let proxy = FaultProxy::start(moto.endpoint()).await?;
        let config = cluster.dir().join("cloud.conf");
        std::fs::write(
            &config,
            moto.cloud_config(&world)
                .replace(moto.endpoint(), &format!("http://127.0.0.1:{}", proxy.port())),
        )?;
        let env = moto
            .sdk_env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let kubeconfig = cluster.ccm_kubeconfig("aws/base")?;
        let client = cluster.client().await?;
        let rig = Arc::new(Self {
            services: Api::namespaced(client.clone(), "default"),
            cluster,
            moto,
            world,
            proxy,
            ccm: tokio::sync::Mutex::new(None),
            starts: Default::default(),
            config,
            kubeconfig,
            env,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            node_rules_at_start: Default::default(),
        });
        let rules = rig.inventory().await?.node_group_rules;
        *rig.node_rules_at_start.lock().expect("rules") = rules;
        *rig.ccm.lock().await = Some(rig.start_ccm()?);
        let nodes: Api<Node> = Api::all(client);
        register_tainted_nodes(&nodes, &rig.world.node_names(), Some(Duration::from_secs(180))).await?;
        Ok(rig)
    }

    fn start_ccm(&self) -> Result<CcmProcess> {
        let n = self.starts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut args = vec![
            format!("--cloud-config={}", self.config.display()),
            "--leader-elect=false".into(),
            format!("--cluster-name={CLUSTER}"),
        ];
        args.extend(self.extra_args.iter().cloned());
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        CcmProcess::start_with_env(
            "cloud-controller-manager-aws",
            &format!("ccm-aws-{n}"),
            &self.kubeconfig,
            self.cluster.dir(),
            &args,
            &env,
        )
    }

    /// The node group's rules before any Service (see [`Inventory::node_group_rules`]).
    pub fn node_rules_at_start(&self) -> Vec<String> {
        self.node_rules_at_start.lock().expect("rules").clone()
    }

    /// How many times the CCM was started.
    pub fn starts(&self) -> usize {
        self.starts.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// SIGKILLs the CCM (whatever it is doing) and starts a new one at once.
    pub async fn kill_and_restart(&self) -> Result<()> {
        let mut ccm = self.ccm.lock().await;
        if let Some(mut old) = ccm.take() {
            old.signal(Signal::SIGKILL)?;
            old.wait_exit(Duration::from_secs(10))?;
        }
        *ccm = Some(self.start_ccm()?);
        Ok(())
    }

    /// The sum of a counter over the running CCM's `/metrics` lines starting with `prefix`.
    pub async fn metric(&self, prefix: &str) -> f64 {
        match self.ccm.lock().await.as_ref() {
            Some(c) => c.metric_value(prefix).await,
            None => 0.0,
        }
    }

    /// [`CcmProcess::metric_value_read`] of the running CCM: an error when `/metrics` cannot be
    /// read or no CCM runs.
    pub async fn metric_read(&self, prefix: &str) -> Result<f64> {
        match self.ccm.lock().await.as_ref() {
            Some(c) => c.metric_value_read(prefix).await,
            None => anyhow::bail!("no CCM runs to read {prefix} from"),
        }
    }

    /// The running CCM's log.
    pub async fn ccm_log(&self) -> String {
        self.ccm
            .lock()
            .await
            .as_ref()
            .map(CcmProcess::log)
            .unwrap_or_default()
    }

    /// Reads what the cloud holds for the cluster.
    pub async fn inventory(&self) -> Result<Inventory> {
        let mut inv = Inventory::default();
        let owned = |tags: &BTreeMap<String, String>| {
            tags.get(&format!("kubernetes.io/cluster/{CLUSTER}"))
                .map(String::as_str)
                == Some("owned")
        };
        // Classic ELBs.
        let elb = self.moto.elb();
        let names: Vec<String> = elb
            .describe_load_balancers()
            .send()
            .await?
            .load_balancer_descriptions()
            .iter()
            .filter_map(|d| d.load_balancer_name().map(str::to_string))
            .collect();
        for chunk in names.chunks(20) {
            let out = elb
                .describe_tags()
                .set_load_balancer_names(Some(chunk.to_vec()))
                .send()
                .await?;
            for d in out.tag_descriptions() {
                let tags: BTreeMap<String, String> = d
                    .tags()
                    .iter()
                    .map(|t| (t.key().to_string(), t.value().unwrap_or_default().to_string()))
                    .collect();
                if owned(&tags) {
                    let service = tags.get(SERVICE_TAG).cloned().unwrap_or_default();
                    inv.classic
                        .entry(service)
                        .or_default()
                        .push(d.load_balancer_name().unwrap_or_default().to_string());
                }
            }
        }
        // NLBs and target groups.
        let elbv2 = self.moto.elbv2();
        let lbs = elbv2.describe_load_balancers().send().await?;
        let tgs = elbv2.describe_target_groups().send().await?;
        let mut arns: BTreeMap<String, (bool, String)> = BTreeMap::new();
        for lb in lbs.load_balancers() {
            arns.insert(
                lb.load_balancer_arn().unwrap_or_default().to_string(),
                (true, lb.load_balancer_name().unwrap_or_default().to_string()),
            );
        }
        for tg in tgs.target_groups() {
            arns.insert(
                tg.target_group_arn().unwrap_or_default().to_string(),
                (false, tg.target_group_name().unwrap_or_default().to_string()),
            );
        }
        let keys: Vec<String> = arns.keys().cloned().collect();
        for chunk in keys.chunks(20) {
            let out = elbv2
                .describe_tags()
                .set_resource_arns(Some(chunk.to_vec()))
                .send()
                .await?;
            for d in out.tag_descriptions() {
                let tags: BTreeMap<String, String> = d
                    .tags()
                    .iter()
                    .map(|t| {
                        (
                            t.key().unwrap_or_default().to_string(),
                            t.value().unwrap_or_default().to_string(),
                        )
                    })
                    .collect();
                let Some((is_lb, name)) = arns.get(d.resource_arn().unwrap_or_default()) else {
                    continue;
                };
                if owned(&tags) {
                    let service = tags.get(SERVICE_TAG).cloned().unwrap_or_default();
                    let map = if *is_lb {
                        &mut inv.network
                    } else {
                        &mut inv.target_groups
                    };
                    map.entry(service).or_default().push(name.clone());
                }
            }
        }
        // Security groups.
        let ec2 = self.moto.ec2();
        let groups = ec2
            .describe_security_groups()
            .filters(
                Filter::builder()
                    .name("vpc-id")
                    .values(&self.world.vpc_id)
                    .build(),
            )
            .send()
            .await?;
        for g in groups.security_groups() {
            if g.group_id() == Some(self.world.security_group_id.as_str()) {
                for p in g.ip_permissions() {
                    let ports = format!(
                        "{}:{}-{}",
                        p.ip_protocol().unwrap_or_default(),
                        p.from_port().unwrap_or_default(),
                        p.to_port().unwrap_or_default()
                    );
                    for pair in p.user_id_group_pairs() {
                        inv.node_group_rules
                            .push(format!("{ports} from {}", pair.group_id().unwrap_or_default()));
                    }
                    for r in p.ip_ranges() {
                        if let Some(d) = r
                            .description()
                            .filter(|d| d.starts_with("kubernetes.io/rule/nlb/"))
                        {
                            inv.node_group_rules
                                .push(format!("{ports} from {} ({d})", r.cidr_ip().unwrap_or_default()));
                        }
                    }
                }
                continue;
            }
            let tagged = g
                .tags()
                .iter()
                .any(|t| t.key() == Some(&format!("kubernetes.io/cluster/{CLUSTER}")));
            if tagged {
                *inv.security_groups
                    .entry(g.group_name().unwrap_or_default().to_string())
                    .or_default() += 1;
            }
        }
        Ok(inv)
    }

    /// The inventory, read again while a read fails (moto answers `…NotFound` for a load
    /// balancer deleted between its listing and its tags) until `deadline`.
    async fn inventory_until(&self, deadline: Instant) -> Result<Inventory> {
        loop {
            match self.inventory().await {
                Ok(inv) => return Ok(inv),
                Err(e) if Instant::now() > deadline => {
                    return Err(e.context("reading the cloud's inventory"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// Waits (up to `limit`) until `check` accepts the Service (`None` when it is gone) and
    /// the inventory; the last rejection is the error.
    async fn converge(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(Option<&Service>, &Inventory) -> Result<(), String>,
    ) -> Result<(Instant, Inventory)> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            let inv = self.inventory().await;
            let svc = self
                .services
                .get_opt(what.split('/').nth(1).unwrap_or(what))
                .await;
            if let (Ok(inv), Ok(svc)) = (inv, svc) {
                match check(svc.as_ref(), &inv) {
                    Ok(()) => return Ok((Instant::now(), inv)),
                    Err(why) => last = why,
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!("{what} did not converge within {limit:?}: {last}")
    }

    /// One Service's whole life: Classic ELB → add a port → NLB → deleted, each step waited for
    /// (up to `limit`) in the Kubernetes API and in the cloud.
    pub async fn service_lifecycle(&self, name: &str, limit: Duration) -> Result<Lifecycle> {
        let key = format!("default/{name}");
        let mut out = Lifecycle {
            started: Some(Instant::now()),
            ..Default::default()
        };
        let mut seen_lbs: BTreeSet<String> = BTreeSet::new();
        let one_lb = |inv: &Inventory, out: &mut Lifecycle, step: &str| {
            if inv.load_balancers(&key) != 1 {
                out.problems.push(format!(
                    "{key} after {step}: {} load balancers: {inv:?}",
                    inv.load_balancers(&key)
                ));
            }
            let dup = inv.duplicate_security_groups();
            if !dup.is_empty() {
                out.problems
                    .push(format!("{key} after {step}: duplicate security groups {dup:?}"));
            }
        };

        // 1. Create: a Classic ELB listening on 80.
        self.services
            .create(
                &PostParams::default(),
                &load_balancer_service(name, &[], &[(80, "http")]),
            )
            .await
            .with_context(|| format!("creating {key}"))?;
        let (t, inv) = self
            .converge(&key, limit, |svc, inv| {
                let host = svc.and_then(ingress_hostname).ok_or("no ingress hostname")?;
                let lbs = inv.classic.get(&key).ok_or("no classic ELB")?;
                (lbs.len() == 1 && host.starts_with(&lbs[0]))
                    .then_some(())
                    .ok_or(format!("status {host} vs classic ELBs {lbs:?}"))
            })
            .await?;
        one_lb(&inv, &mut out, "create");
        seen_lbs.extend(inv.classic.get(&key).into_iter().flatten().cloned());
        out.converged.push((Step::Create, t));

        // 2. Add port 443.
        let patch = serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "https", "port": 443, "protocol": "TCP"}]}});
        self.services
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let elb = self.moto.elb();
        let deadline = Instant::now() + limit;
        loop {
            let inv = self.inventory_until(deadline).await?;
            let lb = inv.classic.get(&key).and_then(|v| v.first()).cloned();
            let ports: Vec<i32> = match &lb {
                Some(lb) => elb
                    .describe_load_balancers()
                    .load_balancer_names(lb)
                    .send()
                    .await
                    .map(|o| {
                        o.load_balancer_descriptions()
                            .iter()
                            .flat_map(|d| d.listener_descriptions())
                            .filter_map(|l| l.listener().map(|l| l.load_balancer_port()))
                            .collect()
                    })
                    .unwrap_or_default(),
                None => vec![],
            };
            if ports.contains(&443) && ports.contains(&80) {
                one_lb(&inv, &mut out, "adding a port");
                out.converged.push((Step::AddPort, Instant::now()));
                break;
            }
            if Instant::now() > deadline {
                bail!("{key}: port 443 not on the classic ELB within {limit:?} (listeners {ports:?})");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        // 3. Switch to an NLB: the NLB in the status, the classic ELB deleted.
        let patch = serde_json::json!({"metadata": {"annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}}});
        self.services
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let elbv2 = self.moto.elbv2();
        let deadline = Instant::now() + limit;
        loop {
            let inv = self.inventory_until(deadline).await?;
            let svc = self.services.get_opt(name).await?;
            let host = svc.as_ref().and_then(ingress_hostname).unwrap_or_default();
            let nlb_dns = match inv.network.get(&key).and_then(|v| v.first()) {
                Some(n) => elbv2
                    .describe_load_balancers()
                    .names(n)
                    .send()
                    .await
                    .ok()
                    .and_then(|o| {
                        o.load_balancers()
                            .first()
                            .and_then(|l| l.dns_name().map(str::to_string))
                    }),
                None => None,
            };
            if nlb_dns.as_deref() == Some(host.as_str()) && inv.classic.get(&key).is_none_or(Vec::is_empty) {
                one_lb(&inv, &mut out, "switching to an NLB");
                seen_lbs.extend(inv.network.get(&key).into_iter().flatten().cloned());
                let tgs = inv.target_groups.get(&key).map_or(0, Vec::len);
                if tgs != 2 {
                    out.problems.push(format!(
                        "{key} after switching to an NLB: {tgs} target groups (want 2)"
                    ));
                }
                out.converged.push((Step::SwitchToNlb, Instant::now()));
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{key}: not switched to an NLB within {limit:?} (status {host:?}, NLB {nlb_dns:?}, {inv:?})"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        // 4. Delete: the Service gone (finalizer removed) and nothing of it left in the cloud.
        self.services.delete(name, &DeleteParams::default()).await?;
        let (t, inv) = self
            .converge(&key, limit, |svc, inv| {
                if svc.is_some() {
                    return Err("the Service still exists (finalizer)".into());
                }
                (inv.owned_by(&key) == 0)
                    .then_some(())
                    .ok_or(format!("left in the cloud: {inv:?}"))
            })
            .await?;
        out.converged.push((Step::Delete, t));
        // The node group's rules for the Service's load balancers go before the NLB itself.
        let names: Vec<String> = seen_lbs.iter().cloned().collect();
        let left: Vec<String> = inv
            .node_group_rules
            .iter()
            .filter(|r| names.iter().any(|n| r.contains(n.as_str())))
            .cloned()
            .collect();
        if !left.is_empty() {
            out.problems
                .push(format!("{key} after delete: node-group rules left {left:?}"));
        }
        let orphans = inv.orphan_security_groups();
        if !orphans.is_empty() {
            out.problems
                .push(format!("{key} after delete: security groups left {orphans:?}"));
        }
        Ok(out)
    }

    /// Waits until the cloud holds nothing of the cluster's Services any more (no load balancer,
    /// target group, `k8s-elb-` group or node-group rule); the leftovers after `limit`.
    pub async fn leftovers(&self, limit: Duration) -> Result<Inventory> {
        let deadline = Instant::now() + limit;
        loop {
            let inv = self.inventory_until(deadline).await?;
            let clean = inv.classic.is_empty()
                && inv.network.is_empty()
                && inv.target_groups.is_empty()
                && inv.security_groups.is_empty()
                && inv.node_group_rules == *self.node_rules_at_start.lock().expect("rules");
            if clean || Instant::now() > deadline {
                return Ok(inv);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The median and maximum of `values` (0 when empty).
pub fn median_max(values: &[Duration]) -> (Duration, Duration) {
    let mut v = values.to_vec();
    v.sort();
    (
        v.get(v.len() / 2).copied().unwrap_or_default(),
        v.last().copied().unwrap_or_default(),
    )
}

/// The outcome of one crash trial.
#[derive(Debug, Clone)]
pub struct TrialResult {
    /// Trial number.
    pub index: usize,
    /// When the CCM was killed, after the trial's start.
    pub kill_at: Duration,
    /// The step in progress at the kill (`None`: the lifecycle had ended first).
    pub killed_during: Option<Step>,
    /// From the kill until the step in progress converged (with the restarted CCM).
    pub convergence: Option<Duration>,
    /// How long the whole lifecycle took.
    pub took: Duration,
    /// Leaks and duplicates found, or why the lifecycle did not converge.
    pub problems: Vec<String>,
}

/// One crash trial: [`AwsChaosRig::service_lifecycle`] of a fresh Service, with the CCM
/// SIGKILLed `kill_at` after the start (wherever it is) and restarted at once.
pub async fn crash_trial(
    rig: &Arc<AwsChaosRig>,
    index: usize,
    kill_at: Duration,
    limit: Duration,
) -> TrialResult {
    let start = Instant::now();
    let killer = {
        let rig = rig.clone();
        tokio::spawn(async move {
            tokio::time::sleep(kill_at).await;
            let at = Instant::now();
            rig.kill_and_restart().await.map(|()| at)
        })
    };
    let lifecycle = rig.service_lifecycle(&format!("trial-{index}"), limit).await;
    let took = start.elapsed();
    let mut problems = Vec::new();
    let mut killed = None;
    // A kill that comes after the end still happens (the next trial starts with a fresh CCM).
    match killer.await {
        Ok(Ok(at)) => killed = Some(at),
        Ok(Err(e)) => problems.push(format!("restarting the CCM: {e:#}")),
        Err(e) => problems.push(format!("killer: {e}")),
    }
    let (killed_during, convergence) = match (&lifecycle, killed) {
        (Ok(l), Some(at)) => match l.converged.iter().find(|(_, t)| *t >= at) {
            Some((step, t)) => (Some(*step), Some(*t - at)),
            None => (None, None),
        },
        _ => (None, None),
    };
    match lifecycle {
        Ok(l) => problems.extend(l.problems),
        Err(e) => problems.push(format!("{e:#}")),
    }
    TrialResult {
        index,
        kill_at,
        killed_during,
        convergence,
        took,
        problems,
    }
}
