//! Shared informers: one LIST+WATCH per resource kind (kube-runtime's watcher), a read cache
//! every controller reads from, and change notifications fanned out to every subscriber.
//!
//! A transform runs on every object before it is cached, so that fields no controller reads
//! (e.g. a Node's `status.images`, any object's `metadata.managedFields`) never take memory.
//!
//! Notifications are [`InformerEvent`]s on a broadcast channel. A subscriber that falls more
//! than the channel's capacity behind receives [`InformerEvent::Resync`], and must then
//! re-read the whole cache (which is what a client-go resync amounts to).

use std::{collections::HashMap, fmt::Debug, sync::Arc, time::Duration};

use futures::TryStreamExt;
use kube::{
    Api, Resource, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

/// A change seen by an informer.
#[derive(Debug)]
pub enum InformerEvent<K> {
    /// A new object.
    Added(Arc<K>),
    /// A changed object (different `resourceVersion`).
    Updated {
        /// The cached object before the change.
        old: Arc<K>,
        /// The object after the change.
        new: Arc<K>,
    },
    /// A deleted object (its last cached state).
    Deleted(Arc<K>),
    /// The subscriber missed events: re-read the whole cache.
    Resync,
}

impl<K> Clone for InformerEvent<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Added(o) => Self::Added(o.clone()),
            Self::Updated { old, new } => Self::Updated {
                old: old.clone(),
                new: new.clone(),
            },
            Self::Deleted(o) => Self::Deleted(o.clone()),
            Self::Resync => Self::Resync,
        }
    }
}

/// The cache key of an object: `namespace/name`, or `name` for cluster-scoped objects.
pub fn object_key<K: Resource>(obj: &K) -> String {
    match obj.meta().namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", obj.meta().name.as_deref().unwrap_or_default()),
        _ => obj.meta().name.clone().unwrap_or_default(),
    }
}

/// A read-only view of an informer's cache. Cheap to clone.
#[derive(Debug)]
pub struct Store<K> {
    objects: Arc<RwLock<HashMap<String, Arc<K>>>>,
    synced: watch::Receiver<bool>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
            synced: self.synced.clone(),
        }
    }
}

impl<K> Store<K> {
    /// The cached object with this key (`namespace/name` or `name`).
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.objects.read().get(key).cloned()
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.objects.read().values().cloned().collect()
    }

    /// Every cached key.
    pub fn keys(&self) -> Vec<String> {
        self.objects.read().keys().cloned().collect()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.objects.read().len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the initial LIST has completed.
    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until the initial LIST has completed.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// A store over a fixed set of objects (for unit tests and fakes).
    pub fn from_objects(objects: Vec<K>) -> Self
    where
        K: Resource,
    {
        let map = objects
            .into_iter()
            .map(|o| (object_key(&o), Arc::new(o)))
            .collect();
        let (_tx, rx) = watch::channel(true);
        Self {
            objects: Arc::new(RwLock::new(map)),
            synced: rx,
        }
    }
}

/// Transform applied to each object before it is cached.
pub type Transform<K> = Arc<dyn Fn(&mut K) + Send + Sync>;

/// How an informer's LIST+WATCH is doing (see [`Informer::health`]).
#[derive(Debug, Clone, Default)]
pub struct InformerHealth {
    /// Since when every LIST/WATCH attempt has failed (none since the last success), with the
    /// last error; `None` while it works.
    pub failing_since: Option<(std::time::Instant, String)>,
    /// Whether its [`Informer::run`] ended before shutdown (the cache is frozen from then on).
    pub ended: bool,
}

/// A shared informer for one resource kind.
pub struct Informer<K> {
    health: Arc<parking_lot::Mutex<InformerHealth>>,
    store: Store<K>,
    synced_tx: Arc<watch::Sender<bool>>,
    events: broadcast::Sender<InformerEvent<K>>,
    api: Api<K>,
    transform: Option<Transform<K>>,
}

impl<K: Resource<DynamicType = ()> + Clone> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Self {
            health: self.health.clone(),
            store: self.store.clone(),
            synced_tx: self.synced_tx.clone(),
            events: self.events.clone(),
            api: self.api.clone(),
            transform: self.transform.clone(),
        }
    }
}

/// Capacity of each subscriber's event buffer. The slots are allocated up front (≈ 48 bytes
/// each), so this is resident memory per informer: 8192 slots (384 KiB) hold the initial LIST
/// of a 5000-Node cluster even if no subscriber reads during it.
const EVENT_BUFFER: usize = 8 * 1024;

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// An informer over `api`, caching objects after `transform`. Call [`Informer::run`] to start.
    pub fn new(api: Api<K>, transform: Option<Transform<K>>) -> Self {
        let (synced_tx, synced) = watch::channel(false);
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Self {
            health: Arc::default(),
            store: Store {
                objects: Arc::default(),
                synced,
            },
            synced_tx: Arc::new(synced_tx),
            events,
            api,
            transform,
        }
    }

    /// How its LIST+WATCH is doing: a controller manager supervises this (a cache that can no
    /// longer be refreshed must not look healthy).
    pub fn health(&self) -> InformerHealth {
        self.health.lock().clone()
    }

    /// The cache.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// A new subscription to change notifications (starting now).
    pub fn subscribe(&self) -> broadcast::Receiver<InformerEvent<K>> {
        self.events.subscribe()
    }

    /// Runs LIST+WATCH until `shutdown`, with kube-runtime's default back-off on errors.
    pub async fn run(self, shutdown: CancellationToken) {
        let kind = K::kind(&()).to_string();
        // The default watcher config: paginated LIST then WATCH with bookmarks (works on 1.20).
        let stream = watcher(self.api.clone(), watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        let mut init_seen: Option<std::collections::HashSet<String>> = None;
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = stream.try_next() => next,
            };
            let event = match next {
                Ok(Some(ev)) => {
                    // `Init` comes before each (re-)LIST is even sent: only an answer counts.
                    if !matches!(ev, watcher::Event::Init) {
                        self.health.lock().failing_since = None;
                    }
                    ev
                }
                Ok(None) => {
                    tracing::error!(kind = %kind, "the watch stream ended");
                    self.health.lock().ended = true;
                    return;
                }
                Err(e) => {
                    tracing::warn!(kind = %kind, error = %e, "watch failed, retrying with back-off");
                    let mut health = self.health.lock();
                    let since = health
                        .failing_since
                        .as_ref()
                        .map_or_else(std::time::Instant::now, |(at, _)| *at);
                    health.failing_since = Some((since, e.to_string()));
                    continue;
                }
            };
            match event {
                watcher::Event::Init => init_seen = Some(Default::default()),
                watcher::Event::InitApply(obj) => {
                    if let Some(seen) = init_seen.as_mut() {
                        seen.insert(object_key(&obj));
                    }
                    self.apply(obj);
                }
                watcher::Event::InitDone => {
                    if let Some(seen) = init_seen.take() {
                        let gone: Vec<String> = self
                            .store
                            .keys()
                            .into_iter()
                            .filter(|k| !seen.contains(k))
                            .collect();
                        for key in gone {
                            if let Some(old) = self.store.objects.write().remove(&key) {
                                let _ = self.events.send(InformerEvent::Deleted(old));
                            }
                        }
                    }
                    self.synced_tx.send_replace(true);
                    tracing::debug!(kind = %kind, objects = self.store.len(), "informer synced");
                }
                watcher::Event::Apply(obj) => self.apply(obj),
                watcher::Event::Delete(obj) => {
                    let key = object_key(&obj);
                    let removed = self.store.objects.write().remove(&key);
                    let last = removed.unwrap_or_else(|| Arc::new(self.transformed(obj)));
                    let _ = self.events.send(InformerEvent::Deleted(last));
                }
            }
        }
    }

    fn transformed(&self, mut obj: K) -> K {
        if let Some(t) = &self.transform {
            t(&mut obj);
        }
        obj
    }

    fn apply(&self, obj: K) {
        let obj = Arc::new(self.transformed(obj));
        let key = object_key(obj.as_ref());
        let old = self.store.objects.write().insert(key, obj.clone());
        let event = match old {
            None => InformerEvent::Added(obj),
            Some(old) if old.resource_version() == obj.resource_version() => return,
            Some(old) => InformerEvent::Updated { old, new: obj },
        };
        let _ = self.events.send(event);
    }
}

/// Turns a broadcast receive result into an event, mapping "lagged" to [`InformerEvent::Resync`].
/// Returns `None` when the informer is gone.
pub async fn next_event<K: Clone>(
    rx: &mut broadcast::Receiver<InformerEvent<K>>,
) -> Option<InformerEvent<K>> {
    match rx.recv().await {
        Ok(ev) => Some(ev),
        Err(broadcast::error::RecvError::Lagged(n)) => {
            tracing::warn!(missed = n, "informer subscriber lagged, resyncing");
            Some(InformerEvent::Resync)
        }
        Err(broadcast::error::RecvError::Closed) => None,
    }
}

/// Strips `metadata.managedFields` (no controller reads it).
pub fn strip_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// Waits until every store has synced, or `timeout` passes; returns whether all synced.
pub async fn wait_for_cache_sync(stores: &[&dyn HasSynced], timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if stores.iter().all(|s| s.has_synced()) {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Anything that can report whether its initial list completed.
pub trait HasSynced: Send + Sync {
    /// Whether the initial LIST has completed.
    fn has_synced(&self) -> bool;
}

impl<K: Send + Sync> HasSynced for Store<K> {
    fn has_synced(&self) -> bool {
        Store::has_synced(self)
    }
}
