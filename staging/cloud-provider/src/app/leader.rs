//! The leases of a running controller manager: contending for the primary lease, renewing a
//! won lease on a thread of its own, and the signal a lost lease raises.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Contends for the primary lease until won (a session renewing it) or `shutdown` (`None`).
pub(super) async fn win_lease(
    le: &k8s_controller_manager::leaderelection::LeaderElectionConfig,
    client: &kube::Client,
    lease_client: LeaseClientFactory,
    metrics: &Metrics,
    endpoints: &Endpoints,
    lost: &LossSignal,
    shutdown: &CancellationToken,
) -> Option<LeaderSession> {
    let elector = LeaderElector::new(
        client.clone(),
        le.clone(),
        Some(metrics.leader_election_master_status.clone()),
    );
    for checks in [&endpoints.healthz, &endpoints.readyz] {
        let e = elector.clone();
        checks.add("leaderElection", Arc::new(move || e.check()));
    }
    info!(identity = %le.identity, lease = %format!("{}/{}", le.namespace, le.name), "leader election enabled");
    if !elector.acquire(shutdown).await {
        return None;
    }
    Some(renew_lease(elector, lease_client, lost.on("leaderelection lost")))
}

/// Builds a client for a lease session's own runtime.
pub(super) type LeaseClientFactory = Arc<dyn Fn() -> Result<kube::Client, String> + Send + Sync>;

/// Renews a won lease on a thread and runtime of its own, with a client of its own
/// ([`LeaderSession::start_dedicated`]): the controllers share the process's runtime (one
/// worker thread by default), and no amount of their work may delay a renewal. Falls back to
/// a task on the process's runtime if no thread can be started.
pub(super) fn renew_lease(
    elector: Arc<LeaderElector>,
    lease_client: LeaseClientFactory,
    on_lost: impl FnOnce() + Send + Clone + 'static,
) -> LeaderSession {
    match LeaderSession::start_dedicated(elector.clone(), move || lease_client(), on_lost.clone()) {
        Ok(session) => session,
        Err(e) => {
            warn!(error = %e, "could not start the lease renewal thread; renewing on the main runtime");
            LeaderSession::start(elector, on_lost)
        }
    }
}

/// Set when a lease is lost, with which one.
#[derive(Default, Clone)]
pub(super) struct LossSignal {
    pub(super) token: CancellationToken,
    pub(super) what: Arc<parking_lot::Mutex<&'static str>>,
}

impl LossSignal {
    /// The `on_lost` callback of a [`LeaderSession`].
    pub(super) fn on(&self, what: &'static str) -> impl FnOnce() + Send + Clone + 'static {
        let signal = self.clone();
        move || {
            error!("{what}");
            *signal.what.lock() = what;
            signal.token.cancel();
        }
    }
}
