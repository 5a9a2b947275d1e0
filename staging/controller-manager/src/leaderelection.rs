//! Leader election on `coordination.k8s.io/v1` Leases, with client-go's semantics:
//!
//! - a candidate takes the Lease when it is free (no holder) or expired; expiry is judged on
//!   the candidate's own clock from when it last **observed** the record change (so clock
//!   skew between nodes does not matter);
//! - every write carries the read `resourceVersion` (optimistic concurrency): of two
//!   candidates racing, one gets 409 Conflict and stays a follower;
//! - the leader renews every `retry_period`; if it cannot renew for `renew_deadline` it has
//!   lost the lease ([`LeaderElector::hold`] returns [`HoldOutcome::Lost`]; controller managers
//!   exit then, as upstream does). The deadline runs from when the last successful renewal
//!   was **sent**, not from when its answer arrived: the other candidates judge expiry from
//!   when they observe the record change, which is never before the request was sent, so a
//!   late answer cannot stretch this leader's authority past theirs. A failed attempt is
//!   retried every `retry_period`, and the loss noticed no later than the deadline itself;
//! - on shutdown the leader releases the Lease ([`LeaderElector::release`]: empty holder, 1 s
//!   duration), so a standby takes over within one retry period instead of a whole lease
//!   duration.
//!
//! [`LeaderSession`] keeps a won lease renewed from the moment it is won until the holder has
//! drained and releases it; a loss is reported at once. [`LeaderSession::start_dedicated`]
//! renews on a thread and runtime of its own, with a client of its own, so that no amount of
//! controller work on the process's runtime can delay a renewal.
//!
//! `leader_election_master_status{name}` is 1 while leading. [`LeaderElector::check`] is the
//! `leaderElection` health check: it fails when this process leads but has not renewed for
//! longer than `lease_duration + 20s`.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ObjectMeta, PostParams},
};
use parking_lot::Mutex;
use prometheus::IntGaugeVec;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Timing and identity of one election.
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease (`--leader-elect-resource-namespace`).
    pub namespace: String,
    /// Name of the Lease (`--leader-elect-resource-name`).
    pub name: String,
    /// This candidate's identity (`<hostname>_<uuid>`).
    pub identity: String,
    /// `--leader-elect-lease-duration` (15 s).
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline` (10 s).
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period` (2 s).
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// Validates the timing rules of client-go.
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err(
                "--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline".into(),
            );
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return Err(
                "--leader-elect-renew-deadline must be greater than 1.2 × --leader-elect-retry-period".into(),
            );
        }
        if self.retry_period.is_zero() {
            return Err("--leader-elect-retry-period must be greater than zero".into());
        }
        if self.name.is_empty() {
            return Err("--leader-elect-resource-name must not be empty".into());
        }
        Ok(())
    }
}

/// How holding the lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOutcome {
    /// Renewal failed for longer than the renew deadline, or another holder took the lease.
    Lost,
    /// Shutdown was requested. The caller stops its controllers, then calls
    /// [`LeaderElector::release`].
    Shutdown,
}

#[derive(Debug, Default)]
struct Observed {
    holder: String,
    renew_time: Option<Timestamp>,
    lease_duration: Duration,
    /// When this candidate last saw the record change.
    at: Option<Instant>,
}

/// One candidate in one election.
pub struct LeaderElector {
    /// Replaced by [`LeaderElector::use_client`] (a dedicated renewal runtime's own client).
    api: Mutex<Api<Lease>>,
    config: LeaderElectionConfig,
    observed: Mutex<Observed>,
    last_renew: Mutex<Option<Instant>>,
    leading: Mutex<bool>,
    gauge: Option<IntGaugeVec>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// A candidate using `client`; `gauge` is `leader_election_master_status`.
    pub fn new(client: Client, config: LeaderElectionConfig, gauge: Option<IntGaugeVec>) -> Arc<Self> {
        if let Some(g) = &gauge {
            g.with_label_values(&[&config.name]).set(0);
        }
        Arc::new(Self {
            api: Mutex::new(Api::namespaced(client, &config.namespace)),
            config,
            observed: Mutex::new(Observed::default()),
            last_renew: Mutex::new(None),
            leading: Mutex::new(false),
            gauge,
        })
    }

    /// Makes every later request of this candidate go through `client` (e.g. one built on the
    /// runtime that renews the lease: a kube client's requests are driven by the runtime it
    /// was built on).
    pub fn use_client(&self, client: Client) {
        *self.api.lock() = Api::namespaced(client, &self.config.namespace);
    }

    fn api(&self) -> Api<Lease> {
        self.api.lock().clone()
    }

    /// The Lease as stored (every field, including those this build's types do not know) and
    /// as the elector reads it.
    async fn get_lease(&self) -> Result<Option<(Lease, DynamicObject)>, kube::Error> {
        let raw_api: Api<DynamicObject> = Api::namespaced_with(
            self.api().into_client(),
            &self.config.namespace,
            &ApiResource::erase::<Lease>(&()),
        );
        let Some(raw) = raw_api.get_opt(&self.config.name).await? else {
            return Ok(None);
        };
        let lease: Lease = serde_json::to_value(&raw)
            .and_then(serde_json::from_value)
            .map_err(kube::Error::SerdeError)?;
        Ok(Some((lease, raw)))
    }

    /// Writes the elector's fields of `lease` into `raw` (the Lease as read) and updates it
    /// under the read resourceVersion. An update, not a patch, so that the `update` verb on
    /// Leases (what upstream's RBAC grants) is all it needs; of the read object, so that no field
    /// is dropped (see [`with_elector_fields`]).
    async fn write_lease(&self, raw: DynamicObject, lease: &Lease) -> Result<(), kube::Error> {
        let raw_api: Api<DynamicObject> = Api::namespaced_with(
            self.api().into_client(),
            &self.config.namespace,
            &ApiResource::erase::<Lease>(&()),
        );
        raw_api
            .replace(
                &self.config.name,
                &PostParams::default(),
                &with_elector_fields(raw, lease),
            )
            .await
            .map(|_| ())
    }

    /// The election's settings.
    pub fn config(&self) -> &LeaderElectionConfig {
        &self.config
    }

    /// Whether this candidate currently leads.
    pub fn is_leader(&self) -> bool {
        *self.leading.lock()
    }

    /// The holder this candidate last observed.
    pub fn observed_holder(&self) -> String {
        self.observed.lock().holder.clone()
    }

    /// Tries every `retry_period` (jittered) until this candidate leads (`true`) or `shutdown`
    /// is cancelled (`false`).
    pub async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        info!(lease = %self.lease_ref(), identity = %self.config.identity, "attempting to acquire leader lease");
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    info!(lease = %self.lease_ref(), identity = %self.config.identity, "successfully acquired lease");
                    self.set_leading(true);
                    return true;
                }
                Ok(false) => {
                    debug!(lease = %self.lease_ref(), holder = %self.observed_holder(), "lease is held by another candidate")
                }
                Err(e) => warn!(lease = %self.lease_ref(), error = %e, "error retrieving or updating lease"),
            }
            let jitter = 1.0 + rand::random::<f64>() * 1.2;
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_period.mul_f64(jitter)) => {}
                _ = shutdown.cancelled() => return false,
            }
        }
    }

    /// Renews every `retry_period` while leading. Returns [`HoldOutcome::Lost`] when renewals
    /// fail for `renew_deadline`, or [`HoldOutcome::Shutdown`] when `shutdown` is cancelled
    /// (the lease is still held: release it once the controllers have stopped).
    pub async fn hold(&self, shutdown: &CancellationToken) -> HoldOutcome {
        let mut next_attempt = Instant::now() + self.config.retry_period;
        loop {
            // Measured from when the last successful renewal was sent.
            let deadline = self.last_renew.lock().unwrap_or_else(Instant::now) + self.config.renew_deadline;
            tokio::select! {
                _ = tokio::time::sleep_until(next_attempt.min(deadline)) => {}
                _ = shutdown.cancelled() => return HoldOutcome::Shutdown,
            }
            if Instant::now() >= deadline {
                return self.lost_by_deadline();
            }
            next_attempt = Instant::now() + self.config.retry_period;
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    warn!(lease = %self.lease_ref(), holder = %self.observed_holder(), "leaderelection lost: another candidate holds the lease");
                    self.set_leading(false);
                    return HoldOutcome::Lost;
                }
                Ok(Err(e)) => warn!(lease = %self.lease_ref(), error = %e, "failed to renew lease"),
                Err(_) => return self.lost_by_deadline(),
            }
        }
    }

    fn lost_by_deadline(&self) -> HoldOutcome {
        warn!(lease = %self.lease_ref(), "leaderelection lost: failed to renew within the renew deadline");
        self.set_leading(false);
        HoldOutcome::Lost
    }

    /// The `leaderElection` health check.
    pub fn check(&self) -> Result<(), String> {
        if !self.is_leader() {
            return Ok(());
        }
        let last = *self.last_renew.lock();
        let limit = self.config.lease_duration + Duration::from_secs(20);
        match last {
            Some(t) if t.elapsed() > limit => Err(format!(
                "failed election to renew leadership on lease {}: last renewal {:?} ago",
                self.config.name,
                t.elapsed()
            )),
            _ => Ok(()),
        }
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    fn set_leading(&self, leading: bool) {
        *self.leading.lock() = leading;
        if let Some(g) = &self.gauge {
            g.with_label_values(&[&self.config.name]).set(i64::from(leading));
        }
    }

    /// One client-go `tryAcquireOrRenew`. `Ok(true)` when this candidate holds the lease now.
    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        // The renewal's moment is when it is sent (see the module docs).
        let sent = Instant::now();
        let api = self.api();
        let now = Timestamp::now();
        let me = self.config.identity.as_str();
        let duration_secs = self.config.lease_duration.as_secs().max(1) as i32;
        let Some((mut lease, raw)) = self.get_lease().await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.to_string()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observe(me, Some(now), self.config.lease_duration);
                    *self.last_renew.lock() = Some(sent);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let renew = spec.renew_time.as_ref().map(|t| t.0);
        let held_for = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        self.observe(&holder, renew, held_for);
        if !holder.is_empty() && holder != me {
            let observed = self.observed.lock();
            let expired = observed
                .at
                .is_none_or(|at| at + observed.lease_duration <= Instant::now());
            if !expired {
                return Ok(false);
            }
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        let spec = lease.spec.get_or_insert_with(Default::default);
        if holder != me {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(transitions + 1);
        }
        spec.holder_identity = Some(me.to_string());
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(MicroTime(now));
        // The update carries the read resourceVersion: a concurrent writer makes this a 409.
        match self.write_lease(raw, &lease).await {
            Ok(_) => {
                self.observe(me, Some(now), self.config.lease_duration);
                *self.last_renew.lock() = Some(sent);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn observe(&self, holder: &str, renew_time: Option<Timestamp>, lease_duration: Duration) {
        let mut o = self.observed.lock();
        if o.at.is_none() || o.holder != holder || o.renew_time != renew_time {
            o.holder = holder.to_string();
            o.renew_time = renew_time;
            o.at = Some(Instant::now());
        }
        o.lease_duration = lease_duration;
    }

    /// Gives the lease up (if held): empty holder, 1 s duration.
    pub async fn release(&self) {
        if !self.is_leader() {
            return;
        }
        self.set_leading(false);
        self.release_held_by_identity().await;
    }

    /// Releases the lease if its holder is this candidate's identity, whatever this elector
    /// object believes (used for a lock acquired by another elector of the same identity).
    pub async fn release_held_by_identity(&self) {
        let result = async {
            let Some((mut lease, raw)) = self.get_lease().await? else {
                return Ok(());
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(());
            }
            let now = MicroTime(Timestamp::now());
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now.clone());
            spec.acquire_time = Some(now);
            self.write_lease(raw, &lease).await
        }
        .await;
        match result {
            Ok(()) => info!(lease = %self.lease_ref(), "released leader lease"),
            Err(e) => warn!(lease = %self.lease_ref(), error = %e, "failed to release leader lease"),
        }
    }
}

/// `raw` (a Lease as read) with the fields an elector owns (holder, duration, acquire and renew
/// times, transitions; a `None` removes the field) taken from `lease`. Every other field of the
/// stored object, including those of API versions newer than this build knows (coordinated
/// leader election's `strategy` and `preferredHolder`, and whatever comes next), is written back
/// as it was read: a Lease built from this build's types would drop them.
pub fn with_elector_fields(mut raw: DynamicObject, lease: &Lease) -> DynamicObject {
    let spec = lease.spec.clone().unwrap_or_default();
    let owned = serde_json::json!({
        "holderIdentity": spec.holder_identity,
        "leaseDurationSeconds": spec.lease_duration_seconds,
        "acquireTime": spec.acquire_time,
        "renewTime": spec.renew_time,
        "leaseTransitions": spec.lease_transitions,
    });
    if !raw.data.is_object() {
        raw.data = serde_json::json!({});
    }
    let data = raw.data.as_object_mut().expect("made an object above");
    let target = data.entry("spec").or_insert_with(|| serde_json::json!({}));
    if !target.is_object() {
        *target = serde_json::json!({});
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in owned.as_object().into_iter().flatten() {
        if value.is_null() {
            target.remove(key);
        } else {
            target.insert(key.clone(), value.clone());
        }
    }
    raw
}

/// `<hostname>_<uuid>`, as upstream builds identities.
pub fn default_identity() -> String {
    format!("{}_{}", hostname(), uuid::Uuid::new_v4())
}

/// The machine's host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `localhost`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// A won lease, renewed in its own task from the moment [`LeaderSession::start`] is called
/// (right after [`LeaderElector::acquire`] returned `true`) until [`LeaderSession::finish`]:
/// whatever the holder does meanwhile (provider initialisation, token minting,
/// `--controller-start-interval`, draining on shutdown), the lease stays renewed.
///
/// On a loss, `on_lost` runs at once in the renewing task; controller managers exit then (as
/// upstream's `OnStoppedLeading` does), so no write of this process can follow the moment a
/// standby may take over.
pub struct LeaderSession {
    elector: Arc<LeaderElector>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<HoldOutcome>,
}

impl std::fmt::Debug for LeaderSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderSession")
            .field("lease", &self.elector.lease_ref())
            .finish_non_exhaustive()
    }
}

impl LeaderSession {
    /// Starts renewing `elector`'s lease; `on_lost` runs when it is lost.
    pub fn start(elector: Arc<LeaderElector>, on_lost: impl FnOnce() + Send + 'static) -> Self {
        let stop = CancellationToken::new();
        let (el, st) = (elector.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let outcome = el.hold(&st).await;
            if outcome == HoldOutcome::Lost {
                on_lost();
            }
            outcome
        });
        Self { elector, stop, task }
    }

    /// As [`LeaderSession::start`], renewing on a thread of its own with a single-threaded
    /// runtime of its own and the client `make_client` builds there (called on that runtime,
    /// which drives the client's requests): controller work on the process's runtime — a busy
    /// worker thread, a CPU-heavy pass — can then never delay a renewal past the deadline. When
    /// `make_client` fails, the elector's current client is kept (logged). `on_lost` runs on
    /// the renewal thread.
    pub fn start_dedicated(
        elector: Arc<LeaderElector>,
        make_client: impl FnOnce() -> Result<Client, String> + Send + 'static,
        on_lost: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = CancellationToken::new();
        let (el, st) = (elector.clone(), stop.clone());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("lease-{}", elector.config.name))
            .spawn(move || {
                let outcome = runtime.block_on(async move {
                    match make_client() {
                        Ok(client) => el.use_client(client),
                        Err(e) => warn!(lease = %el.lease_ref(), error = %e, "no client of its own for the lease renewal; using the elector's"),
                    }
                    let outcome = el.hold(&st).await;
                    match outcome {
                        HoldOutcome::Lost => on_lost(),
                        // `stop` is cancelled by `finish`, once the holder has drained: release
                        // here, with this runtime's client (it ends with the runtime).
                        HoldOutcome::Shutdown => el.release().await,
                    }
                    outcome
                });
                let _ = done_tx.send(outcome);
            })?;
        let task = tokio::spawn(async move { done_rx.await.unwrap_or(HoldOutcome::Lost) });
        Ok(Self { elector, stop, task })
    }

    /// The elector (e.g. for its health check).
    pub fn elector(&self) -> &Arc<LeaderElector> {
        &self.elector
    }

    /// Stops renewing and releases the lease (if still held): call after the controllers
    /// stopped. Returns how holding ended (a dedicated session has released the lease on its
    /// own thread by then).
    pub async fn finish(self) -> HoldOutcome {
        self.stop.cancel();
        let outcome = self.task.await.unwrap_or(HoldOutcome::Lost);
        if outcome == HoldOutcome::Shutdown {
            self.elector.release().await;
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_write_keeps_every_field_it_does_not_own() {
        let raw: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "cloud-controller-manager", "namespace": "kube-system", "resourceVersion": "7"},
            "spec": {
                "holderIdentity": "old",
                "leaseDurationSeconds": 15,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "preferredHolder": "someone",
                "aFieldOfAFutureRelease": {"x": 1}
            }
        }))
        .unwrap();
        let lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("me".into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime("2026-02-02T00:00:00Z".parse().unwrap())),
                ..Default::default()
            }),
            ..Default::default()
        };
        let written = serde_json::to_value(with_elector_fields(raw, &lease)).unwrap();
        assert_eq!(written["metadata"]["resourceVersion"], "7");
        let spec = &written["spec"];
        assert_eq!(spec["holderIdentity"], "me");
        assert_eq!(spec["preferredHolder"], "someone");
        assert_eq!(spec["aFieldOfAFutureRelease"], serde_json::json!({"x": 1}));
        assert!(
            spec.get("acquireTime").is_none(),
            "a None of the elector's clears the field"
        );
        assert!(
            spec["renewTime"]
                .as_str()
                .unwrap()
                .starts_with("2026-02-02T00:00:00")
        );
    }

    fn cfg(lease: u64, renew: u64, retry: u64) -> LeaderElectionConfig {
        LeaderElectionConfig {
            namespace: "kube-system".into(),
            name: "cloud-controller-manager".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
        }
    }

    #[test]
    fn timing_rules() {
        assert!(cfg(15, 10, 2).validate().is_ok());
        assert!(
            cfg(10, 10, 2)
                .validate()
                .unwrap_err()
                .contains("--leader-elect-lease-duration")
        );
        assert!(
            cfg(15, 2, 2)
                .validate()
                .unwrap_err()
                .contains("--leader-elect-renew-deadline")
        );
    }

    #[test]
    fn identity_has_host_and_uuid() {
        let id = default_identity();
        let (host, uuid) = id.rsplit_once('_').unwrap();
        assert!(!host.is_empty());
        assert_eq!(uuid.len(), 36);
    }
}
