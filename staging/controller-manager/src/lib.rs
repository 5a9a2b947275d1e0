//! Generic controller-manager machinery, the Rust counterpart of `k8s.io/controller-manager`
//! (plus the client-go pieces every controller manager uses):
//!
//! - [`workqueue`]: de-duplicating, rate-limited work queues with client-go's semantics;
//! - [`informer`]: shared LIST+WATCH caches with change notifications;
//! - [`events`]: non-blocking Kubernetes event recording;
//! - [`metrics`]: the shared Prometheus registry and the generic metrics;
//! - [`controllers`]: controller names, aliases and the `--controllers` rules;
//! - [`client`]: Kubernetes clients with a QPS/burst limit;
//! - [`writes`]: every write of a client logged, or turned into a server-side dry run (`--dry-run`);
//! - [`leaderelection`]: leader election on Leases;
//! - [`leadermigration`]: the leader-migration configuration and its controller classification;
//! - [`server`]: the HTTPS health and metrics endpoint;
//! - [`auth`]: its delegated authentication (TokenReview, client certificates) and authorization (SubjectAccessReview);
//! - [`duration`]: Go duration strings for flags.

pub mod auth;
pub mod client;
pub mod controllers;
pub mod duration;
pub mod events;
pub mod informer;
pub mod leaderelection;
pub mod leadermigration;
pub mod metrics;
pub mod private_files;
pub mod server;
pub mod workqueue;
pub mod writes;
