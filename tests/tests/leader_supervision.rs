//! One active leader, always (real processes on a real kube-apiserver): a leader whose lease
//! renewals are blocked stops before a standby can take over, and a slow start-up never lets
//! the lease lapse.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use rcp_e2e::{
    TestCluster,
    ccm::CcmProcess,
    fault_proxy::{Action, FaultProxy, Rule},
    k8s::wait_for,
};

const FAKE: &str = "fake-cloud-controller-manager";
const LEASE: &str = "cloud-controller-manager";
const T: Duration = Duration::from_secs(60);

fn start(
    cluster: &TestCluster,
    name: &str,
    kubeconfig: &std::path::Path,
    extra: &[&str],
) -> Result<CcmProcess> {
    let cloud = cluster.dir().join("fake.json");
    std::fs::write(&cloud, "{}")?;
    let mut args = vec![
        format!("--cloud-config={}", cloud.display()),
        "--cluster-cidr=10.244.0.0/16".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    CcmProcess::start(FAKE, name, kubeconfig, cluster.dir(), &args)
}

#[tokio::test]
async fn a_leader_that_cannot_renew_is_gone_before_a_standby_takes_over() -> Result<()> {
    let cluster = TestCluster::start().await?;
    // The first CCM reaches the API server through a proxy that can cut its renewals.
    let proxy = FaultProxy::start_tls_self_signed(cluster.server()).await?;
    let admin = std::fs::read_to_string(cluster.kubeconfig_path())?;
    let proxied = cluster.dir().join("proxied.kubeconfig");
    std::fs::write(
        &proxied,
        admin.replace(cluster.server(), &format!("https://127.0.0.1:{}", proxy.port())),
    )?;
    let mut leader = start(&cluster, "ccm-leader", &proxied, &[])?;
    wait_for("the first CCM leads", T, || async {
        leader.is_leader(LEASE).await.then_some(())
    })
    .await?;
    let standby = start(&cluster, "ccm-standby", cluster.kubeconfig_path(), &[])?;
    wait_for("the standby is up", T, || async {
        (standby.get("/healthz").await.ok()?.0 == 200).then_some(())
    })
    .await?;

    // Renewals hang from now on (GET and PUT of the Lease).
    let cut = Instant::now();
    proxy.add(Rule::new(&[&format!("/leases/{LEASE}")], Action::Hang));
    let mut leader_exit = None;
    let mut standby_leads = None;
    while leader_exit.is_none() || standby_leads.is_none() {
        if leader_exit.is_none() && leader.wait_exit(Duration::from_millis(20)).is_ok() {
            leader_exit = Some(cut.elapsed());
        }
        if standby_leads.is_none() && standby.is_leader(LEASE).await {
            standby_leads = Some(cut.elapsed());
        }
        anyhow::ensure!(
            cut.elapsed() < Duration::from_secs(90),
            "no hand-over within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let (exit, takeover) = (leader_exit.context("exit")?, standby_leads.context("takeover")?);
    println!(
        "renewals cut at 0 s; old leader exited at {exit:.2?}, standby led from {takeover:.2?}: write-free gap {:.2?}",
        takeover.saturating_sub(exit)
    );
    assert!(
        exit < takeover,
        "the old leader must be gone before the standby leads"
    );
    assert!(
        leader.log().contains("leaderelection lost"),
        "the old leader says why"
    );
    assert_eq!(leader.wait_exit(Duration::from_secs(1))?, Some(1), "exit code 1");
    Ok(())
}

#[tokio::test]
async fn the_lease_is_renewed_throughout_a_slow_start() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let first = start(
        &cluster,
        "ccm-slow-start",
        cluster.kubeconfig_path(),
        &["--controller-start-interval=20s"],
    )?;
    let leases: Api<Lease> = Api::namespaced(cluster.client().await?, "kube-system");
    let holder = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let lease = wait_for("the first CCM holds the lease", T, || async {
        leases.get_opt(LEASE).await.ok()?.filter(|l| holder(l).is_some())
    })
    .await?;
    let first_holder = holder(&lease);
    let standby = start(&cluster, "ccm-standby", cluster.kubeconfig_path(), &[])?;
    // 25 s > the 15 s lease: without renewals during the start-up the standby would take over.
    let mut renewals = std::collections::BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(25);
    while Instant::now() < until {
        let l = leases.get(LEASE).await?;
        assert_eq!(
            holder(&l),
            first_holder,
            "the holder never changes during the slow start"
        );
        if let Some(t) = l.spec.and_then(|s| s.renew_time) {
            renewals.insert(t.0.to_string());
        }
        assert!(!standby.is_leader(LEASE).await, "the standby never leads");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("{} distinct renewals seen in 25 s of start-up", renewals.len());
    assert!(renewals.len() >= 5, "renewed all along: {renewals:?}");
    assert!(first.is_leader(LEASE).await);
    Ok(())
}
