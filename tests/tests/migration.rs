//! Leader migration between a KCM stand-in and the real CCM process on a real API server.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Result;
use rcp_e2e::{
    TestCluster,
    ccm::{CcmProcess, run_to_exit},
    k8s::wait_for,
    kcm::KcmStandIn,
};

const FAKE: &str = "fake-cloud-controller-manager";
const MIGRATION_LEASE: &str = "cloud-provider-extraction-migration";
/// The migrated controllers by their legacy metric names, as the config names them (aliases).
const MIGRATED: [&str; 3] = ["route", "service", "cloud-node-lifecycle"];

fn migration_config(cluster: &TestCluster) -> Result<std::path::PathBuf> {
    // The documented v1 example, including its `resourceLock` line.
    let path = cluster.dir().join("leader-migration.yaml");
    std::fs::write(
        &path,
        "kind: LeaderMigrationConfiguration\napiVersion: controllermanager.config.k8s.io/v1\nleaderName: cloud-provider-extraction-migration\nresourceLock: leases\ncontrollerLeaders:\n  - name: route\n    component: \"*\"\n  - name: service\n    component: \"*\"\n  - name: cloud-node-lifecycle\n    component: \"*\"\n",
    )?;
    Ok(path)
}

fn start_ccm(cluster: &TestCluster, name: &str) -> Result<CcmProcess> {
    start_ccm_with(cluster, name, &migration_config(cluster)?)
}

fn start_ccm_with(cluster: &TestCluster, name: &str, config: &std::path::Path) -> Result<CcmProcess> {
    let cloud = cluster.dir().join("fake.json");
    std::fs::write(&cloud, "{}")?;
    CcmProcess::start(
        FAKE,
        name,
        // The deployed ServiceAccount: both leases with the shipped RBAC.
        &cluster.ccm_kubeconfig("common")?,
        cluster.dir(),
        &[
            format!("--cloud-config={}", cloud.display()),
            "--cluster-cidr=10.244.0.0/16".into(),
            "--enable-leader-migration".into(),
            format!("--leader-migration-config={}", config.display()),
        ],
    )
}

/// Samples, every 50 ms, which side runs each migrated controller; returns the overlaps seen.
fn watch(
    ccm: Arc<CcmProcess>,
    standin: rcp_e2e::kcm::StandInProbe,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<(usize, Vec<String>)> {
    tokio::spawn(async move {
        let overlaps = Arc::new(Mutex::new(Vec::new()));
        let mut samples = 0;
        while !stop.is_cancelled() {
            let kcm_active = standin.is_active();
            let metrics = ccm.metrics().await;
            let kcm_after = standin.is_active();
            // A failed read shows nothing: it is not a sample.
            let Ok(metrics) = metrics else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            for c in MIGRATED {
                let ccm_active = metrics.contains(&format!(
                    "running_managed_controllers{{manager=\"cloud-controller-manager\",name=\"{c}\"}} 1"
                ));
                // Both before and after the CCM sample, to be sure the stand-in overlapped it.
                if ccm_active && kcm_active && kcm_after {
                    overlaps
                        .lock()
                        .unwrap()
                        .push(format!("{c} ran in both at sample {samples}"));
                }
            }
            samples += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let o = overlaps.lock().unwrap().clone();
        (samples, o)
    })
}

/// Whether the CCM runs every migrated controller; `None` when `/metrics` cannot be read.
async fn ccm_runs_migrated(ccm: &CcmProcess) -> Option<bool> {
    let mut all = true;
    for c in MIGRATED {
        all &= ccm.runs_controller(c).await.ok()?;
    }
    Some(all)
}

#[tokio::test]
async fn migrated_controllers_move_to_the_ccm_only_after_the_kcm_releases_the_lock() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let standin = KcmStandIn::start(client.clone(), MIGRATION_LEASE);
    wait_for(
        "stand-in holds the migration lock",
        Duration::from_secs(20),
        || async { standin.is_active().then_some(()) },
    )
    .await?;

    let ccm = Arc::new(start_ccm(&cluster, "ccm")?);
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = watch(ccm.clone(), standin.probe(), stop.clone());
    wait_for("ccm leads its primary lock", Duration::from_secs(30), || async {
        ccm.is_leader("cloud-controller-manager")
            .await
            .ok()?
            .then_some(())
    })
    .await?;
    wait_for(
        "non-migrated controller runs",
        Duration::from_secs(20),
        || async { ccm.runs_controller("cloud-node").await.ok()?.then_some(()) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        ccm.log().contains("waiting for the migration lock"),
        "the CCM contends for the migration lock"
    );
    for c in MIGRATED {
        assert!(
            !ccm.runs_controller(c).await?,
            "{c} must wait for the migration lock"
        );
    }
    assert!(!ccm.is_leader(MIGRATION_LEASE).await?);
    let (_, verbose) = ccm.get("/healthz?verbose").await?;
    assert!(
        verbose.contains("[+]leaderElection ok") && verbose.contains("[+]leaderMigration ok"),
        "{verbose}"
    );

    standin.stop().await;
    let released = Instant::now();
    wait_for(
        "ccm runs the migrated controllers",
        Duration::from_secs(30),
        || async { ccm_runs_migrated(&ccm).await?.then_some(()) },
    )
    .await?;
    let handover = released.elapsed();
    println!(
        "migrated controllers started in the CCM {handover:.2?} after the KCM stand-in released the lock"
    );
    // Well before the 15 s lease could have expired: the released lock was used.
    assert!(
        handover < Duration::from_secs(15),
        "{handover:?}: the released migration lock was not used"
    );
    assert!(
        ccm.is_leader(MIGRATION_LEASE).await?,
        "leader_election_master_status shows the migration lock"
    );

    // A KCM coming back cannot take the lock while the CCM holds it: for longer than the 15 s
    // lease (a lock the CCM did not renew would have been taken by then).
    let again = KcmStandIn::start(client.clone(), MIGRATION_LEASE);
    let probe = again.probe();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!again.is_active(), "the lock stays with the CCM");
    stop.cancel();
    let (samples, overlaps) = watcher.await?;
    assert!(samples > 50, "the watcher sampled ({samples})");
    assert!(overlaps.is_empty(), "never both: {overlaps:?}");
    again.kill();
    assert!(!probe.is_active());
    Ok(())
}

#[tokio::test]
async fn a_killed_kcm_hands_over_after_the_lease_expires_without_overlap() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let standin = KcmStandIn::start(client.clone(), MIGRATION_LEASE);
    wait_for("stand-in holds the lock", Duration::from_secs(20), || async {
        standin.is_active().then_some(())
    })
    .await?;
    let ccm = Arc::new(start_ccm(&cluster, "ccm")?);
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = watch(ccm.clone(), standin.probe(), stop.clone());
    wait_for(
        "non-migrated controller runs",
        Duration::from_secs(30),
        || async { ccm.runs_controller("cloud-node").await.ok()?.then_some(()) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    standin.kill();
    let killed = Instant::now();
    wait_for(
        "ccm runs the migrated controllers",
        Duration::from_secs(90),
        || async { ccm_runs_migrated(&ccm).await?.then_some(()) },
    )
    .await?;
    let took = killed.elapsed();
    println!(
        "migrated controllers started in the CCM {took:.2?} after the KCM stand-in was killed (lease duration 15s, retry period 2s)"
    );
    // No take-over before the lease expires: the stand-in renewed at most one retry period
    // (2 s, plus a renewal's own latency) before it was killed, so its lease had ≥ 12.5 s left.
    assert!(
        took >= Duration::from_millis(12_500),
        "the CCM took the lock {took:?} after the kill, before the lease expired"
    );
    // Keep watching after the take-over too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    let (samples, overlaps) = watcher.await?;
    assert!(
        samples as f64 >= (took.as_secs_f64() + 3.0) * 2.0,
        "the watcher kept sampling after the kill ({samples} samples)"
    );
    assert!(overlaps.is_empty(), "never both: {overlaps:?}");
    Ok(())
}

#[test]
fn migration_config_errors_stop_the_start_with_a_reason() -> Result<()> {
    rcp_e2e::init();
    let dir = tempfile::tempdir()?;
    let typo = dir.path().join("typo.yaml");
    std::fs::write(
        &typo,
        "kind: LeaderMigrationConfiguration\napiVersion: controllermanager.config.k8s.io/v1\nleaderName: m\ncontrollerLeaders:\n  - name: route\n    component: \"*\"\n  - name: service\n    component: cloud-controler-manager\n",
    )?;
    let (code, _, stderr) = run_to_exit(
        FAKE,
        &[
            "--enable-leader-migration",
            &format!("--leader-migration-config={}", typo.display()),
        ],
    )?;
    assert_ne!(code, 0);
    assert!(
        stderr
            .contains("controllerLeaders[1] (service): component \"cloud-controler-manager\" must be one of"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let (code, _, stderr) = run_to_exit(
        FAKE,
        &[
            "--enable-leader-migration",
            "--leader-migration-config=/nonexistent.yaml",
        ],
    )?;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("--leader-migration-config /nonexistent.yaml"),
        "{stderr}"
    );
    Ok(())
}

#[tokio::test]
async fn a_config_naming_the_other_components_controllers_starts_with_a_warning() -> Result<()> {
    // One file for both components: kube-controller-manager's `csrsigning` means nothing here.
    let cluster = TestCluster::start().await?;
    let config = cluster.dir().join("shared-migration.yaml");
    std::fs::write(
        &config,
        "kind: LeaderMigrationConfiguration\napiVersion: controllermanager.config.k8s.io/v1\nleaderName: cloud-provider-extraction-migration\ncontrollerLeaders:\n  - name: route\n    component: \"*\"\n  - name: service\n    component: \"*\"\n  - name: cloud-node-lifecycle\n    component: \"*\"\n  - name: csrsigning\n    component: kube-controller-manager\n",
    )?;
    let ccm = start_ccm_with(&cluster, "ccm-shared-config", &config)?;
    wait_for(
        "the migrated controllers run",
        Duration::from_secs(60),
        || async { ccm_runs_migrated(&ccm).await?.then_some(()) },
    )
    .await?;
    assert!(
        ccm.log()
            .contains("\"csrsigning\" is not a controller of this component"),
        "the unknown entry is logged"
    );
    Ok(())
}
