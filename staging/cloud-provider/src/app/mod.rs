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

/// The provider a binary links: its name (the `--cloud-provider` default), factory, and the
/// controllers it keeps off unless named in `--controllers` (`#[non_exhaustive]`: built with
/// [`ProviderSpec::new`] and the `with_*` methods; fields may be added in a minor release).
#[derive(Clone)]
#[non_exhaustive]
pub struct ProviderSpec {
    /// Provider name (`aws`, `vsphere`, …).
    pub name: String,
    /// Builds the provider from its [`FactoryContext`] (the cloud config, the cluster name,
    /// the provider's flags, a Kubernetes client builder).
    pub factory: ContextFactory,
    /// The provider's own flags, added to the command (usually `<Flags as
    /// clap::Args>::augment_args` of a derive with `#[command(next_help_heading = "…")]`); the
    /// factory reads them with [`FactoryContext::flags`].
    pub flags: Vec<fn(clap::Command) -> clap::Command>,
    /// Canonical controller names off by default.
    pub disabled_by_default: Vec<String>,
    /// When the route controller is on only by default (`*`) and `--cluster-cidr` is not set,
    /// skip it with a warning instead of refusing to start (upstream refuses; cloud-provider-aws
    /// keeps the route controller in its default set although most AWS clusters need no routes).
    pub skip_default_route_controller_without_cluster_cidr: bool,
    /// Stop (gracefully, then exit 1 so that the pod restarts) when the `--cloud-config` file
    /// changes, as cloud-provider-vsphere does: the provider reads its file once.
    pub restart_on_config_change: bool,
    /// Controllers the provider adds to the framework's four, in start order (after them), and
    /// those that replace one of the four ([`ProviderSpec::replaces`]).
    pub controllers: Vec<ProviderController>,
    /// Canonical names of the built-in controllers the provider's controllers of the same name
    /// replace ([`ProviderSpec::replace_controller`]).
    pub replaces: Vec<&'static str>,
    /// Commands of the binary besides running the controllers (`<binary> <command> …`).
    pub commands: Vec<ProviderCommand>,
}

/// A command of a provider's binary besides running the controllers: `<binary> <name> [flags]`
/// (e.g. the AWS binary's `orphans`). It has its own flags (the CCM's flags do not apply to it)
/// and decides its exit code; logging is set up for it as for the CCM.
#[derive(Clone)]
pub struct ProviderCommand {
    /// The sub-command's name.
    pub name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    /// Adds its flags (usually `<Flags as clap::Args>::augment_args`).
    pub flags: fn(clap::Command) -> clap::Command,
    /// Runs it with its parsed flags.
    pub run: fn(clap::ArgMatches) -> futures::future::BoxFuture<'static, ExitCode>,
}

impl std::fmt::Debug for ProviderCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderCommand")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Starts a configured [`ProviderController`]: spawns it on the shared context, or says why it
/// is skipped (logged as "Skipping").
pub type ProviderControllerStart =
    Arc<dyn Fn(ControllerContext) -> Result<tokio::task::JoinHandle<()>, BoxError> + Send + Sync>;

/// Reads a [`ProviderController`]'s flags from the parsed command line and returns how to start
/// it (see [`ProviderController::configure`]).
pub type ProviderControllerConfigure =
    Arc<dyn Fn(&clap::ArgMatches) -> Result<ProviderControllerStart, BoxError> + Send + Sync>;

/// A controller a provider adds to the cloud controllers — what upstream's provider `main`
/// does by adding an entry to `controllerInitializers`, an alias, a flag set and (for
/// cloud-provider-aws's tagging controller) a place in `ControllersDisabledByDefault` — or one
/// that replaces a built-in controller ([`ProviderSpec::replace_controller`]).
///
/// It is then one of the command's controllers in every respect: `--controllers` (name and
/// aliases, `*` when on by default), its own `--help` section, per-controller credentials
/// under [`ProviderController::client_name`], the `running_managed_controllers` metric, a
/// health check, leader migration (it is never assigned to kube-controller-manager, which
/// does not know it), and supervision (a panic in its task stops the process).
///
/// ```
/// use k8s_cloud_provider::app::{ProviderController, ProviderControllerStart};
/// let c = ProviderController::new("firewall", "firewall-controller", |_flags| {
///     let start: ProviderControllerStart =
///         std::sync::Arc::new(|_ctx| Ok(tokio::spawn(async { /* reconcile until aborted */ })));
///     Ok(start)
/// })
/// .with_aliases(&["fw"])
/// .enabled_by_default(false);
/// assert_eq!(c.name, "firewall");
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ProviderController {
    /// Canonical name (`--controllers`, health check, leader migration, metrics label).
    pub name: &'static str,
    /// Other names `--controllers` accepts.
    pub aliases: &'static [&'static str],
    /// Client name: the service account with `--use-service-account-credentials`, and the
    /// user agent `cloud-controller-manager/<client name>`.
    pub client_name: &'static str,
    /// Whether `*` in `--controllers` enables it.
    pub enabled_by_default: bool,
    /// Adds its flags to the command (usually `<Flags as clap::Args>::augment_args` of a
    /// derive with `#[command(next_help_heading = "…")]`).
    pub flags: fn(clap::Command) -> clap::Command,
    /// Reads its flags from the parsed command line and returns how to start it. Called at
    /// start-up, before any connection is made, only when the controller is enabled: an `Err`
    /// (naming the flag and its value) stops the command like any invalid flag.
    pub configure: ProviderControllerConfigure,
}

impl ProviderController {
    /// A controller on by default, without aliases or flags, configured (and started) by
    /// `configure`.
    pub fn new<F>(name: &'static str, client_name: &'static str, configure: F) -> Self
    where
        F: Fn(&clap::ArgMatches) -> Result<ProviderControllerStart, BoxError> + Send + Sync + 'static,
    {
        Self {
            name,
            aliases: &[],
            client_name,
            enabled_by_default: true,
            flags: |c| c,
            configure: Arc::new(configure),
        }
    }

    /// Sets [`ProviderController::aliases`].
    pub fn with_aliases(mut self, aliases: &'static [&'static str]) -> Self {
        self.aliases = aliases;
        self
    }

    /// Sets [`ProviderController::enabled_by_default`].
    pub fn enabled_by_default(mut self, enabled: bool) -> Self {
        self.enabled_by_default = enabled;
        self
    }

    /// Sets [`ProviderController::flags`].
    pub fn with_flags(mut self, flags: fn(clap::Command) -> clap::Command) -> Self {
        self.flags = flags;
        self
    }
}

impl std::fmt::Debug for ProviderController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderController")
            .field("name", &self.name)
            .field("aliases", &self.aliases)
            .field("client_name", &self.client_name)
            .field("enabled_by_default", &self.enabled_by_default)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ProviderSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderSpec")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ProviderSpec {
    /// A spec with every controller on by default. The factory is a closure
    /// `|ctx: FactoryContext| async move { … }` returning `Result<P, E>` for any
    /// [`CloudProvider`] `P` (see [`IntoFactory`]), or a [`crate::registry::Factory`].
    pub fn new(name: &str, factory: impl IntoFactory) -> Self {
        Self {
            name: name.into(),
            factory: factory.into_factory(),
            flags: Vec::new(),
            disabled_by_default: Vec::new(),
            skip_default_route_controller_without_cluster_cidr: false,
            restart_on_config_change: false,
            controllers: Vec::new(),
            replaces: Vec::new(),
            commands: Vec::new(),
        }
    }

    /// Adds flags of the provider's own to the command (see [`ProviderSpec::flags`]).
    pub fn with_flags(mut self, flags: fn(clap::Command) -> clap::Command) -> Self {
        self.flags.push(flags);
        self
    }

    /// Adds a command of the binary (see [`ProviderCommand`]).
    pub fn with_command(mut self, command: ProviderCommand) -> Self {
        self.commands.push(command);
        self
    }

    /// Adds a controller of the provider's own (see [`ProviderController`]).
    pub fn with_controller(mut self, controller: ProviderController) -> Self {
        self.controllers.push(controller);
        self
    }

    /// Replaces the built-in controller `builtin` (its canonical name, e.g.
    /// `service-lb-controller`, or its short name, `service`) with the provider's `controller`,
    /// which takes its place in every respect: its canonical name, its `--controllers` names
    /// (the built-in's aliases and the controller's own), its start order, its default, its
    /// leader-migration name and metrics label; the built-in is not started. As a Go provider
    /// that puts its own constructor under the built-in's key of `controllerInitializers`.
    /// [`ProviderSpec::check`] refuses a name that is no built-in controller.
    pub fn replace_controller(mut self, builtin: &str, mut controller: ProviderController) -> Self {
        match controllers::CONTROLLERS
            .iter()
            .find(|c| c.name == builtin || c.legacy_name == builtin)
        {
            Some(b) => {
                controller.name = b.name;
                self.replaces.push(b.name);
            }
            None => {
                // Kept under its own name; `check` names the mistake.
                self.replaces
                    .push(Box::leak(format!("unknown:{builtin}").into_boxed_str()));
            }
        }
        self.controllers.push(controller);
        self
    }

    /// Whether `name` is a built-in controller the provider replaces.
    fn replaced(&self, name: &str) -> bool {
        self.replaces.contains(&name)
    }

    /// Canonical names of every controller of the command: the framework's four (or the
    /// provider's controllers that replace them, in their places), then the provider's own, in
    /// start order.
    pub fn controller_names(&self) -> Vec<&'static str> {
        let mut names = controllers::CONTROLLER_NAMES.to_vec();
        names.extend(
            self.controllers
                .iter()
                .map(|c| c.name)
                .filter(|n| !self.replaced(n)),
        );
        names
    }

    /// Checks that every controller name and alias (the framework's and the provider's) names
    /// one controller only, and that every command name is unique: a provider controller
    /// called like a built-in one (`service`, `cloud-node-controller`, …) would otherwise be
    /// started beside it under the same `--controllers` name. Called by [`run`] and [`main`]
    /// before anything else; the error names the clash.
    pub fn check(&self) -> Result<(), String> {
        let mut owner: HashMap<&str, &str> = HashMap::new();
        let mut clashes = Vec::new();
        for r in &self.replaces {
            if let Some(unknown) = r.strip_prefix("unknown:") {
                clashes.push(format!(
                    "{unknown:?} is no built-in controller to replace (built-in: {})",
                    controllers::CONTROLLER_NAMES.join(", ")
                ));
            }
        }
        let mut replaced_once = std::collections::HashSet::new();
        for r in &self.replaces {
            if !replaced_once.insert(*r) {
                clashes.push(format!("the built-in controller {r:?} is replaced twice"));
            }
        }
        let mut claim = |name: &'static str, controller: &'static str| match owner.insert(name, controller) {
            Some(previous) if previous != controller || name == controller => clashes.push(format!(
                "{name:?} names both {previous:?} and the provider's {controller:?}"
            )),
            _ => {}
        };
        for c in &controllers::CONTROLLERS {
            claim(c.name, c.name);
            claim(c.legacy_name, c.name);
            for a in c.extra_aliases {
                claim(a, c.name);
            }
        }
        for c in &self.controllers {
            // A replacement takes the built-in's names: its canonical name is claimed already.
            if !self.replaced(c.name) {
                claim(c.name, c.name);
            }
            for a in c.aliases {
                claim(a, c.name);
            }
        }
        let mut commands = std::collections::HashSet::new();
        for c in &self.commands {
            if !commands.insert(c.name) {
                clashes.push(format!("the command {:?} is given twice", c.name));
            }
        }
        if clashes.is_empty() {
            Ok(())
        } else {
            Err(format!("provider {:?}: {}", self.name, clashes.join("; ")))
        }
    }

    /// Sets [`ProviderSpec::restart_on_config_change`].
    pub fn restart_on_config_change(mut self) -> Self {
        self.restart_on_config_change = true;
        self
    }
}

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
        let mut aliases = vec![c.legacy_name];
        aliases.extend_from_slice(c.extra_aliases);
        // A replacement's own aliases join the built-in's.
        for p in spec
            .controllers
            .iter()
            .filter(|p| p.name == c.name && spec.replaced(c.name))
        {
            aliases.extend_from_slice(p.aliases);
        }
        r.register(
            c.name,
            &aliases,
            !spec.disabled_by_default.iter().any(|d| d == c.name),
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
        if errors.is_empty() {
            Ok(Self { provided })
        } else {
            Err(errors)
        }
    }

    /// Client name of a controller (for per-controller credentials and user agents).
    fn client_name(&self, canonical: &str) -> &'static str {
        match (
            self.provided.get(canonical),
            controllers::controller_spec(canonical),
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
            None => start_controller(name, ctx),
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
    info!(version = env!("CARGO_PKG_VERSION"), provider = %opts.cloud.cloud_provider, "starting cloud-controller-manager");
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
    let route_enabled = registry.is_enabled(controllers::route::NAME, &validated.controllers);
    // Upstream fails to start whenever the route controller is on without --cluster-cidr. A
    // provider may ask to skip it instead when it is on by default only ("*"): then it is not
    // started and a warning says why (see `start_set`).
    let route_named = !spec.skip_default_route_controller_without_cluster_cidr
        || validated
            .controllers
            .iter()
            .any(|c| c == controllers::route::NAME);
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
mod tests {
    use super::*;

    #[test]
    fn worker_threads_default_to_one_and_follow_the_environment() {
        assert_eq!(worker_threads(None), Ok(1));
        assert_eq!(worker_threads(Some("4")), Ok(4));
        assert_eq!(worker_threads(Some(" 2 ")), Ok(2));
        for bad in ["0", "", "two", "-1"] {
            let e = worker_threads(Some(bad)).unwrap_err();
            assert!(
                e.contains("TOKIO_WORKER_THREADS") && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }

    fn no_cloud() -> crate::registry::Factory {
        Arc::new(|_| Box::pin(async { Err("no cloud in this test".into()) }))
    }

    /// A replacement of the service controller takes its place, names, default and start
    /// order; the built-in is not started; unknown or repeated replacements are refused.
    #[test]
    fn a_provider_controller_replaces_a_built_in_one_in_its_place() {
        let mine = || {
            ProviderController::new("my-service", "my-service-controller", |_| {
                let start: ProviderControllerStart = Arc::new(|_| Err("not started in this test".into()));
                Ok(start)
            })
            .with_aliases(&["my-lb"])
        };
        let spec = ProviderSpec::new("test", no_cloud())
            .with_controller(greeter())
            .replace_controller("service", mine());
        spec.check().unwrap();
        let names = spec.controller_names();
        assert_eq!(
            names,
            controllers::CONTROLLER_NAMES
                .iter()
                .copied()
                .chain(["greeter"])
                .collect::<Vec<_>>()
        );
        let registry = controller_registry(&spec);
        let options = parse_from(&spec, ["ccm", "--controllers=*,-my-lb,greeter", "--greeting=hi"]).unwrap();
        let validated = options.validate(&registry).unwrap();
        assert!(
            !registry.is_enabled(controllers::service::NAME, &validated.controllers),
            "the replacement answers to its own alias too"
        );
        let options = parse_from(&spec, ["ccm"]).unwrap();
        let validated = options.validate(&registry).unwrap();
        assert!(
            registry.is_enabled(controllers::service::NAME, &validated.controllers),
            "on by default as the built-in"
        );
        let starters = Starters::configure(&spec, &validated, &registry).unwrap();
        assert_eq!(
            starters.client_name(controllers::service::NAME),
            "my-service-controller"
        );
        assert!(
            starters.provided.contains_key(controllers::service::NAME),
            "the provider's is started"
        );

        let e = ProviderSpec::new("test", no_cloud())
            .replace_controller("firewall", mine())
            .check()
            .unwrap_err();
        assert!(
            e.contains("\"firewall\" is no built-in controller to replace"),
            "{e}"
        );
        let e = ProviderSpec::new("test", no_cloud())
            .replace_controller("service", mine())
            .replace_controller("service-lb-controller", mine())
            .check()
            .unwrap_err();
        assert!(e.contains("replaced twice"), "{e}");
    }

    /// The provider's own flags, for the closure factory test.
    #[derive(Debug, clap::Args)]
    #[command(next_help_heading = "Mycloud flags")]
    struct MycloudFlags {
        /// The region to manage.
        #[arg(long = "mycloud-region")]
        region: String,
    }

    struct Mycloud;

    #[crate::async_trait]
    impl CloudProvider for Mycloud {
        fn provider_name(&self) -> &str {
            "mycloud"
        }
    }

    /// A closure factory sees the cloud config, the cluster name and the provider's own flags,
    /// which `--help` lists and a missing one refuses by name.
    #[tokio::test]
    async fn a_closure_factory_gets_the_provider_flags_and_the_cluster_name() {
        let spec = ProviderSpec::new("mycloud", |ctx: FactoryContext| async move {
            let flags: MycloudFlags = ctx.flags()?;
            if flags.region != "eu-1"
                || ctx.cluster_name != "prod"
                || ctx.config.as_deref() != Some(&b"x"[..])
            {
                return Err(format!("unexpected context: {ctx:?} {flags:?}"));
            }
            Ok(Mycloud)
        })
        .with_flags(<MycloudFlags as clap::Args>::augment_args);
        let help = command(&spec).render_long_help().to_string();
        assert!(help.contains("--mycloud-region"), "{help}");
        let options = parse_from(&spec, ["ccm", "--mycloud-region=eu-1", "--cluster-name=prod"]).unwrap();
        let ctx = FactoryContext::new(Some(b"x".to_vec()))
            .with_cluster_name(options.generic.cluster_name.clone())
            .with_matches(options.matches.clone());
        assert!((spec.factory)(ctx.clone()).await.is_ok());
        let e = parse_from(&spec, ["ccm"]).err().unwrap().to_string();
        assert!(e.contains("--mycloud-region"), "a required provider flag: {e}");
        let other = FactoryContext::new(Some(b"x".to_vec()))
            .with_cluster_name("prod")
            .with_matches(
                parse_from(&spec, ["ccm", "--mycloud-region=us-9"])
                    .unwrap()
                    .matches,
            );
        let e = (spec.factory)(other).await.err().unwrap().to_string();
        assert!(e.contains("us-9"), "the factory's error: {e}");
        assert!(
            ctx.client("x").is_err(),
            "no Kubernetes configuration in this test"
        );
    }

    /// A provider controller with one flag `--greeting`, which must not be empty.
    fn greeter() -> ProviderController {
        ProviderController::new("greeter", "greeter-controller", |m| {
            let greeting = m.get_one::<String>("greeting").cloned().unwrap_or_default();
            if greeting.is_empty() {
                return Err("--greeting must not be empty".into());
            }
            let start: ProviderControllerStart = Arc::new(|_| Err("not started in this test".into()));
            Ok(start)
        })
        .with_aliases(&["hello"])
        .enabled_by_default(false)
        .with_flags(|c| c.arg(clap::Arg::new("greeting").long("greeting").default_value("")))
    }

    fn configured(args: &[&str]) -> Result<Starters, Vec<String>> {
        let spec = ProviderSpec::new("test", no_cloud()).with_controller(greeter());
        let registry = controller_registry(&spec);
        let options = parse_from(&spec, std::iter::once("ccm").chain(args.iter().copied()))
            .map_err(|e| vec![e.to_string()])?;
        let validated = options.validate(&registry)?;
        Starters::configure(&spec, &validated, &registry)
    }

    #[test]
    fn a_flag_given_twice_takes_the_last_value_as_go_does() {
        let spec = ProviderSpec::new("test", no_cloud());
        let args = [
            "ccm",
            "--v=2",
            "--leader-elect=true",
            "--controllers=*",
            "--v=4",
            "--leader-elect=false",
            "--controllers=cloud-node,service",
        ];
        let options = parse_from(&spec, args).expect("a repeated flag is accepted");
        assert_eq!(options.logging.verbosity, 4);
        assert!(!options.leader_election.leader_elect);
        // A list flag adds to what it had, as pflag's string slices do.
        assert_eq!(options.generic.controllers, ["*", "cloud-node", "service"]);
    }

    #[test]
    fn a_provider_controller_is_a_controller_of_the_command() {
        let spec = ProviderSpec::new("test", no_cloud()).with_controller(greeter());
        command(&spec).debug_assert();
        assert_eq!(spec.controller_names().last(), Some(&"greeter"));
        // Off by default: not configured (its flags not checked) unless named, by name or alias.
        assert!(configured(&[]).expect("valid").provided.is_empty());
        for named in ["--controllers=*,greeter", "--controllers=hello"] {
            let errors = configured(&[named])
                .err()
                .expect("its flag is checked once enabled");
            assert_eq!(errors, ["--greeting must not be empty"], "{named}");
            let ok = configured(&[named, "--greeting=hi"]).expect("valid");
            assert_eq!(ok.client_name("greeter"), "greeter-controller");
        }
        assert!(
            configured(&["--controllers=*,-greeter"])
                .expect("valid")
                .provided
                .is_empty()
        );
    }

    #[test]
    fn a_controller_named_like_another_is_refused_before_anything_starts() {
        assert_eq!(
            ProviderSpec::new("test", no_cloud())
                .with_controller(greeter())
                .check(),
            Ok(())
        );
        let clash = |name: &'static str, aliases: &'static [&'static str]| {
            ProviderSpec::new("test", no_cloud())
                .with_controller(greeter())
                .with_controller(ProviderController {
                    name,
                    aliases,
                    ..greeter()
                })
                .check()
                .unwrap_err()
        };
        assert_eq!(
            clash("service", &[]),
            "provider \"test\": \"service\" names both \"service-lb-controller\" and the provider's \"service\""
        );
        assert!(
            clash("my-routes", &["route"])
                .contains("\"route\" names both \"node-route-controller\" and the provider's \"my-routes\""),
            "{}",
            clash("my-routes", &["route"])
        );
        assert!(
            clash("greeter", &[])
                .contains("\"greeter\" names both \"greeter\" and the provider's \"greeter\"")
        );
        assert!(
            clash("other", &["hello"])
                .contains("\"hello\" names both \"greeter\" and the provider's \"other\"")
        );
    }

    #[tokio::test]
    async fn a_controller_task_that_panics_is_counted_and_reported_as_fatal() {
        let metrics = Arc::new(Metrics::new());
        let failed: Arc<ControllerFailure> = Arc::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn(async { panic!("loop bug") });
        supervise_controller(
            "service-lb-controller",
            task,
            failed.clone(),
            metrics.clone(),
            stop,
        )
        .await
        .expect("the watcher itself does not panic");
        assert!(failed.token.is_cancelled());
        let why = failed.what.lock().clone().expect("a reason");
        assert!(
            why.contains("\"service-lb-controller\" panicked: loop bug"),
            "{why}"
        );
        assert_eq!(
            metrics
                .panics_total
                .with_label_values(&["service-lb-controller"])
                .get(),
            1
        );
    }

    #[tokio::test]
    async fn a_controller_that_stops_at_shutdown_is_no_failure() {
        let metrics = Arc::new(Metrics::new());
        let failed: Arc<ControllerFailure> = Arc::default();
        let stop = CancellationToken::new();
        let s2 = stop.clone();
        let task = tokio::spawn(async move { s2.cancelled().await });
        let watcher = supervise_controller(
            "cloud-node-controller",
            task,
            failed.clone(),
            metrics,
            stop.clone(),
        );
        stop.cancel();
        watcher.await.expect("watcher");
        assert!(!failed.token.is_cancelled());
    }
}
