//! What runs while the primary lease is held: the controllers' shared context (clients,
//! informers, the provider's `Initialize`), the controllers started and supervised, the
//! informers supervised, and the drain.

use super::leader::renew_lease;
#[allow(clippy::wildcard_imports)]
use super::*;

/// Everything that runs while the primary lock is held (or without leader election).
pub(super) struct Held<'a, F: FnOnce() + Send + Clone + 'static> {
    pub(super) validated: &'a ValidatedOptions,
    pub(super) registry: &'a ControllerRegistry,
    pub(super) starters: Starters,
    /// Every controller of the command (see [`ProviderSpec::controller_names`]).
    pub(super) names: Vec<&'static str>,
    pub(super) cloud: Arc<dyn CloudProvider>,
    pub(super) root: kube::Client,
    pub(super) le_client: Option<kube::Client>,
    /// `--dry-run`: what every client and the provider record instead of writing.
    pub(super) dry_run: Option<DryRun>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) endpoints: Endpoints,
    pub(super) controllers_stop: CancellationToken,
    pub(super) migration: Arc<parking_lot::Mutex<Option<LeaderSession>>>,
    pub(super) on_migration_lost: F,
    pub(super) tasks: Arc<TaskList>,
    /// Builds a lease session's own client (see [`renew_lease`]).
    pub(super) lease_client: LeaseClientFactory,
}

impl<F: FnOnce() + Send + Clone + 'static> Held<'_, F> {
    /// Prepares and starts the controllers, contends for the migration lock, waits for
    /// `shutdown`, then drains. The leases stay renewed by their sessions throughout.
    pub(super) async fn run(
        self,
        config: kube::Config,
        shutdown: &CancellationToken,
    ) -> Result<(), AppError> {
        let Held {
            validated,
            registry,
            starters,
            names,
            cloud,
            root,
            le_client,
            dry_run,
            metrics,
            endpoints,
            controllers_stop,
            migration,
            on_migration_lost,
            tasks,
            lease_client,
        } = self;
        // Controllers: the context (clients, informers, Initialize) once, then the sets.
        let running = match prepare(
            validated,
            cloud.clone(),
            root.clone(),
            config,
            metrics.clone(),
            &endpoints,
            controllers_stop.clone(),
            starters,
            dry_run.clone(),
            tasks.clone(),
        )
        .await
        {
            Ok(r) => Arc::new(r),
            Err(e) => {
                controllers_stop.cancel();
                return Err(e);
            }
        };
        let classify = |name: &str| match &validated.leader_migration {
            Some((_, resolved)) => {
                LeaderMigrationConfiguration::classify(resolved, name, leadermigration::CCM)
            }
            None => Classification::NonMigrated,
        };
        let primary_set: Vec<&'static str> = names
            .iter()
            .copied()
            .filter(|n| classify(n) == Classification::NonMigrated)
            .collect();
        let migrated_set: Vec<&'static str> = names
            .iter()
            .copied()
            .filter(|n| classify(n) == Classification::Migrated)
            .collect();
        for name in names.iter().filter(|n| classify(n) == Classification::Unowned) {
            info!(
                controller = name,
                "not running {name:?}: leader migration assigns it to kube-controller-manager"
            );
        }
        start_set(&running, validated, registry, &primary_set, &metrics, &endpoints).await;

        // Leader migration: the migrated controllers start only once the migration lock is
        // held too; from then on it is renewed by its own session.
        if let (Some((lm, _)), Some(le), Some(le_client)) =
            (&validated.leader_migration, &validated.leader_election, le_client)
        {
            let mut mle = le.clone();
            mle.name = lm.leader_name.clone();
            let m = LeaderElector::new(
                le_client,
                mle,
                Some(metrics.leader_election_master_status.clone()),
            );
            {
                let m2 = m.clone();
                endpoints
                    .healthz
                    .add("leaderMigration", Arc::new(move || m2.check()));
            }
            let (running2, validated2, registry2, metrics2, endpoints2, cloud2, root2) = (
                running.clone(),
                validated.clone(),
                registry.clone(),
                metrics.clone(),
                endpoints.clone(),
                cloud.clone(),
                root.clone(),
            );
            let stop = controllers_stop.clone();
            let migration_task = tokio::spawn(async move {
                info!(lease = %m.config().name, controllers = ?migrated_set, "waiting for the migration lock");
                if !m.acquire(&stop).await {
                    return;
                }
                *migration.lock() = Some(renew_lease(m.clone(), lease_client, on_migration_lost));
                info!(lease = %m.config().name, "acquired the migration lock: starting the migrated controllers");
                if let Err(e) = cloud2
                    .initialize(InitContext {
                        client: root2,
                        nodes: running2.ctx.nodes.store(),
                        shutdown: stop.clone(),
                        dry_run,
                        events: running2
                            .events
                            .recorder(&provider_component(cloud2.provider_name())),
                    })
                    .await
                {
                    warn!(error = %e, "cloud provider Initialize for the migrated controllers failed");
                }
                start_set(
                    &running2,
                    &validated2,
                    &registry2,
                    &migrated_set,
                    &metrics2,
                    &endpoints2,
                )
                .await;
            });
            tasks.add(&migration_task);
        }

        // Run until shutdown or a controller's failure, then drain (the leases are still
        // renewed meanwhile).
        let failed = tokio::select! {
            _ = shutdown.cancelled() => None,
            _ = running.failed.token.cancelled() => running.failed.what.lock().clone(),
        };
        info!("stopping controllers");
        controllers_stop.cancel();
        let stop = Instant::now();
        let handles: Vec<_> = std::mem::take(&mut *running.handles.lock());
        if tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(handles))
            .await
            .is_err()
        {
            // The leases are released after this: nothing of this process may run on then.
            warn!("the controllers did not stop within 10 s: aborting them");
            if !running.tasks.abort_and_wait(Duration::from_secs(2)).await {
                warn!("some controller tasks did not end within 2 s of being aborted");
            }
        }
        // The provider closes its cloud sessions (vSphere logs out); bounded like the rest.
        if tokio::time::timeout(Duration::from_secs(5), cloud.shutdown())
            .await
            .is_err()
        {
            warn!("the cloud provider did not shut down within 5 s");
        }
        if !running.events.flush(Duration::from_secs(5)).await {
            warn!("some events could not be written before shutdown");
        }
        for name in names.iter().copied() {
            metrics
                .running_managed_controllers
                .with_label_values(&[legacy_name(name), "cloud-controller-manager"])
                .set(0);
        }
        info!(took = ?stop.elapsed(), "cloud-controller-manager stopped");
        match failed {
            Some(why) => Err(AppError::ControllerFailed(why)),
            None => Ok(()),
        }
    }
}

/// What runs once the primary lock is held.
pub(super) struct Running {
    pub(super) ctx: ControllerContext,
    pub(super) starters: Starters,
    pub(super) events: EventBroadcaster,
    pub(super) handles: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Every task above and the controllers' own, to abort.
    pub(super) tasks: Arc<TaskList>,
    /// Cancelled when a controller's task ends before shutdown (a panic outside a reconcile):
    /// the controller manager then drains, releases its leases and exits non-zero.
    pub(super) failed: Arc<ControllerFailure>,
}

/// The first controller that stopped on its own, and why.
#[derive(Default)]
pub(super) struct ControllerFailure {
    pub(super) token: CancellationToken,
    pub(super) what: parking_lot::Mutex<Option<String>>,
}

impl ControllerFailure {
    pub(super) fn report(&self, why: String) {
        let mut what = self.what.lock();
        if what.is_none() {
            error!("{why}; stopping the controller manager (its leases are released)");
            *what = Some(why);
        }
        self.token.cancel();
    }
}

/// Every task of the running controller manager (informers, controllers, their supervisors),
/// so that they can be stopped for certain: at the drain cap, and before [`run`] returns on a
/// lost lease. A controller's own workers are aborted with it (`controllers::AbortOnDrop`).
#[derive(Default)]
pub(super) struct TaskList(parking_lot::Mutex<Vec<tokio::task::AbortHandle>>);

impl TaskList {
    pub(super) fn add(&self, handle: &tokio::task::JoinHandle<()>) {
        self.0.lock().push(handle.abort_handle());
    }

    /// Aborts every task and waits (at most `limit`) until each has ended. Whether all did.
    pub(super) async fn abort_and_wait(&self, limit: Duration) -> bool {
        let tasks = std::mem::take(&mut *self.0.lock());
        for task in &tasks {
            task.abort();
        }
        let deadline = Instant::now() + limit;
        while !tasks.iter().all(|t| t.is_finished()) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

/// After this long without a successful LIST or WATCH, an informer makes `/readyz` fail.
pub const INFORMER_UNREADY_AFTER: Duration = Duration::from_secs(30);
/// After this long without a successful LIST or WATCH (or at once when its task ends), an
/// informer stops the controller manager (exit 1: the kubelet restarts it with a fresh cache):
/// its controllers would otherwise act on a frozen cache, unseen.
pub const INFORMER_FAIL_AFTER: Duration = Duration::from_secs(120);

/// The shared informers' supervision: the `informers` readiness check, and a watchdog that
/// reports an informer that ended, or has failed to LIST/WATCH for [`INFORMER_FAIL_AFTER`], as
/// a failure of the controller manager (counted in
/// `cloud_controller_manager_informer_failures_total{resource}`).
pub(super) fn supervise_informers(
    ctx: &ControllerContext,
    metrics: &Metrics,
    endpoints: &Endpoints,
    failed: Arc<ControllerFailure>,
    tasks: &TaskList,
) {
    type Health = Arc<dyn Fn() -> k8s_controller_manager::informer::InformerHealth + Send + Sync>;
    let informers: Vec<(&'static str, Health)> = vec![
        ("nodes", {
            let i = ctx.nodes.clone();
            Arc::new(move || i.health())
        }),
        ("services", {
            let i = ctx.services.clone();
            Arc::new(move || i.health())
        }),
    ];
    // Why an informer is not healthy after `limit`, if it is not.
    let verdict = |name: &str, health: &k8s_controller_manager::informer::InformerHealth, limit: Duration| {
        if health.ended {
            return Some(format!(
                "the {name} informer stopped: its cache is no longer refreshed"
            ));
        }
        match &health.failing_since {
            Some((since, error)) if since.elapsed() >= limit => Some(format!(
                "the {name} informer has failed to list or watch for {:.0?}: {error}",
                since.elapsed()
            )),
            _ => None,
        }
    };
    {
        let informers = informers.clone();
        endpoints.readyz.add(
            "informers",
            Arc::new(move || {
                for (name, health) in &informers {
                    if let Some(why) = verdict(name, &health(), INFORMER_UNREADY_AFTER) {
                        return Err(why);
                    }
                }
                Ok(())
            }),
        );
    }
    let failures = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "cloud_controller_manager_informer_failures_total",
            "Shared informers that stopped or could not list/watch for too long (the process then stops).",
        ),
        &["resource"],
    )
    .expect("a valid metric");
    metrics.register(Box::new(failures.clone()));
    for (name, _) in &informers {
        failures.with_label_values(&[name]).inc_by(0);
    }
    let stop = ctx.shutdown.clone();
    let watchdog = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.cancelled() => return,
            }
            for (name, health) in &informers {
                if let Some(why) = verdict(name, &health(), INFORMER_FAIL_AFTER) {
                    failures.with_label_values(&[name]).inc();
                    failed.report(why);
                    return;
                }
            }
        }
    });
    tasks.add(&watchdog);
}

/// Watches a controller's task: a task that ends before `stop` (it panicked, or returned) is
/// reported to `failed`, counted in `controller_panics_total` when it panicked, and its
/// controller is no longer reported as running.
pub(super) fn supervise_controller(
    name: &'static str,
    handle: tokio::task::JoinHandle<()>,
    failed: Arc<ControllerFailure>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // This supervisor aborted (drain cap, lost lease): the controller is aborted with it.
        let _controller = controllers::AbortOnDrop::of([&handle]);
        let result = handle.await;
        if stop.is_cancelled() {
            return;
        }
        metrics
            .running_managed_controllers
            .with_label_values(&[legacy_name(name), "cloud-controller-manager"])
            .set(0);
        let why = match result {
            Ok(()) => format!("controller {name:?} stopped before shutdown"),
            Err(e) if e.is_panic() => {
                metrics.panics_total.with_label_values(&[name]).inc();
                format!(
                    "controller {name:?} panicked: {}",
                    controllers::panic_message(e.into_panic().as_ref())
                )
            }
            Err(e) => format!("controller {name:?} was cancelled: {e}"),
        };
        failed.report(why);
    })
}

/// Builds what the controllers share: clients (one per client name, the provider's controllers'
/// included), events, informers, then the provider's `Initialize`.
#[allow(clippy::too_many_arguments)] // each is a distinct piece of the running process
pub(super) async fn prepare(
    validated: &ValidatedOptions,
    cloud: Arc<dyn CloudProvider>,
    root: kube::Client,
    config: kube::Config,
    metrics: Arc<Metrics>,
    endpoints: &Endpoints,
    stop: CancellationToken,
    starters: Starters,
    dry_run: Option<DryRun>,
    tasks: Arc<TaskList>,
) -> Result<Running, AppError> {
    let opts = &validated.options;
    let (qps, burst) = (opts.generic.kube_api_qps, opts.generic.kube_api_burst);
    // Events go through their own client (and rate limiter) so that recording them never
    // delays a controller's writes.
    let events_client = build_writer_client(
        config.clone(),
        qps,
        burst,
        "cloud-controller-manager/events",
        "events",
        dry_run.clone(),
    )?;
    let events = EventBroadcaster::start(events_client, hostname(), hostname());

    // One client (and QPS budget) per controller client name, as upstream's client builder.
    let mut clients = HashMap::new();
    let mut client_names = vec![
        controllers::node::CLIENT_NAME,
        controllers::service::CLIENT_NAME,
        controllers::route::CLIENT_NAME,
    ];
    client_names.extend(starters.provided.values().map(|(client, _)| *client));
    client_names.sort_unstable();
    client_names.dedup();
    for name in client_names {
        let client = if opts.generic.use_service_account_credentials && dry_run.is_none() {
            clients::service_account_client(&root, &config, name, qps, burst, stop.clone())
                .await
                .map_err(AppError::ServiceAccounts)?
        } else {
            build_writer_client(
                config.clone(),
                qps,
                burst,
                &format!("cloud-controller-manager/{name}"),
                name,
                dry_run.clone(),
            )?
        };
        clients.insert(name.to_string(), client);
    }
    let controllers_config = ControllersConfig {
        cluster_name: opts.generic.cluster_name.clone(),
        cluster_cidrs: validated.cluster_cidrs.clone(),
        node_status_update_frequency: opts.node.node_status_update_frequency,
        node_monitor_period: opts.generic.node_monitor_period,
        route_reconciliation_period: opts.generic.route_reconciliation_period,
        concurrent_node_syncs: opts.node.concurrent_node_syncs.max(1) as usize,
        concurrent_node_status_updates: opts.node.concurrent_node_status_updates.max(0) as usize,
        concurrent_service_syncs: opts.service.concurrent_service_syncs.max(1) as usize,
        cloud_call_timeout: opts.generic.cloud_call_timeout,
    };
    let mut ctx = ControllerContext::new(
        root.clone(),
        cloud.clone(),
        controllers_config,
        metrics,
        events.clone(),
        stop.clone(),
    );
    ctx.clients = Arc::new(clients);
    let handles = ctx.start_informers();
    for handle in &handles {
        tasks.add(handle);
    }
    let failed: Arc<ControllerFailure> = Arc::default();
    supervise_informers(&ctx, &ctx.metrics, endpoints, failed.clone(), &tasks);
    {
        let (nodes, services) = (ctx.nodes.store(), ctx.services.store());
        endpoints.readyz.add(
            "informer-sync",
            Arc::new(move || {
                if nodes.has_synced() && services.has_synced() {
                    Ok(())
                } else {
                    Err("shared informers have not synced".into())
                }
            }),
        );
    }
    cloud
        .initialize(InitContext {
            client: root,
            nodes: ctx.nodes.store(),
            shutdown: stop.clone(),
            dry_run,
            events: events.recorder(&provider_component(cloud.provider_name())),
        })
        .await
        .map_err(|e| AppError::Initialize(e.to_string()))?;
    Ok(Running {
        ctx,
        starters,
        events,
        handles: parking_lot::Mutex::new(handles),
        tasks,
        failed,
    })
}

/// Starts the enabled controllers among `names`.
pub(super) async fn start_set(
    running: &Arc<Running>,
    validated: &ValidatedOptions,
    registry: &ControllerRegistry,
    names: &[&'static str],
    metrics: &Arc<Metrics>,
    endpoints: &Endpoints,
) {
    let opts = &validated.options;
    for name in names.iter().copied() {
        if !registry.is_enabled(name, &validated.controllers) {
            warn!(controller = name, "{name:?} is disabled");
            continue;
        }
        let is_route = running.starters.builtin(name) == controllers::route::NAME;
        if is_route && !opts.generic.configure_cloud_routes {
            info!("Will not configure cloud provider routes, --configure-cloud-routes: false");
            continue;
        }
        if is_route && validated.cluster_cidrs.is_empty() {
            // Only reachable when on by default (named without --cluster-cidr fails at start).
            continue;
        }
        match running.starters.start(name, &running.ctx) {
            Ok(handle) => {
                let client = running.starters.client_name(name);
                info!(controller = name, client, "Started {name:?}");
                metrics
                    .running_managed_controllers
                    .with_label_values(&[legacy_name(name), "cloud-controller-manager"])
                    .set(1);
                running.tasks.add(&handle);
                let probe = handle.abort_handle();
                let (ctx, controller) = (running.ctx.clone(), name.to_string());
                endpoints.healthz.add(
                    name,
                    Arc::new(move || {
                        if probe.is_finished() {
                            Err("controller stopped".into())
                        } else {
                            ctx.stuck_worker(&controller)
                        }
                    }),
                );
                let supervised = supervise_controller(
                    name,
                    handle,
                    running.failed.clone(),
                    metrics.clone(),
                    running.ctx.shutdown.clone(),
                );
                running.tasks.add(&supervised);
                running.handles.lock().push(supervised);
            }
            Err(reason) => warn!(controller = name, reason = %reason, "Skipping {name:?}: {reason}"),
        }
        if !opts.generic.controller_start_interval.is_zero() {
            let jitter = 1.0 + rand::random::<f64>();
            tokio::time::sleep(opts.generic.controller_start_interval.mul_f64(jitter)).await;
        }
    }
}

/// The component a provider's own Events are recorded under: `cloud-provider-<name>` (OCCM's
/// `cloud-provider-openstack`).
fn provider_component(provider: &str) -> String {
    format!("cloud-provider-{provider}")
}
