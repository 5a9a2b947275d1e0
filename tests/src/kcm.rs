//! A kube-controller-manager stand-in for leader-migration tests (a test helper, not a
//! product): it contends for the migration Lease exactly as a migration-enabled KCM does
//! (same Lease, Lease lock, same timings) and "runs" its migrated controllers while it holds it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_controller_manager::leaderelection::{LeaderElectionConfig, LeaderElector};
use kube::Client;
use tokio_util::sync::CancellationToken;

/// The stand-in. Dropping it kills it (no release), like `kill -9`.
pub struct KcmStandIn {
    probe: StandInProbe,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Tells whether the stand-in runs its migrated controllers (usable after it was stopped).
#[derive(Clone)]
pub struct StandInProbe {
    elector: Arc<LeaderElector>,
    alive: Arc<AtomicBool>,
}

impl StandInProbe {
    /// Whether the stand-in is alive and holds the migration lock.
    pub fn is_active(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && self.elector.is_leader()
    }
}

impl std::fmt::Debug for KcmStandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KcmStandIn")
            .field("leading", &self.is_active())
            .finish()
    }
}

impl KcmStandIn {
    /// Starts contending for `kube-system/<lease>` with upstream's default timings.
    pub fn start(client: Client, lease: &str) -> Self {
        let elector = LeaderElector::new(
            client,
            LeaderElectionConfig {
                namespace: "kube-system".into(),
                name: lease.into(),
                identity: format!("kcm-standin_{}", uuid_like()),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
            None,
        );
        let shutdown = CancellationToken::new();
        let (e, s) = (elector.clone(), shutdown.clone());
        let task = tokio::spawn(async move {
            if e.acquire(&s).await {
                let _ = e.hold(&s).await;
                e.release().await;
            }
        });
        Self {
            probe: StandInProbe {
                elector,
                alive: Arc::new(AtomicBool::new(true)),
            },
            shutdown,
            task,
        }
    }

    /// Whether it currently holds the migration lock (i.e. runs the migrated controllers).
    pub fn is_active(&self) -> bool {
        self.probe.is_active()
    }

    /// A probe that outlives the stand-in.
    pub fn probe(&self) -> StandInProbe {
        self.probe.clone()
    }

    /// Graceful stop: releases the lock (a KCM restarted without migration, or rolled away).
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Abrupt stop: stops renewing without releasing (`kill -9`).
    pub fn kill(self) {
        self.probe.alive.store(false, Ordering::SeqCst);
        self.task.abort();
    }
}

fn uuid_like() -> String {
    format!("{:016x}", rand::random::<u64>())
}
