//! What a provider binary hands to [`super::main`]: its [`ProviderSpec`] (name, factory, flags,
//! controllers, commands) and the controllers and commands it adds.

#[allow(clippy::wildcard_imports)]
use super::*;

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
    /// Built-in controllers the provider runs under names of its own
    /// ([`ProviderSpec::rename_controller`]).
    pub renames: Vec<ControllerRename>,
    /// Commands of the binary besides running the controllers (`<binary> <command> …`).
    pub commands: Vec<ProviderCommand>,
    /// The binary's version ([`ProviderSpec::with_version`]).
    pub version: Option<&'static str>,
}

/// A built-in controller run under a name of the provider's ([`ProviderSpec::rename_controller`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ControllerRename {
    /// The built-in's canonical name (e.g. `service-lb-controller`).
    pub builtin: &'static str,
    /// Its canonical name in this binary.
    pub name: &'static str,
    /// More names `--controllers` accepts for it (the built-in's own stay accepted).
    pub aliases: &'static [&'static str],
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

/// The canonical name of the built-in controller `name` (canonical or short), or
/// `unknown:<name>` when there is none (kept so that [`ProviderSpec::check`] names the mistake).
fn builtin_named(name: &str) -> Result<&'static str, &'static str> {
    controllers::CONTROLLERS
        .iter()
        .find(|c| c.name == name || c.legacy_name == name)
        .map(|c| c.name)
        .ok_or_else(|| &*Box::leak(format!("unknown:{name}").into_boxed_str()))
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
            renames: Vec::new(),
            commands: Vec::new(),
            version: None,
        }
    }

    /// The binary's version, usually `env!("CARGO_PKG_VERSION")` of the provider's crate: what
    /// `--version` prints (followed by the framework's, `k8s-cloud-provider X.Y.Z`) and the
    /// start-up log names. Without it both name the framework's version only, which is not the
    /// binary's: the framework is versioned apart from the providers built on it.
    pub fn with_version(mut self, version: &'static str) -> Self {
        self.version = Some(version);
        self
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
        match builtin_named(builtin) {
            Ok(b) => {
                controller.name = b;
                self.replaces.push(b);
            }
            // Kept under its own name; `check` names the mistake.
            Err(unknown) => self.replaces.push(unknown),
        }
        self.controllers.push(controller);
        self
    }

    /// Runs the built-in controller `builtin` (its canonical name, e.g. `service-lb-controller`,
    /// or its short name, `service`) under the canonical name `name`, with `aliases`: the name
    /// `--controllers`, `--help`, the logs, the health check, the `running_managed_controllers`
    /// label and leader migration use for it — what a Go provider does by putting the built-in's
    /// constructor under a key of its own in `controllerInitializers`. Unlike in Go, the
    /// built-in's own names (`service`, `service-controller`, `service-lb-controller`) stay
    /// accepted, so that existing manifests and leader-migration configurations keep working;
    /// a provider controller cannot take them ([`ProviderSpec::check`] refuses the clash, an
    /// unknown built-in, a second rename, and the rename of a replaced controller).
    ///
    /// ```
    /// use k8s_cloud_provider::app::ProviderSpec;
    /// # let factory: k8s_cloud_provider::app::ContextFactory =
    /// #     std::sync::Arc::new(|_| Box::pin(async { Err("example".into()) }));
    /// let spec = ProviderSpec::new("example", factory)
    ///     .rename_controller("service", "example-lb-controller", &["lb"]);
    /// spec.check().unwrap();
    /// assert!(spec.controller_names().contains(&"example-lb-controller"));
    /// ```
    pub fn rename_controller(
        mut self,
        builtin: &str,
        name: &'static str,
        aliases: &'static [&'static str],
    ) -> Self {
        // An unknown name is kept as given; `check` names the mistake.
        let builtin = builtin_named(builtin).unwrap_or_else(|unknown| unknown);
        self.renames.push(ControllerRename {
            builtin,
            name,
            aliases,
        });
        self
    }

    /// Whether `name` is a built-in controller the provider replaces.
    pub(super) fn replaced(&self, name: &str) -> bool {
        self.replaces.contains(&name)
    }

    /// The canonical name of the built-in controller `c` in this binary and the other names
    /// `--controllers` accepts for it: its upstream names, and a rename's aliases.
    pub(super) fn builtin_names(&self, c: &controllers::ControllerSpec) -> (&'static str, Vec<&'static str>) {
        let name = self.name_of_builtin(c.name);
        let mut aliases = vec![c.legacy_name];
        aliases.extend_from_slice(c.extra_aliases);
        if name != c.name {
            aliases.push(c.name);
        }
        for r in self.renames.iter().filter(|r| r.builtin == c.name) {
            aliases.extend_from_slice(r.aliases);
        }
        (name, aliases)
    }

    /// The canonical name the built-in controller `builtin` has in this binary: its own, or the
    /// provider's ([`ProviderSpec::rename_controller`]).
    pub(super) fn name_of_builtin(&self, builtin: &'static str) -> &'static str {
        self.renames
            .iter()
            .find(|r| r.builtin == builtin)
            .map_or(builtin, |r| r.name)
    }

    /// Canonical names of every controller of the command: the framework's four (or the
    /// provider's controllers that replace them, in their places), then the provider's own, in
    /// start order.
    pub fn controller_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = controllers::CONTROLLER_NAMES
            .iter()
            .map(|n| self.name_of_builtin(n))
            .collect();
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
        let mut renamed_once = std::collections::HashSet::new();
        for r in &self.renames {
            if let Some(unknown) = r.builtin.strip_prefix("unknown:") {
                clashes.push(format!(
                    "{unknown:?} is no built-in controller to rename (built-in: {})",
                    controllers::CONTROLLER_NAMES.join(", ")
                ));
            } else if !renamed_once.insert(r.builtin) {
                clashes.push(format!(
                    "the built-in controller {:?} is renamed twice",
                    r.builtin
                ));
            } else if self.replaced(r.builtin) {
                clashes.push(format!(
                    "the built-in controller {:?} is both replaced and renamed: give the replacement the name instead",
                    r.builtin
                ));
            }
        }
        let mut claim = |name: &'static str, controller: &'static str| match owner.insert(name, controller) {
            Some(previous) if previous != controller || name == controller => clashes.push(format!(
                "{name:?} names both {previous:?} and the provider's {controller:?}"
            )),
            _ => {}
        };
        for c in &controllers::CONTROLLERS {
            let (name, aliases) = self.builtin_names(c);
            claim(name, name);
            for a in aliases {
                claim(a, name);
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
