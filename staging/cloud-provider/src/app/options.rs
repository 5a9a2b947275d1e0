//! The cloud-controller-manager's flags, with upstream names and defaults (spec §6.2), grouped
//! in `--help` as upstream groups them.
//!
//! Booleans take Go's form (`--leader-elect`, `--leader-elect=false`); durations take Go's
//! (`10s`, `5m0s`).

use std::{net::IpAddr, path::PathBuf, time::Duration};

use clap::{ArgAction, Args, Parser};
use k8s_controller_manager::{
    controllers::ControllerRegistry, duration::parse_go_duration, leaderelection::LeaderElectionConfig,
    leadermigration::LeaderMigrationConfiguration,
};

use crate::{controllers::route::parse_cluster_cidrs, service::helpers::parse_go_bool};

/// A Go boolean flag value (`true`, `false`, `1`, `0`, `t`, `F`, …), as a clap value parser:
/// providers use it for the flags of their own controllers.
pub fn go_bool(s: &str) -> Result<bool, String> {
    parse_go_bool(s).ok_or_else(|| format!("invalid boolean {s:?} (use true or false)"))
}

fn go_duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}

/// A path flag that, as Go's string flags, may be given empty (`--flag=` = not set).
fn optional_path(s: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(s))
}

/// Every flag of the cloud-controller-manager.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "cloud-controller-manager",
    about = "The Cloud controller manager is a daemon that embeds the cloud specific control loops shipped with Kubernetes.",
    version,
    disable_help_subcommand = true,
    max_term_width = 110
)]
pub struct Options {
    /// Cloud provider flags.
    #[command(flatten, next_help_heading = "Cloud provider flags")]
    pub cloud: CloudProviderFlags,
    /// Generic flags.
    #[command(flatten, next_help_heading = "Generic flags")]
    pub generic: GenericFlags,
    /// Leader election flags.
    #[command(flatten, next_help_heading = "Leader election flags")]
    pub leader_election: LeaderElectionFlags,
    /// Leader migration flags.
    #[command(flatten, next_help_heading = "Leader migration flags")]
    pub leader_migration: LeaderMigrationFlags,
    /// Node controller flags.
    #[command(flatten, next_help_heading = "Node controller flags")]
    pub node: NodeControllerFlags,
    /// Service controller flags.
    #[command(flatten, next_help_heading = "Service controller flags")]
    pub service: ServiceControllerFlags,
    /// Secure serving flags.
    #[command(flatten, next_help_heading = "Secure serving flags")]
    pub serving: SecureServingFlags,
    /// Authentication flags.
    #[command(flatten, next_help_heading = "Authentication flags")]
    pub authentication: AuthenticationFlags,
    /// Authorization flags.
    #[command(flatten, next_help_heading = "Authorization flags")]
    pub authorization: AuthorizationFlags,
    /// Misc flags.
    #[command(flatten, next_help_heading = "Misc flags")]
    pub misc: MiscFlags,
    /// Logging flags.
    #[command(flatten, next_help_heading = "Logging flags")]
    pub logging: LoggingFlags,
    /// Webhook flags (no webhook is built in).
    #[command(flatten, next_help_heading = "Webhook flags")]
    pub webhooks: WebhookFlags,
    /// Everything parsed from the command line, including the flags of the controllers a
    /// provider adds ([`crate::app::ProviderController::flags`]), which read them from here.
    #[arg(skip)]
    pub matches: clap::ArgMatches,
}

/// Cloud provider flags.
#[derive(Debug, Clone, Args)]
pub struct CloudProviderFlags {
    /// The provider for cloud services. Empty string for no provider.
    #[arg(long = "cloud-provider", default_value = "")]
    pub cloud_provider: String,
    /// The path to the cloud provider configuration file. Empty string for no configuration file.
    #[arg(long = "cloud-config", value_parser = optional_path)]
    pub cloud_config: Option<PathBuf>,
    /// Allow the cluster to run without the cluster-id on cloud instances (deprecated).
    #[arg(long = "allow-untagged-cloud", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub allow_untagged_cloud: bool,
}

/// Generic controller-manager flags.
#[derive(Debug, Clone, Args)]
pub struct GenericFlags {
    /// A list of controllers to enable. '*' enables all on-by-default controllers, 'foo' enables
    /// the controller named 'foo', '-foo' disables the controller named 'foo'. Controllers:
    /// cloud-node-controller (cloud-node), cloud-node-lifecycle-controller (cloud-node-lifecycle),
    /// service-lb-controller (service), node-route-controller (route), and those the provider
    /// adds (each with its own flag section below).
    #[arg(long = "controllers", value_delimiter = ',', default_value = "*")]
    pub controllers: Vec<String>,
    /// The instance prefix for the cluster.
    #[arg(long = "cluster-name", default_value = "kubernetes")]
    pub cluster_name: String,
    /// CIDR Range for Pods in cluster (comma-separated, one per IP family).
    #[arg(long = "cluster-cidr", default_value = "")]
    pub cluster_cidr: String,
    /// Should CIDRs for Pods be allocated and set on the cloud provider.
    #[arg(long = "allocate-node-cidrs", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub allocate_node_cidrs: bool,
    /// Type of CIDR allocator to use: RangeAllocator or CloudAllocator (used by the node IPAM
    /// controller when the provider offers it; accepted otherwise for compatibility).
    #[arg(long = "cidr-allocator-type", default_value = "RangeAllocator")]
    pub cidr_allocator_type: String,
    /// Should CIDRs allocated by allocate-node-cidrs be configured on the cloud provider.
    #[arg(long = "configure-cloud-routes", default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub configure_cloud_routes: bool,
    /// The period for reconciling routes created for Nodes by cloud provider.
    #[arg(long = "route-reconciliation-period", default_value = "10s", value_parser = go_duration)]
    pub route_reconciliation_period: Duration,
    /// The period for syncing NodeStatus in the cloud-node-lifecycle controller.
    #[arg(long = "node-monitor-period", default_value = "5s", value_parser = go_duration)]
    pub node_monitor_period: Duration,
    /// The resync period in reflectors will be random between MinResyncPeriod and 2*MinResyncPeriod.
    #[arg(long = "min-resync-period", default_value = "12h0m0s", value_parser = go_duration)]
    pub min_resync_period: Duration,
    /// Interval between starting controller managers.
    #[arg(long = "controller-start-interval", default_value = "0s", value_parser = go_duration)]
    pub controller_start_interval: Duration,
    /// The longest a controller waits for one cloud provider call (e.g. EnsureLoadBalancer)
    /// before it abandons it and retries the object later; other objects keep being served.
    /// Not an upstream flag.
    #[arg(long = "cloud-call-timeout", default_value = "5m0s", value_parser = go_duration)]
    pub cloud_call_timeout: Duration,
    /// If true, use individual service account credentials for each controller.
    #[arg(long = "use-service-account-credentials", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub use_service_account_credentials: bool,
    /// QPS to use while talking with kubernetes apiserver.
    #[arg(long = "kube-api-qps", default_value_t = 20.0)]
    pub kube_api_qps: f32,
    /// Burst to use while talking with kubernetes apiserver.
    #[arg(long = "kube-api-burst", default_value_t = 30)]
    pub kube_api_burst: u32,
    /// Content type of requests sent to apiserver (JSON is always used; accepted for compatibility).
    #[arg(
        long = "kube-api-content-type",
        default_value = "application/vnd.kubernetes.protobuf"
    )]
    pub kube_api_content_type: String,
    /// Shadow mode: run every controller against the real cluster and cloud, read everything
    /// and write nothing. API server writes are sent as server-side dry runs (`dryRun=All`),
    /// cloud writes are not made; each is logged ("dry run: would write") and counted in
    /// cloud_controller_manager_dry_run_actions_total{controller,action}. Never takes a lease
    /// (leader election and migration are off) and ignores --use-service-account-credentials.
    /// Not an upstream flag.
    #[arg(long = "dry-run", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub dry_run: bool,
    /// Feature gates (`Name=true|false`, comma-separated); see [`super::feature_gates`].
    #[arg(long = "feature-gates", value_delimiter = ',', value_name = "NAME=BOOL,...",
          help = super::feature_gates::help())]
    pub feature_gates: Vec<String>,
    /// Enable profiling via web interface host:port/debug/pprof/ (Go's profiler: accepted for compatibility; this binary serves no /debug/pprof).
    #[arg(long = "profiling", default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub profiling: bool,
    /// Enable block profiling, if profiling is enabled (Go's profiler: accepted for compatibility, no effect).
    #[arg(long = "contention-profiling", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub contention_profiling: bool,
    /// The plugin to use when cloud provider is set to external (used by kube-controller-manager only: accepted for compatibility, no effect).
    #[arg(long = "external-cloud-volume-plugin", default_value = "")]
    pub external_cloud_volume_plugin: String,
}

/// Leader election flags.
#[derive(Debug, Clone, Args)]
pub struct LeaderElectionFlags {
    /// Start a leader election client and gain leadership before executing the main loop.
    #[arg(long = "leader-elect", default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub leader_elect: bool,
    /// The duration that non-leader candidates will wait after observing a leadership renewal
    /// until attempting to acquire leadership of a led but unrenewed leader slot.
    #[arg(long = "leader-elect-lease-duration", default_value = "15s", value_parser = go_duration)]
    pub lease_duration: Duration,
    /// The interval between attempts by the acting master to renew a leadership slot before it stops leading.
    #[arg(long = "leader-elect-renew-deadline", default_value = "10s", value_parser = go_duration)]
    pub renew_deadline: Duration,
    /// The duration the clients should wait between attempting acquisition and renewal of a leadership.
    #[arg(long = "leader-elect-retry-period", default_value = "2s", value_parser = go_duration)]
    pub retry_period: Duration,
    /// The type of resource object that is used for locking during leader election. Supported option is 'leases'.
    #[arg(long = "leader-elect-resource-lock", default_value = "leases")]
    pub resource_lock: String,
    /// The name of resource object that is used for locking during leader election.
    #[arg(
        long = "leader-elect-resource-name",
        default_value = "cloud-controller-manager"
    )]
    pub resource_name: String,
    /// The namespace of resource object that is used for locking during leader election.
    #[arg(long = "leader-elect-resource-namespace", default_value = "kube-system")]
    pub resource_namespace: String,
}

/// Leader migration flags (spec §7).
#[derive(Debug, Clone, Args)]
pub struct LeaderMigrationFlags {
    /// Whether to enable controller leader migration (needs --leader-elect).
    #[arg(long = "enable-leader-migration", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub enable_leader_migration: bool,
    /// Path to the config file for controller leader migration, or empty to use the value that
    /// reflects default configuration of the controller manager.
    #[arg(long = "leader-migration-config", value_parser = optional_path)]
    pub leader_migration_config: Option<PathBuf>,
}

/// Node controller flags.
#[derive(Debug, Clone, Args)]
pub struct NodeControllerFlags {
    /// Specifies how often the controller updates nodes' status.
    #[arg(long = "node-status-update-frequency", default_value = "5m0s", value_parser = go_duration)]
    pub node_status_update_frequency: Duration,
    /// Number of workers concurrently synchronizing nodes.
    #[arg(
        long = "concurrent-node-syncs",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub concurrent_node_syncs: i32,
    /// Number of workers concurrently updating node statuses (0 = same as --concurrent-node-syncs).
    #[arg(
        long = "concurrent-node-status-updates",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub concurrent_node_status_updates: i32,
    /// The number of workers for syncing NodeStatus in cloud-node-lifecycle-controller (accepted and checked for compatibility: the lifecycle pass here checks the Nodes one after another, each with its own --cloud-call-timeout).
    #[arg(
        long = "concurrent-node-lifecycle-syncs",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub concurrent_node_lifecycle_syncs: i32,
}

/// Service controller flags.
#[derive(Debug, Clone, Args)]
pub struct ServiceControllerFlags {
    /// The number of services that are allowed to sync concurrently.
    #[arg(
        long = "concurrent-service-syncs",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub concurrent_service_syncs: i32,
}

/// Secure serving flags.
#[derive(Debug, Clone, Args)]
pub struct SecureServingFlags {
    /// The IP address on which to listen for the --secure-port port.
    #[arg(long = "bind-address", default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// The port on which to serve HTTPS with authentication and authorization. If 0, don't serve HTTPS at all.
    #[arg(long = "secure-port", default_value_t = crate::well_known::CLOUD_CONTROLLER_MANAGER_PORT)]
    pub secure_port: u16,
    /// The directory where the TLS certs are located. Ignored if --tls-cert-file and --tls-private-key-file are provided.
    #[arg(long = "cert-dir", value_parser = optional_path)]
    pub cert_dir: Option<PathBuf>,
    /// File containing the default x509 Certificate for HTTPS.
    #[arg(long = "tls-cert-file", value_parser = optional_path)]
    pub tls_cert_file: Option<PathBuf>,
    /// File containing the default x509 private key matching --tls-cert-file.
    #[arg(long = "tls-private-key-file", value_parser = optional_path)]
    pub tls_private_key_file: Option<PathBuf>,
    /// A pair of x509 certificate and private key file paths, optionally suffixed with a list of domain patterns which are fully qualified domain names, possibly with prefixed wildcard segments. If no domain patterns are provided, the names of the certificate are extracted. Non-wildcard matches trump over wildcard matches, explicit domain patterns trump over extracted names. For multiple key/certificate pairs, use the --tls-sni-cert-key multiple times. Examples: "example.crt,example.key" or "foo.crt,foo.key:*.foo.com,foo.com". Changed files are served without a restart.
    #[arg(long = "tls-sni-cert-key", value_name = "CERT,KEY[:NAMES]")]
    pub tls_sni_cert_key: Vec<k8s_controller_manager::server::SniCertKey>,
    /// Minimum TLS version supported. Possible values: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13 (TLS 1.0 and 1.1 are never offered by this server: they mean VersionTLS12).
    #[arg(long = "tls-min-version", default_value = "")]
    pub tls_min_version: String,
    /// Comma-separated list of cipher suites for the server (Go's names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256). If omitted, the default cipher suites are used. Suites this server does not implement (CBC, RSA key exchange, 3DES, RC4) are accepted and not offered; the TLS 1.3 suites are always offered.
    #[arg(long = "tls-cipher-suites", value_delimiter = ',')]
    pub tls_cipher_suites: Vec<String>,
    /// Comma-separated list of numeric Go crypto/tls CurveID values, as the allowed key exchange mechanisms for the server, in order of preference: 23 (P-256), 24 (P-384), 29 (X25519), 4588 (X25519MLKEM768); 25 (P-521) is not offered by this server. If omitted, the defaults are used.
    #[arg(long = "tls-curve-preferences", value_delimiter = ',', value_name = "IDS")]
    pub tls_curve_preferences: Vec<String>,
    /// If true, HTTP2 serving will be disabled.
    #[arg(long = "disable-http2-serving", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub disable_http2_serving: bool,
    /// The limit that the server gives to clients for the maximum number of streams in an HTTP/2 connection. Zero means this server's default (16).
    #[arg(long = "http2-max-streams-per-connection", default_value_t = 0)]
    pub http2_max_streams_per_connection: u32,
    /// If true, SO_REUSEADDR will be used when binding the port (it always is on this server, as on Go's on Linux).
    #[arg(long = "permit-address-sharing", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub permit_address_sharing: bool,
    /// If true, SO_REUSEPORT will be used when binding the port, which allows more than one instance to bind on the same address and port.
    #[arg(long = "permit-port-sharing", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub permit_port_sharing: bool,
}

impl SecureServingFlags {
    /// `--tls-curve-preferences` as numbers (Go's int32 slice: empty entries are skipped); an
    /// entry that is not a curve ID is an error naming it.
    pub fn curve_ids(&self) -> Result<Vec<u16>, String> {
        self.tls_curve_preferences
            .iter()
            .map(|c| c.trim())
            .filter(|c| !c.is_empty())
            .map(|c| {
                c.parse::<u16>()
                    .map_err(|_| format!("--tls-curve-preferences: {c:?} is not a numeric curve ID (e.g. 23 for P-256, 29 for X25519)"))
            })
            .collect()
    }
}

/// Delegated authentication of the secure port (see `k8s_controller_manager::auth`).
#[derive(Debug, Clone, Args)]
pub struct AuthenticationFlags {
    /// kubeconfig file pointing at the 'core' kubernetes server with enough rights to create tokenreviews.authentication.k8s.io. This is optional. If empty, the in-cluster configuration is used; outside a cluster all token requests are considered to be anonymous and no client CA is looked up in the cluster.
    #[arg(long = "authentication-kubeconfig", value_parser = optional_path)]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// If false, the authentication-kubeconfig will be used to lookup missing authentication configuration from the cluster.
    #[arg(long = "authentication-skip-lookup", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub authentication_skip_lookup: bool,
    /// The duration to cache responses from the webhook token authenticator.
    #[arg(long = "authentication-token-webhook-cache-ttl", default_value = "10s", value_parser = go_duration)]
    pub authentication_token_webhook_cache_ttl: Duration,
    /// If true, failures to look up missing authentication configuration from the cluster are not considered fatal. Note that this can result in authentication that treats all requests as anonymous.
    #[arg(long = "authentication-tolerate-lookup-failure", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub authentication_tolerate_lookup_failure: bool,
    /// If set, any request presenting a client certificate signed by one of the authorities in the client-ca-file is authenticated with an identity corresponding to the CommonName of the client certificate.
    #[arg(long = "client-ca-file", value_parser = optional_path)]
    pub client_ca_file: Option<PathBuf>,
    /// Root certificate bundle to verify the client certificates of an authenticating front proxy (accepted for compatibility: this server does not trust identities in request headers, so requests through such a proxy are not authenticated by them; a warning says so).
    #[arg(long = "requestheader-client-ca-file", value_parser = optional_path)]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// List of client certificate common names to allow to provide usernames in headers (see --requestheader-client-ca-file).
    #[arg(long = "requestheader-allowed-names", value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,
    /// List of request headers to inspect for usernames (see --requestheader-client-ca-file).
    #[arg(
        long = "requestheader-username-headers",
        value_delimiter = ',',
        default_value = "x-remote-user"
    )]
    pub requestheader_username_headers: Vec<String>,
    /// List of request headers to inspect for groups (see --requestheader-client-ca-file).
    #[arg(
        long = "requestheader-group-headers",
        value_delimiter = ',',
        default_value = "x-remote-group"
    )]
    pub requestheader_group_headers: Vec<String>,
    /// List of request header prefixes to inspect (see --requestheader-client-ca-file).
    #[arg(
        long = "requestheader-extra-headers-prefix",
        value_delimiter = ',',
        default_value = "x-remote-extra-"
    )]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// List of request headers to inspect for UIDs (see --requestheader-client-ca-file).
    #[arg(long = "requestheader-uid-headers", value_delimiter = ',')]
    pub requestheader_uid_headers: Vec<String>,
}

/// Delegated authorization of the secure port (see `k8s_controller_manager::auth`).
#[derive(Debug, Clone, Args)]
pub struct AuthorizationFlags {
    /// A list of HTTP paths to skip during authorization, i.e. these are authorized without contacting the 'core' kubernetes server.
    #[arg(
        long = "authorization-always-allow-paths",
        default_value = "/healthz,/readyz,/livez",
        value_delimiter = ','
    )]
    pub authorization_always_allow_paths: Vec<String>,
    /// kubeconfig file pointing at the 'core' kubernetes server with enough rights to create subjectaccessreviews.authorization.k8s.io. This is optional. If empty, the in-cluster configuration is used; outside a cluster all requests not skipped by authorization are forbidden.
    #[arg(long = "authorization-kubeconfig", value_parser = optional_path)]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// The duration to cache 'authorized' responses from the webhook authorizer.
    #[arg(long = "authorization-webhook-cache-authorized-ttl", default_value = "10s", value_parser = go_duration)]
    pub authorization_webhook_cache_authorized_ttl: Duration,
    /// The duration to cache 'unauthorized' responses from the webhook authorizer.
    #[arg(long = "authorization-webhook-cache-unauthorized-ttl", default_value = "10s", value_parser = go_duration)]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,
}

impl AuthorizationFlags {
    /// The always-allowed paths without empty entries (`--authorization-always-allow-paths=`
    /// means none).
    pub fn always_allow_paths(&self) -> Vec<String> {
        self.authorization_always_allow_paths
            .iter()
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect()
    }
}

/// Misc flags.
#[derive(Debug, Clone, Args)]
pub struct MiscFlags {
    /// Path to kubeconfig file with authorization and master location information.
    #[arg(long = "kubeconfig", value_parser = optional_path)]
    pub kubeconfig: Option<PathBuf>,
    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long = "master")]
    pub master: Option<String>,
}

/// Logging flags.
#[derive(Debug, Clone, Args)]
pub struct LoggingFlags {
    /// Number for the log level verbosity (0–1 info, 2–3 debug, ≥4 trace; RUST_LOG overrides).
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub verbosity: u8,
    /// Sets the log format. Permitted formats: "text", "json".
    #[arg(long = "logging-format", default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,
    /// Comma-separated list of pattern=N settings for klog's file-filtered logging (Go source files: accepted for compatibility; use RUST_LOG=MODULE=debug for one module).
    #[arg(long = "vmodule", value_delimiter = ',', value_name = "PATTERN=N,...")]
    pub vmodule: Vec<String>,
    /// Maximum number of seconds between log flushes (logs are written unbuffered here: accepted for compatibility).
    #[arg(long = "log-flush-frequency", default_value = "5s", value_parser = go_duration)]
    pub log_flush_frequency: Duration,
    /// klog's text-format info buffer size (accepted for compatibility, no effect).
    #[arg(long = "log-text-info-buffer-size", default_value = "0")]
    pub log_text_info_buffer_size: String,
    /// klog's split of info and error messages into stdout and stderr (accepted for compatibility: every message goes to stderr).
    #[arg(long = "log-text-split-stream", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub log_text_split_stream: bool,
}

/// The webhook flags of Go's cloud-controller-manager. It has no built-in webhook, and neither
/// has this one: the flags are accepted so that a manifest written for it runs unchanged, and
/// `--webhooks` naming a webhook is an error.
#[derive(Debug, Clone, Args)]
pub struct WebhookFlags {
    /// A list of webhooks to enable. '*' enables all on-by-default webhooks, 'foo' enables the webhook named 'foo', '-foo' disables the webhook named 'foo'. All webhooks: none.
    #[arg(long = "webhooks", value_delimiter = ',')]
    pub webhooks: Vec<String>,
    /// The IP address on which to listen for the --webhook-secure-port port (no webhook is served).
    #[arg(long = "webhook-bind-address", default_value = "0.0.0.0")]
    pub webhook_bind_address: IpAddr,
    /// Secure port to serve cloud provider webhooks (no webhook is served).
    #[arg(long = "webhook-secure-port", default_value_t = 10260)]
    pub webhook_secure_port: u16,
    /// The directory where the webhook server's TLS certs are located (no webhook is served).
    #[arg(long = "webhook-cert-dir", value_parser = optional_path)]
    pub webhook_cert_dir: Option<PathBuf>,
    /// If true, HTTP2 serving will be disabled for the webhook server (no webhook is served).
    #[arg(long = "webhook-disable-http2-serving", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub webhook_disable_http2_serving: bool,
    /// The webhook server's x509 certificate (no webhook is served).
    #[arg(long = "webhook-tls-cert-file", value_parser = optional_path)]
    pub webhook_tls_cert_file: Option<PathBuf>,
    /// The webhook server's x509 private key (no webhook is served).
    #[arg(long = "webhook-tls-private-key-file", value_parser = optional_path)]
    pub webhook_tls_private_key_file: Option<PathBuf>,
    /// The webhook server's cipher suites (no webhook is served).
    #[arg(long = "webhook-tls-cipher-suites", value_delimiter = ',')]
    pub webhook_tls_cipher_suites: Vec<String>,
    /// The webhook server's key exchange curves (no webhook is served).
    #[arg(long = "webhook-tls-curve-preferences", value_delimiter = ',')]
    pub webhook_tls_curve_preferences: Vec<String>,
    /// The webhook server's minimum TLS version (no webhook is served).
    #[arg(long = "webhook-tls-min-version", default_value = "")]
    pub webhook_tls_min_version: String,
    /// The webhook server's SNI certificate and key pairs (no webhook is served).
    #[arg(long = "webhook-tls-sni-cert-key")]
    pub webhook_tls_sni_cert_key: Vec<String>,
}

impl Options {
    /// Go's string flags given empty (`--cloud-config=`) mean "not set": each such path or
    /// address becomes `None`, as if the flag were not given.
    pub fn unset_empty_values(&mut self) {
        fn unset(p: &mut Option<PathBuf>) {
            if p.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                *p = None;
            }
        }
        for p in [
            &mut self.cloud.cloud_config,
            &mut self.leader_migration.leader_migration_config,
            &mut self.serving.cert_dir,
            &mut self.serving.tls_cert_file,
            &mut self.serving.tls_private_key_file,
            &mut self.authentication.client_ca_file,
            &mut self.authentication.requestheader_client_ca_file,
            &mut self.misc.kubeconfig,
            &mut self.webhooks.webhook_cert_dir,
            &mut self.webhooks.webhook_tls_cert_file,
            &mut self.webhooks.webhook_tls_private_key_file,
        ] {
            unset(p);
        }
        if self.misc.master.as_deref().is_some_and(str::is_empty) {
            self.misc.master = None;
        }
    }
}

/// Options after validation, in the types the application uses.
#[derive(Debug, Clone)]
pub struct ValidatedOptions {
    /// The flags as given.
    pub options: Options,
    /// `--controllers` with aliases resolved.
    pub controllers: Vec<String>,
    /// Parsed `--cluster-cidr`.
    pub cluster_cidrs: Vec<ipnet::IpNet>,
    /// Leader election settings (when `--leader-elect`).
    pub leader_election: Option<LeaderElectionConfig>,
    /// Leader migration (when `--leader-elect` and `--enable-leader-migration`): the
    /// configuration and its entries resolved to canonical controller names → component.
    pub leader_migration: Option<(
        LeaderMigrationConfiguration,
        std::collections::BTreeMap<String, String>,
    )>,
}

impl Options {
    /// Warns about flags of Go's cloud-controller-manager set to what this one does not do.
    fn warn_compatibility_only(&self) {
        if self.generic.contention_profiling {
            tracing::warn!("--contention-profiling has no effect: this binary has no Go profiler");
        }
        if !self.generic.external_cloud_volume_plugin.is_empty() {
            tracing::warn!(
                "--external-cloud-volume-plugin has no effect: only kube-controller-manager uses it"
            );
        }
        if !self.logging.vmodule.iter().all(|v| v.trim().is_empty()) {
            tracing::warn!(
                vmodule = %self.logging.vmodule.join(","),
                "--vmodule has no effect (it names Go source files): use --v, or RUST_LOG=MODULE=debug for one module"
            );
        }
        if self.logging.log_text_split_stream {
            tracing::warn!("--log-text-split-stream has no effect: every message goes to stderr");
        }
        if self
            .authentication
            .requestheader_client_ca_file
            .as_ref()
            .is_some_and(|p| !p.as_os_str().is_empty())
        {
            tracing::warn!(
                "--requestheader-client-ca-file: identities in request headers (an authenticating front proxy) are not trusted by this server; such requests are authenticated by their bearer token or client certificate only"
            );
        }
    }

    /// Validates every flag, collecting all problems; each message names its flag.
    pub fn validate(&self, registry: &ControllerRegistry) -> Result<ValidatedOptions, Vec<String>> {
        let mut errors = Vec::new();
        if self.cloud.cloud_provider.is_empty() {
            errors.push("--cloud-provider cannot be empty".to_string());
        } else if self.cloud.cloud_provider == "external" {
            errors.push("--cloud-provider=external is for kubelet and kube-controller-manager; the cloud-controller-manager needs a real provider".to_string());
        }
        let controllers = match registry.resolve(&self.generic.controllers) {
            Ok(c) => c,
            Err(e) => {
                errors.extend(e.into_iter().map(|m| format!("--controllers: {m}")));
                Vec::new()
            }
        };
        let cluster_cidrs = match parse_cluster_cidrs(&self.generic.cluster_cidr) {
            Ok(c) => {
                if !c.is_empty()
                    && let Err(e) = crate::controllers::route::validate_cluster_cidrs(&c)
                {
                    errors.push(format!("--cluster-cidr: {e}"));
                }
                c
            }
            Err(e) => {
                errors.push(e);
                Vec::new()
            }
        };
        if self.node.concurrent_node_syncs <= 0 {
            errors.push(format!(
                "--concurrent-node-syncs must be a positive number (got {})",
                self.node.concurrent_node_syncs
            ));
        }
        if self.node.concurrent_node_status_updates < 0 {
            errors.push(format!(
                "--concurrent-node-status-updates cannot be a negative number (got {})",
                self.node.concurrent_node_status_updates
            ));
        }
        if self.service.concurrent_service_syncs <= 0 {
            errors.push(format!(
                "--concurrent-service-syncs must be a positive number (got {})",
                self.service.concurrent_service_syncs
            ));
        }
        if self.generic.kube_api_qps < 0.0 {
            errors.push(format!(
                "--kube-api-qps cannot be negative (got {})",
                self.generic.kube_api_qps
            ));
        }
        for (flag, d) in [
            ("--cloud-call-timeout", self.generic.cloud_call_timeout),
            ("--node-monitor-period", self.generic.node_monitor_period),
            (
                "--route-reconciliation-period",
                self.generic.route_reconciliation_period,
            ),
            (
                "--node-status-update-frequency",
                self.node.node_status_update_frequency,
            ),
        ] {
            if d.is_zero() {
                errors.push(format!("{flag} must be greater than zero"));
            }
        }
        let le = &self.leader_election;
        if self.generic.dry_run && le.leader_elect {
            tracing::info!(
                "--dry-run: leader election is off (a shadow controller manager never takes a lease, so it can run next to the one in charge)"
            );
        }
        let leader_election = if le.leader_elect && !self.generic.dry_run {
            if le.resource_lock != "leases" {
                errors.push(format!(
                    "--leader-elect-resource-lock: resourceLock value must be \"leases\" (got {:?})",
                    le.resource_lock
                ));
            }
            let config = LeaderElectionConfig {
                namespace: le.resource_namespace.clone(),
                name: le.resource_name.clone(),
                identity: k8s_controller_manager::leaderelection::default_identity(),
                lease_duration: le.lease_duration,
                renew_deadline: le.renew_deadline,
                retry_period: le.retry_period,
            };
            if let Err(e) = config.validate() {
                errors.push(e);
            }
            Some(config)
        } else {
            None
        };
        let mut leader_migration = None;
        let lm = &self.leader_migration;
        if lm.enable_leader_migration && le.leader_elect && !self.generic.dry_run {
            let config = match &lm.leader_migration_config {
                Some(path) if !path.as_os_str().is_empty() => std::fs::read_to_string(path)
                    .map_err(|e| format!("--leader-migration-config {}: {e}", path.display()))
                    .and_then(|text| {
                        LeaderMigrationConfiguration::parse(&text)
                            .map_err(|e| format!("--leader-migration-config {}: {e}", path.display()))
                    }),
                _ => Ok(LeaderMigrationConfiguration::default_config()),
            };
            match config.and_then(|c| {
                let resolved = c.resolve(registry).map_err(|e| format!("--leader-migration-config: {e}"))?;
                if c.leader_name == le.resource_name {
                    return Err(format!(
                        "--leader-migration-config: leaderName {:?} must differ from --leader-elect-resource-name",
                        c.leader_name
                    ));
                }
                Ok((c, resolved))
            }) {
                Ok(m) => leader_migration = Some(m),
                Err(e) => errors.push(e),
            }
        } else if lm.enable_leader_migration && self.generic.dry_run {
            tracing::info!("--dry-run: leader migration is off; every controller runs (in shadow)");
        } else if lm.enable_leader_migration {
            tracing::warn!("--enable-leader-migration has no effect without --leader-elect");
        } else if lm.leader_migration_config.is_some() {
            tracing::warn!("--leader-migration-config is ignored without --enable-leader-migration");
        }
        if self.node.concurrent_node_lifecycle_syncs <= 0 {
            errors.push(format!(
                "--concurrent-node-lifecycle-syncs must be a positive number (got {})",
                self.node.concurrent_node_lifecycle_syncs
            ));
        }
        match super::feature_gates::parse(&self.generic.feature_gates) {
            Ok(gates) => {
                let changed = super::feature_gates::changed(&gates);
                if !changed.is_empty() {
                    tracing::warn!(
                        gates = %changed.join(","),
                        "--feature-gates: these gates of Go's cloud-controller-manager have no effect here"
                    );
                }
            }
            Err(e) => errors.extend(e),
        }
        for webhook in self.webhooks.webhooks.iter().map(|w| w.trim()) {
            if !webhook.is_empty() && webhook != "*" {
                errors.push(format!(
                    "--webhooks: {webhook:?} is not a webhook of this cloud-controller-manager (it has none, like Go's)"
                ));
            }
        }
        if let Err(e) = self.serving.curve_ids() {
            errors.push(e);
        }
        self.warn_compatibility_only();
        if self.serving.tls_cert_file.is_some() != self.serving.tls_private_key_file.is_some() {
            errors.push("--tls-cert-file and --tls-private-key-file must be given together".into());
        }
        if let Err(e) = k8s_controller_manager::server::tls::protocol_versions(&self.serving.tls_min_version)
        {
            errors.push(
                e.to_string()
                    .trim_start_matches("TLS configuration: ")
                    .to_string(),
            );
        }
        if errors.is_empty() {
            Ok(ValidatedOptions {
                options: self.clone(),
                controllers,
                cluster_cidrs,
                leader_election,
                leader_migration,
            })
        } else {
            Err(errors)
        }
    }
}
