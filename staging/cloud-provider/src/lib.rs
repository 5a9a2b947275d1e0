//! The Kubernetes cloud-provider framework in Rust, the counterpart of `k8s.io/cloud-provider`.
//!
//! # For provider authors
//! Implement [`CloudProvider`] and the capabilities your cloud has ([`InstancesV2`] — or the
//! legacy [`Instances`] + [`Zones`] —, [`LoadBalancer`], [`Routes`]), return [`CloudError`]'s
//! sentinel variants where the controllers act on them (`InstanceNotFound`, `NotImplemented`,
//! `ImplementedElsewhere`, `Retry`), and test against the same controllers with the
//! `fake` provider (feature `fake`) as a model.
//!
//! # What is here
//! - [`cloud`]: the interface; [`error`]: its errors; [`registry`]: name → factory;
//! - [`gcfg`]: the INI dialect of upstream cloud configs (for providers' config parsers);
//! - [`well_known`]: labels, taints, annotations, finalizer, event reasons (exact strings);
//! - [`node::helpers`], [`service::helpers`]: helpers for providers and controllers;
//! - [`controllers`]: cloud-node, cloud-node-lifecycle, service-lb, node-route;
//! - [`app`]: the cloud-controller-manager command a provider binary runs;
//! - [`dry_run`]: the one place cloud writes pass (logged; not made in shadow mode, `--dry-run`).

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
pub mod registry;
pub mod service;
pub mod well_known;

pub use cloud::{
    CloudProvider, Clusters, InitContext, InstanceMetadata, Instances, InstancesV2, LoadBalancer, Route,
    Routes, Zone, Zones,
};
pub use error::{CloudError, CloudResult};
