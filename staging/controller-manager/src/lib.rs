//! Generic controller-manager machinery, the Rust counterpart of `k8s.io/controller-manager`
//! (plus the client-go pieces every controller manager uses):
//!
//! - [`workqueue`]: de-duplicating, rate-limited work queues with client-go's semantics;
//! - [`informer`]: shared LIST+WATCH caches with change notifications;
//! - [`events`]: non-blocking Kubernetes event recording;
//! - [`metrics`]: the shared Prometheus registry and the generic metrics.

pub mod events;
pub mod informer;
pub mod metrics;
pub mod workqueue;
