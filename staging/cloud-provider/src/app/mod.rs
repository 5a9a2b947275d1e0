//! The cloud-controller-manager command (upstream `app/`): what a provider binary runs.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn my_factory() -> k8s_cloud_provider::registry::Factory { unimplemented!() }
//! fn main() -> std::process::ExitCode {
//!     k8s_cloud_provider::app::main(k8s_cloud_provider::app::ProviderSpec::new("mycloud", my_factory()))
//! }
//! ```
//!
//! Start-up (spec §6.1): parse and validate flags (every error names its flag) → Kubernetes
//! client (kubeconfig / `--master` / in-cluster; QPS/burst) → cloud provider from
//! `--cloud-config` → cluster-ID check → HTTPS `/healthz` `/livez` `/readyz` `/metrics` →
//! leader election on a Lease → shared informers → `Initialize` → the enabled controllers.
//!
//! The lease is renewed from the moment it is won by a [`LeaderSession`] of its own, on a
//! thread and runtime of its own with its own client (its own request budget), so provider
//! `Initialize`, token minting, `--controller-start-interval` and busy controllers on the
//! process's runtime never let it lapse. Losing it (or the migration lock) — noticed at the
//! latest when the renew deadline, counted from the last successful renewal's *sending*,
//! passes — fences every cloud write at once (from the renewal thread: a write attempted after
//! that is an error), aborts every controller task and its workers, and makes [`run`] return
//! and [`main`] exit 1 at once, as upstream does: no write of this process follows the moment a
//! standby may take over.
//!
//! Shutdown: SIGTERM/SIGINT stop the controllers, close the provider's sessions, flush queued
//! events — the leases still being renewed meanwhile — then release the leases and exit 0
//! (bounded: 10 s for controllers — then they are aborted, so that nothing runs on once the
//! lease is released —, 5 s for the provider, 5 s for events).
//!
//! The shared informers are supervised: one whose LIST/WATCH has failed for
//! [`INFORMER_UNREADY_AFTER`] fails `/readyz`; after [`INFORMER_FAIL_AFTER`] (or at once when
//! it stops) the controller manager stops (exit 1) rather than run on a frozen cache.
//!
//! With `--enable-leader-migration` (spec §7): the controllers the migration configuration
//! assigns to this component (or `*`) start only after the *migration* Lease is held as well;
//! those assigned to kube-controller-manager do not run; the rest run under the primary lock.
//! Losing either lock exits 1.

mod access;
mod clients;
pub mod factory;
pub mod feature_gates;
mod leader;
pub mod options;
mod running;
mod serving;
mod spec;

use std::{
    collections::HashMap,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::{CommandFactory, FromArgMatches};
use k8s_controller_manager::{
    auth::{Delegation, DelegationOptions, lookup_client_ca},
    client::{build_client, build_writer_client, load_config},
    controllers::ControllerRegistry,
    events::EventBroadcaster,
    leaderelection::{LeaderElector, LeaderSession, hostname},
    leadermigration::{self, Classification, LeaderMigrationConfiguration},
    metrics::Metrics,
    server::{ClientCa, Endpoints, HealthChecks, ServingOptions, serve},
    writes::DryRun,
};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use access::ClusterAccessFlags;
pub use factory::{ContextFactory, FactoryContext, IntoFactory};
pub use options::{Options, ValidatedOptions};
pub use running::{INFORMER_FAIL_AFTER, INFORMER_UNREADY_AFTER};
pub use spec::{
    ControllerRename, ProviderCommand, ProviderController, ProviderControllerConfigure,
    ProviderControllerStart, ProviderSpec,
};

use leader::{LeaseClientFactory, LossSignal, win_lease};
#[cfg(test)]
use running::{ControllerFailure, supervise_controller};
use running::{Held, TaskList};
use serving::start_serving;

use crate::{
    cloud::{CloudProvider, InitContext},
    controllers::{self, ControllerContext, ControllersConfig, start_controller},
    dry_run::AuditedCloud,
    error::BoxError,
    registry::read_config,
};

/// How often the `--cloud-config` file is compared with what the provider read.
const CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Cancels `shutdown` and sets `changed` when the file at `path` no longer holds `initial`.
async fn watch_config_file(
    path: std::path::PathBuf,
    initial: Option<Vec<u8>>,
    changed: Arc<std::sync::atomic::AtomicBool>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CONFIG_POLL_INTERVAL) => {}
            _ = shutdown.cancelled() => return,
        }
        let now = std::fs::read(&path).ok();
        if now != initial {
            error!(
                path = %path.display(),
                "the cloud config file changed; stopping so that the cloud-controller-manager restarts with it"
            );
            changed.store(true, std::sync::atomic::Ordering::SeqCst);
            shutdown.cancel();
            return;
        }
    }
}

/// Why the application stopped with an error (`#[non_exhaustive]`: a variant may be added in
/// a minor release).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// One or more flags are invalid (messages name the flags).
    #[error("invalid flags: {0}")]
    InvalidFlags(String),
    /// The Kubernetes client could not be built.
    #[error(transparent)]
    Client(#[from] k8s_controller_manager::client::ClientError),
    /// The cloud-config file could not be read.
    #[error("{0}")]
    CloudConfig(String),
    /// The provider's factory failed.
    #[error("Cloud provider could not be initialized: {0}")]
    CloudInit(String),
    /// The provider has no cluster ID and `--allow-untagged-cloud` is off.
    #[error(
        "no ClusterID found.  A ClusterID is required for the cloud provider to function properly.  This check can be bypassed by setting the allow-untagged-cloud option"
    )]
    NoClusterId,
    /// The HTTPS server could not start.
    #[error(transparent)]
    Server(#[from] k8s_controller_manager::server::ServerError),
    /// Per-controller service-account credentials could not be set up.
    #[error("--use-service-account-credentials: {0}")]
    ServiceAccounts(String),
    /// The provider failed to initialise after leadership was acquired.
    #[error("cloud provider Initialize failed: {0}")]
    Initialize(String),
    /// A lease was lost (`leaderelection lost` or `migration leaderelection lost`).
    #[error("{0}")]
    LeaderElectionLost(&'static str),
    /// A controller stopped on its own (a panic outside a reconcile, which are caught and
    /// retried): the process exits 1 after releasing its leases, to be restarted.
    #[error("{0}")]
    ControllerFailed(String),
    /// The [`ProviderSpec`] names a controller, alias or command twice (see
    /// [`ProviderSpec::check`]): a mistake of the provider's code, reported before anything
    /// starts.
    #[error("invalid provider spec: {0}")]
    InvalidSpec(String),
    /// The `--cloud-config` file changed (providers with
    /// [`ProviderSpec::restart_on_config_change`]); the process exits 1 to be restarted.
    #[error("the cloud config file {0} changed; exiting so that it is read again")]
    CloudConfigChanged(String),
}

/// This crate's version (`k8s-cloud-provider`'s, the framework's).
pub const FRAMEWORK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Legacy (1.20) controller names, used as the `running_managed_controllers` label (a
/// provider's own controller is labelled with its name, as upstream's alias map does).
fn legacy_name(canonical: &str) -> &str {
    controllers::controller_spec(canonical).map_or(canonical, |c| c.legacy_name)
}

/// The controllers and aliases this command knows: [`controllers::CONTROLLERS`], each on by
/// default unless the provider keeps it off, and the provider's own.
pub fn controller_registry(spec: &ProviderSpec) -> ControllerRegistry {
    let mut r = ControllerRegistry::new();
    for c in &controllers::CONTROLLERS {
        let (name, mut aliases) = spec.builtin_names(c);
        // A replacement's own aliases join the built-in's.
        for p in spec
            .controllers
            .iter()
            .filter(|p| p.name == c.name && spec.replaced(c.name))
        {
            aliases.extend_from_slice(p.aliases);
        }
        r.register(
            name,
            &aliases,
            !spec.disabled_by_default.iter().any(|d| d == c.name || d == name),
        );
    }
    for c in spec.controllers.iter().filter(|c| !spec.replaced(c.name)) {
        r.register(
            c.name,
            c.aliases,
            c.enabled_by_default && !spec.disabled_by_default.iter().any(|d| d == c.name),
        );
    }
    r
}

/// How the enabled controllers are started: the framework's from
/// [`controllers::CONTROLLERS`], the provider's from what their
/// [`ProviderController::configure`] returned.
#[derive(Clone, Default)]
struct Starters {
    /// Canonical name → (client name, start) of the provider's enabled controllers.
    provided: HashMap<&'static str, (&'static str, ProviderControllerStart)>,
    /// Canonical name in this binary → the built-in's, for the renamed built-ins.
    renamed: HashMap<&'static str, &'static str>,
}

impl Starters {
    /// Reads the flags of the provider's enabled controllers; every error is returned.
    fn configure(
        spec: &ProviderSpec,
        validated: &ValidatedOptions,
        registry: &ControllerRegistry,
    ) -> Result<Self, Vec<String>> {
        let mut provided = HashMap::new();
        let mut errors = Vec::new();
        for c in &spec.controllers {
            if !registry.is_enabled(c.name, &validated.controllers) {
                continue;
            }
            match (c.configure)(&validated.options.matches) {
                Ok(start) => {
                    provided.insert(c.name, (c.client_name, start));
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        let renamed = spec.renames.iter().map(|r| (r.name, r.builtin)).collect();
        if errors.is_empty() {
            Ok(Self { provided, renamed })
        } else {
            Err(errors)
        }
    }

    /// The built-in controller a canonical name of this binary stands for (itself unless the
    /// provider renamed the built-in).
    fn builtin<'a>(&self, canonical: &'a str) -> &'a str {
        self.renamed.get(canonical).copied().unwrap_or(canonical)
    }

    /// Client name of a controller (for per-controller credentials and user agents).
    fn client_name(&self, canonical: &str) -> &'static str {
        match (
            self.provided.get(canonical),
            controllers::controller_spec(self.builtin(canonical)),
        ) {
            (Some((client, _)), _) => client,
            (None, Some(c)) => c.client_name,
            (None, None) => controllers::node::CLIENT_NAME,
        }
    }

    /// Builds and starts one controller.
    fn start(&self, name: &str, ctx: &ControllerContext) -> Result<tokio::task::JoinHandle<()>, String> {
        match self.provided.get(name) {
            Some((_, start)) => start(ctx.clone()).map_err(|e| e.to_string()),
            None => start_controller(self.builtin(name), ctx),
        }
    }
}

/// The clap command with the binary's name and `--cloud-provider` default.
pub fn command(spec: &ProviderSpec) -> clap::Command {
    let default: &'static str = Box::leak(spec.name.clone().into_boxed_str());
    let name: &'static str = Box::leak(format!("cloud-controller-manager-{}", spec.name).into_boxed_str());
    // A flag given twice takes the last value, as Go's pflag does: a manifest that appends
    // `--v=4` to a base's `--v=2` (kustomize patches, the chart's `args`) must start.
    let mut command = Options::command()
        .name(name)
        .args_override_self(true)
        .mut_arg("cloud_provider", |a| a.default_value(default));
    if let Some(version) = spec.version {
        let shown: &'static str =
            Box::leak(format!("{version} (k8s-cloud-provider {FRAMEWORK_VERSION})").into_boxed_str());
        command = command.version(shown);
    }
    // A controller's and a command's flags are added with clap's `augment_args`, which takes
    // the flag struct's doc comment (written for the code's readers) as the about text: the
    // CCM's own, and each command's registered one, are what `--help` shows.
    let (about, long_about) = (command.get_about().cloned(), command.get_long_about().cloned());
    for flags in &spec.flags {
        command = flags(command);
    }
    for c in &spec.controllers {
        command = (c.flags)(command);
    }
    command = match about {
        Some(a) => command.about(a),
        None => command.about(None::<&'static str>),
    };
    command = match long_about {
        Some(a) => command.long_about(a),
        None => command.long_about(None::<&'static str>),
    };
    for c in &spec.commands {
        command = command.subcommand(
            (c.flags)(clap::Command::new(c.name))
                .about(c.about)
                .long_about(None::<&str>),
        );
    }
    if !spec.commands.is_empty() {
        command = command.args_conflicts_with_subcommands(true);
    }
    command
}

/// Parses command-line arguments (including the program name).
pub fn parse_from<I, T>(spec: &ProviderSpec, args: I) -> Result<Options, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = command(spec).try_get_matches_from(args)?;
    let mut options = Options::from_arg_matches(&matches)?;
    options.unset_empty_values();
    options.matches = matches;
    Ok(options)
}

/// Sets up `tracing` from `-v` and `--logging-format` (`RUST_LOG` overrides the level).
pub fn init_logging(flags: &options::LoggingFlags) {
    let level = match flags.verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    let default = format!(
        "{level},hyper=warn,hyper_util=warn,h2=warn,rustls=warn,tower=warn,kube_client=warn,aws_smithy_runtime=warn,aws_config=warn,aws_runtime=warn"
    );
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file, a pipe or `kubectl logs` gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if flags.logging_format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The whole program: parse, run until a signal, and map the outcome to an exit code.
pub fn main(spec: ProviderSpec) -> ExitCode {
    if let Err(e) = spec.check() {
        eprintln!("error: invalid provider spec: {e}");
        return ExitCode::FAILURE;
    }
    let options = match parse_from(&spec, std::env::args_os()) {
        Ok(o) => o,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_logging(&options.logging);
    let workers = match worker_threads(std::env::var("TOKIO_WORKER_THREADS").ok().as_deref()) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some((name, matches)) = options.matches.subcommand()
        && let Some(c) = spec.commands.iter().find(|c| c.name == name)
    {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let code = runtime.block_on((c.run)(matches.clone()));
        runtime.shutdown_timeout(Duration::from_secs(1));
        return code;
    }
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signal(shutdown.clone()));
        run(options, spec, shutdown).await
    });
    if let Err(e @ AppError::LeaderElectionLost(_)) = &result {
        // As upstream: exit at once, without waiting for anything that still runs.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "{e}");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Worker threads of the async runtime unless `TOKIO_WORKER_THREADS` says otherwise.
///
/// One, whatever the number of cores: the work of a cloud-controller-manager is waiting for
/// the API server and the cloud (at 5000 Nodes and `--kube-api-qps=1000` it used 0.3 of a
/// core), and with glibc every thread that allocates gets a malloc arena of its own that keeps
/// room for that thread's largest transient (a cloud answer being parsed): with one worker
/// instead of one per core the peak RSS at 1000 Nodes fell from 33.0 to 30.9 MB on 2 cores,
/// more on bigger machines (`docs/scale.md`). The thread that runs [`main`]'s top-level future
/// polls it alongside the worker, so two threads still run.
pub const DEFAULT_WORKER_THREADS: usize = 1;

/// The number of worker threads for the runtime [`main`] runs on: `TOKIO_WORKER_THREADS`
/// (`worker_threads_env`) when set, else [`DEFAULT_WORKER_THREADS`]. A value that is not a
/// positive number is an error naming the variable and the value (tokio itself would panic).
pub fn worker_threads(worker_threads_env: Option<&str>) -> Result<usize, String> {
    match worker_threads_env {
        None => Ok(DEFAULT_WORKER_THREADS),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "environment variable TOKIO_WORKER_THREADS: {v:?} is not a positive number of threads"
            )),
        },
    }
}

/// Cancels `token` on SIGTERM or SIGINT.
pub async fn cancel_on_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        warn!("could not install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("received SIGTERM, shutting down"),
        _ = int.recv() => info!("received SIGINT, shutting down"),
    }
    token.cancel();
}

/// Runs the cloud-controller-manager until `shutdown` is cancelled (then stops gracefully and
/// returns `Ok`) or a fatal error happens.
pub async fn run(options: Options, spec: ProviderSpec, shutdown: CancellationToken) -> Result<(), AppError> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    spec.check().map_err(AppError::InvalidSpec)?;
    let registry = controller_registry(&spec);
    let validated = options
        .validate(&registry)
        .map_err(|e| AppError::InvalidFlags(e.join("; ")))?;
    let starters = Starters::configure(&spec, &validated, &registry)
        .map_err(|e| AppError::InvalidFlags(e.join("; ")))?;
    let opts = &validated.options;
    info!(
        version = spec.version.unwrap_or(FRAMEWORK_VERSION),
        framework = FRAMEWORK_VERSION,
        provider = %opts.cloud.cloud_provider,
        "starting cloud-controller-manager"
    );
    let config = load_config(opts.misc.kubeconfig.as_deref(), opts.misc.master.as_deref()).await?;
    let (qps, burst) = (opts.generic.kube_api_qps, opts.generic.kube_api_burst);
    let dry_run = opts.generic.dry_run.then(DryRun::new);
    if dry_run.is_some() {
        info!(
            "shadow mode (--dry-run): every controller runs and reads; nothing is written to the API server (server-side dry runs) or to the cloud; each write is logged as \"dry run: would write\""
        );
        if opts.generic.use_service_account_credentials {
            info!(
                "--dry-run: --use-service-account-credentials is ignored (no ServiceAccount or token is created)"
            );
        }
    }
    let root = build_writer_client(
        config.clone(),
        qps,
        burst,
        "cloud-controller-manager",
        "cloud-controller-manager",
        dry_run.clone(),
    )?;
    let (cloud, config_changed) = build_cloud(&validated, &registry, &spec, Some(&config), &shutdown).await?;
    // Every cloud write of the controllers passes here (logged; not made with --dry-run).
    // A lost lease fences them at once (see `LossSignal`).
    let lost = LossSignal::default();
    let cloud: Arc<dyn CloudProvider> =
        Arc::new(AuditedCloud::new(cloud, dry_run.clone()).with_fence(lost.token.clone()));
    let (metrics, endpoints) = start_serving(opts, cloud.as_ref(), &shutdown).await?;
    if let Some(d) = &dry_run {
        metrics.register(Box::new(d.actions.clone()));
    }

    // The primary lease, renewed by its own session, thread and client from the moment it is
    // won.
    let lease_client: LeaseClientFactory = {
        let config = config.clone();
        Arc::new(move || {
            build_client(config.clone(), qps, burst, "leader-election").map_err(|e| e.to_string())
        })
    };
    let primary = match &validated.leader_election {
        Some(le) => {
            let le_client = build_client(config.clone(), qps, burst, "leader-election")?;
            let Some(session) = win_lease(
                le,
                &le_client,
                lease_client.clone(),
                &metrics,
                &endpoints,
                &lost,
                &shutdown,
            )
            .await
            else {
                info!("shut down before acquiring leadership");
                return Ok(());
            };
            Some((session, le_client))
        }
        None => None,
    };

    let controllers_stop = shutdown.child_token();
    let tasks = Arc::new(TaskList::default());
    let migration: Arc<parking_lot::Mutex<Option<LeaderSession>>> = Arc::default();
    let held = Held {
        validated: &validated,
        registry: &registry,
        starters,
        names: spec.controller_names(),
        cloud,
        root,
        le_client: primary.as_ref().map(|(_, c)| c.clone()),
        dry_run,
        metrics,
        endpoints,
        controllers_stop: controllers_stop.clone(),
        migration: migration.clone(),
        on_migration_lost: lost.on("migration leaderelection lost"),
        tasks: tasks.clone(),
        lease_client,
    };
    let outcome = tokio::select! {
        r = held.run(config, &shutdown) => r,
        _ = lost.token.cancelled() => {
            // Stop every controller at once, without draining, and return (the binary's main
            // then exits the process): no write of this process may follow the moment a
            // standby can take the lease — a program embedding `run` included.
            controllers_stop.cancel();
            if !tasks.abort_and_wait(Duration::from_secs(1)).await {
                warn!("some controller tasks did not end within 1 s of being aborted");
            }
            return Err(AppError::LeaderElectionLost(*lost.what.lock()));
        }
    };
    // Drained (or failed to start): stop renewing and release, migration lock first.
    let migration_session = migration.lock().take();
    if let Some(m) = migration_session {
        m.finish().await;
    }
    if let Some((session, _)) = primary {
        session.finish().await;
    }
    outcome?;
    if config_changed.load(std::sync::atomic::Ordering::SeqCst) {
        let path = opts
            .cloud
            .cloud_config
            .as_deref()
            .map(|p| p.display().to_string());
        return Err(AppError::CloudConfigChanged(path.unwrap_or_default()));
    }
    Ok(())
}

/// The cloud provider from `--cloud-config` (watched when the provider wants a restart on a
/// change), with the cluster-ID and routes checks.
async fn build_cloud(
    validated: &ValidatedOptions,
    registry: &ControllerRegistry,
    spec: &ProviderSpec,
    kube_config: Option<&kube::Config>,
    shutdown: &CancellationToken,
) -> Result<(Arc<dyn CloudProvider>, Arc<std::sync::atomic::AtomicBool>), AppError> {
    let opts = &validated.options;
    if opts.cloud.cloud_provider != spec.name {
        return Err(AppError::InvalidFlags(format!(
            "--cloud-provider={:?}: this binary links only the {:?} provider",
            opts.cloud.cloud_provider, spec.name
        )));
    }
    let cloud_config = read_config(opts.cloud.cloud_config.as_deref())
        .map_err(|e| AppError::CloudConfig(format!("--cloud-config: {e}")))?;
    let config_changed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if spec.restart_on_config_change
        && let Some(path) = opts.cloud.cloud_config.as_deref()
    {
        tokio::spawn(watch_config_file(
            path.into(),
            cloud_config.clone(),
            config_changed.clone(),
            shutdown.clone(),
        ));
    }
    let mut context = FactoryContext::new(cloud_config)
        .with_cluster_name(opts.generic.cluster_name.clone())
        .with_matches(opts.matches.clone());
    context.config_path = opts.cloud.cloud_config.clone();
    if let Some(config) = kube_config {
        context = context.with_kube_config(
            config.clone(),
            opts.generic.kube_api_qps,
            opts.generic.kube_api_burst,
        );
    }
    let cloud: Arc<dyn CloudProvider> = (spec.factory)(context)
        .await
        .map_err(|e| AppError::CloudInit(e.to_string()))?;
    if !cloud.has_cluster_id() {
        if opts.cloud.allow_untagged_cloud {
            warn!(
                "detected a cluster without a ClusterID.  A ClusterID will be required in the future.  Please tag your cluster to avoid any future issues"
            );
        } else {
            return Err(AppError::NoClusterId);
        }
    }
    let route_name = spec.name_of_builtin(controllers::route::NAME);
    let route_enabled = registry.is_enabled(route_name, &validated.controllers);
    // Upstream fails to start whenever the route controller is on without --cluster-cidr. A
    // provider may ask to skip it instead when it is on by default only ("*"): then it is not
    // started and a warning says why (see `start_set`).
    let route_named = !spec.skip_default_route_controller_without_cluster_cidr
        || validated.controllers.iter().any(|c| c == route_name);
    if opts.generic.configure_cloud_routes
        && route_enabled
        && cloud.routes().is_some()
        && validated.cluster_cidrs.is_empty()
        && !route_named
    {
        warn!(
            "the node-route-controller is not started: --cluster-cidr is not set (name it in --controllers together with --cluster-cidr to program routes, or set --configure-cloud-routes=false to silence this)"
        );
    } else if opts.generic.configure_cloud_routes
        && route_enabled
        && cloud.routes().is_some()
        && validated.cluster_cidrs.is_empty()
    {
        return Err(AppError::InvalidFlags(
            "--cluster-cidr must be set: --configure-cloud-routes is true, the node-route-controller is enabled and the cloud provider supports routes (set --cluster-cidr, or --configure-cloud-routes=false, or --controllers=*,-node-route-controller)".into(),
        ));
    }
    Ok((cloud, config_changed))
}

#[cfg(test)]
mod tests;
