//! Annotations a provider keeps on its Services, such as OCCM's
//! `loadbalancer.openstack.org/load-balancer-id` and `…/load-balancer-address`: what the
//! provider knows about a Service's load balancer, shown to the user and read back by the
//! provider (or by the provider a cluster moves to).
//!
//! Upstream's interface has no such facility: each Go provider patches Services with its own
//! client. Here a provider keeps the client it receives in [`crate::InitContext`] and writes
//! through a [`ServiceAnnotator`], so that every provider writes the same way: one JSON merge
//! patch of `metadata.annotations` naming only its keys (no `resourceVersion` precondition,
//! nothing else of the Service touched), no request at all when the Service already shows the
//! values (a cluster taken over from a provider that wrote the same makes no write), a
//! server-side dry run under `--dry-run` (the client's write layer), and a Service that is gone
//! is no error.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};

use crate::{CloudError, CloudResult};

/// Changes to a Service's annotations: keys to set to a value, keys to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnnotationChanges {
    changes: BTreeMap<String, Option<String>>,
}

impl AnnotationChanges {
    /// No change.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.changes.insert(key.into(), Some(value.into()));
        self
    }

    /// Removes `key`.
    pub fn remove(mut self, key: impl Into<String>) -> Self {
        self.changes.insert(key.into(), None);
        self
    }

    /// Whether there is no change.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The changes `service` does not show yet (a key already at its value, or a key to
    /// remove that it lacks, is left out).
    pub fn pending(&self, service: &Service) -> Self {
        let have = service.metadata.annotations.as_ref();
        Self {
            changes: self
                .changes
                .iter()
                .filter(|(k, want)| have.and_then(|a| a.get(*k)) != want.as_ref())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The JSON merge patch that makes them: `{"metadata": {"annotations": {key: value or
    /// null}}}`.
    pub fn merge_patch(&self) -> serde_json::Value {
        serde_json::json!({ "metadata": { "annotations": self.changes } })
    }
}

/// Writes a provider's annotations on Services (see the module's documentation).
#[derive(Clone)]
pub struct ServiceAnnotator {
    client: Client,
}

impl std::fmt::Debug for ServiceAnnotator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAnnotator").finish_non_exhaustive()
    }
}

impl ServiceAnnotator {
    /// An annotator writing with `client` (the [`crate::InitContext`]'s).
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Makes the `changes` that `service` (as the caller last read it) does not show yet, with
    /// one merge patch; returns whether a request was sent. A Service the API server no
    /// longer has is not an error (nothing is written).
    pub async fn apply(&self, service: &Service, changes: &AnnotationChanges) -> CloudResult<bool> {
        let pending = changes.pending(service);
        if pending.is_empty() {
            return Ok(false);
        }
        let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        match api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(pending.merge_patch()),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(
                    service = %format!("{namespace}/{name}"),
                    annotations = ?pending.changes,
                    "annotated the Service"
                );
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(CloudError::wrap(
                format!(
                    "annotating Service {namespace}/{name} ({})",
                    pending.changes.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(annotations: &[(&str, &str)]) -> Service {
        let mut s = Service::default();
        s.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s
    }

    #[test]
    fn only_what_the_service_does_not_show_is_pending() {
        let changes = AnnotationChanges::new()
            .set("example.com/id", "lb-1")
            .set("example.com/address", "192.0.2.7")
            .remove("example.com/stale")
            .remove("example.com/absent");
        let s = service(&[
            ("example.com/id", "lb-1"),
            ("example.com/address", "192.0.2.6"),
            ("example.com/stale", "x"),
            ("user/own", "kept"),
        ]);
        let pending = changes.pending(&s);
        assert_eq!(
            pending.merge_patch(),
            serde_json::json!({"metadata": {"annotations": {
                "example.com/address": "192.0.2.7",
                "example.com/stale": null,
            }}})
        );
        let done = service(&[("example.com/id", "lb-1"), ("example.com/address", "192.0.2.7")]);
        assert!(changes.pending(&done).is_empty());
        // A Service without annotations: every key to set, no removal.
        let bare = Service::default();
        assert_eq!(
            changes.pending(&bare).merge_patch(),
            serde_json::json!({"metadata": {"annotations": {
                "example.com/address": "192.0.2.7",
                "example.com/id": "lb-1",
            }}})
        );
    }
}
