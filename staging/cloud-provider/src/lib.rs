//! The Kubernetes cloud-provider framework in Rust, the counterpart of `k8s.io/cloud-provider`.
//!
//! # For provider authors
//! Implement [`CloudProvider`] and the capabilities your cloud has ([`InstancesV2`] — or the
//! legacy [`Instances`] + [`Zones`] —, [`LoadBalancer`], [`Routes`]), return [`CloudError`]'s
//! sentinel variants where the controllers act on them (`InstanceNotFound`, `NotImplemented`,
//! `ImplementedElsewhere`, `Retry`), and run the command with [`app::main`]:
//!
//! ```no_run
//! use std::process::ExitCode;
//!
//! use k8s_cloud_provider::{
//!     CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2,
//!     app::{FactoryContext, ProviderSpec},
//! };
//! use k8s_openapi::api::core::v1::Node;
//!
//! struct MyCloud;
//!
//! #[async_trait::async_trait]
//! impl CloudProvider for MyCloud {
//!     fn provider_name(&self) -> &str {
//!         "mycloud"
//!     }
//!     fn instances_v2(&self) -> Option<&dyn InstancesV2> {
//!         Some(self)
//!     }
//! }
//!
//! #[async_trait::async_trait]
//! impl InstancesV2 for MyCloud {
//!     async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
//!         Ok(true) // `false` deletes the Node: only when the cloud says it is gone
//!     }
//!     async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
//!         Ok(false)
//!     }
//!     async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
//!         let name = node.metadata.name.clone().ok_or(CloudError::InstanceNotFound)?;
//!         Ok(Some(InstanceMetadata::new(format!("mycloud://{name}")).with_zone("zone-a", "")))
//!     }
//! }
//!
//! fn main() -> ExitCode {
//!     // The factory is given the `--cloud-config` file's bytes (None without the flag), the
//!     // cluster name, the provider's own flags (`ProviderSpec::with_flags`) and a client builder.
//!     k8s_cloud_provider::app::main(ProviderSpec::new("mycloud", |ctx: FactoryContext| async move {
//!         let _config = ctx.config; // parse it here; an error stops the command
//!         Ok::<_, k8s_cloud_provider::error::BoxError>(MyCloud)
//!     }))
//! }
//! ```
//!
//! `examples/cloud-provider-sample` in the repository is a complete provider built this way
//! from the published crates, with a walk-through of what a vendor writes (`ProviderSpec`,
//! provider controllers and commands, metrics, boundary rules).
//!
//! # Feature flags
//! - `fake`: the module `fake`, a programmable in-memory provider that records every call — a model to
//!   test a provider's behaviour against the same controllers. Off by default.
//!
//! # What is here
//! - [`cloud`]: the interface; [`error`]: its errors; [`registry`]: name → factory;
//! - [`gcfg`]: the INI dialect of upstream cloud configs (for providers' config parsers);
//! - [`well_known`]: labels, taints, annotations, finalizer, event reasons (exact strings);
//! - [`node::helpers`], [`service::helpers`]: helpers for providers and controllers;
//! - [`controllers`]: cloud-node, cloud-node-lifecycle, service-lb, node-route;
//! - [`app`]: the cloud-controller-manager command a provider binary runs;
//! - [`dry_run`]: the one place cloud writes pass (logged; not made in shadow mode, `--dry-run`);
//! - [`doctor`] and [`orphans`]: what every provider's `doctor` and `orphans` commands share.

pub mod app;
pub mod cloud;
pub mod controllers;
pub mod doctor;
pub mod dry_run;
pub mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod gcfg;
pub mod node;
pub mod orphans;
pub mod registry;
pub mod service;
pub mod well_known;

/// The controller-manager machinery this framework is built on (metrics registry, informers,
/// work queues, leader election), at the exact version it uses: a provider reaches, e.g., the
/// [`Metrics`](k8s_controller_manager::metrics::Metrics) its
/// [`CloudProvider::register_metrics`] receives through here without a dependency of its own.
pub use k8s_controller_manager;

/// The Kubernetes client this framework uses (the [`kube::Client`] of [`InitContext`]), so that
/// a provider calls the API with the very version the framework was built with, pinning
/// nothing by hand.
pub use kube;

/// The Kubernetes API types this framework uses. A library enables no Kubernetes version: the
/// provider's binary still depends on `k8s-openapi` itself to choose one (a feature such as
/// `v1_37`), at the version `k8s-cloud-provider` names (see docs/versioning.md).
pub use k8s_openapi;

/// The attribute the capability traits ([`CloudProvider`], [`InstancesV2`], …) are written
/// with: `#[k8s_cloud_provider::async_trait]` on a provider's `impl` blocks.
pub use async_trait::async_trait;

pub use cloud::{
    CloudProvider, Clusters, InitContext, InstanceMetadata, Instances, InstancesV2, LoadBalancer, Route,
    Routes, Zone, Zones,
};
pub use error::{CloudError, CloudResult};
