//! Batching of `CreateTags` / `DeleteTags` (`--tagging-controller-enable-batching`, AWS-76):
//! requests with the same operation and tags wait together and go out as one call naming all
//! their instances, once the batch has been idle for 100 ms, is 1 s old, or holds 50 instances
//! (upstream's batcher settings). If the joint call fails, each instance is retried on its own
//! (concurrently), so one bad instance ID cannot fail the others.

use std::{collections::BTreeMap, collections::HashMap, sync::Arc, time::Duration};

use k8s_legacy_cloud_provider_aws::{api::AwsError, tags::TagClient};
use parking_lot::Mutex;
use tokio::{sync::oneshot, time::Instant};

/// A batch is sent once it has received nothing for this long…
pub const IDLE_TIMEOUT: Duration = Duration::from_millis(100);
/// …or once it is this old…
pub const MAX_TIMEOUT: Duration = Duration::from_secs(1);
/// …or once it names this many instances.
pub const MAX_ITEMS: usize = 50;

/// Which tag call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagOperation {
    /// `CreateTags`.
    Create,
    /// `DeleteTags`.
    Delete,
}

type Key = (TagOperation, BTreeMap<String, String>);
type Reply = oneshot::Sender<Result<(), AwsError>>;

struct Pending {
    items: Vec<(String, Reply)>,
    first: Instant,
    last: Instant,
    full: Arc<tokio::sync::Notify>,
}

/// Gathers tag calls into batches (see the module docs).
#[derive(Clone)]
pub struct TagBatcher {
    client: TagClient,
    pending: Arc<Mutex<HashMap<Key, Pending>>>,
}

impl std::fmt::Debug for TagBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TagBatcher").finish_non_exhaustive()
    }
}

async fn call(
    client: &TagClient,
    op: TagOperation,
    ids: &[String],
    tags: &BTreeMap<String, String>,
) -> Result<(), AwsError> {
    match op {
        TagOperation::Create => client.create_tags(ids, tags).await,
        TagOperation::Delete => client.delete_tags(ids, tags).await,
    }
}

impl TagBatcher {
    /// A batcher sending through `client`.
    pub fn new(client: TagClient) -> Self {
        Self {
            client,
            pending: Arc::default(),
        }
    }

    /// Adds one instance to the batch of `(op, tags)` and waits for that batch's outcome for it.
    pub async fn submit(
        &self,
        op: TagOperation,
        id: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let (tx, rx) = oneshot::channel();
        {
            let now = Instant::now();
            let mut pending = self.pending.lock();
            let key = (op, tags.clone());
            let batch = pending.entry(key.clone()).or_insert_with(|| {
                let full = Arc::new(tokio::sync::Notify::new());
                tokio::spawn(self.clone().flush_when_due(key));
                Pending {
                    items: Vec::new(),
                    first: now,
                    last: now,
                    full,
                }
            });
            batch.items.push((id.to_string(), tx));
            batch.last = now;
            if batch.items.len() >= MAX_ITEMS {
                batch.full.notify_one();
            }
        }
        rx.await.unwrap_or_else(|_| {
            Err(AwsError {
                operation: match op {
                    TagOperation::Create => "create_tags",
                    TagOperation::Delete => "delete_tags",
                },
                code: None,
                message: "the batch was dropped before it was sent".into(),
            })
        })
    }

    async fn flush_when_due(self, key: Key) {
        loop {
            let (deadline, full, wake) = {
                let pending = self.pending.lock();
                let Some(b) = pending.get(&key) else { return };
                (
                    (b.last + IDLE_TIMEOUT).min(b.first + MAX_TIMEOUT),
                    b.items.len() >= MAX_ITEMS,
                    b.full.clone(),
                )
            };
            if full || Instant::now() >= deadline {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = wake.notified() => {}
            }
        }
        let Some(batch) = self.pending.lock().remove(&key) else {
            return;
        };
        let (op, tags) = key;
        let ids: Vec<String> = batch.items.iter().map(|(id, _)| id.clone()).collect();
        tracing::info!(operation = ?op, instances = ids.len(), "sending a batched tag call");
        match call(&self.client, op, &ids, &tags).await {
            Ok(()) => {
                for (_, reply) in batch.items {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) if batch.items.len() == 1 => {
                for (_, reply) in batch.items {
                    let _ = reply.send(Err(e.clone()));
                }
            }
            Err(e) => {
                tracing::warn!(operation = ?op, error = %e, "the batched tag call failed; trying each instance on its own");
                let client = &self.client;
                let tags = &tags;
                let singles = batch.items.into_iter().map(|(id, reply)| async move {
                    let r = call(client, op, std::slice::from_ref(&id), tags).await;
                    let _ = reply.send(r);
                });
                futures::future::join_all(singles).await;
            }
        }
    }
}
