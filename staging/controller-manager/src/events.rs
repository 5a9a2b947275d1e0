//! Kubernetes Events, recorded without blocking the caller.
//!
//! [`EventRecorder::event`] queues the event and returns at once; a background writer creates
//! core/v1 Events, as upstream's cloud controllers do (client-go's `record` broadcaster), with
//! `source.component` and `reportingComponent` set to the recording component's name (e.g.
//! `cloud-node-controller`). Repeats of the same event (same object, type, reason and message)
//! within 10 minutes increase the first event's `count` and `lastTimestamp` instead of creating
//! new objects, like client-go's event correlator.
//!
//! (events.k8s.io/v1 would need `reportingController` and forbids `source`; kube-apiserver 1.20
//! also rejects its events for cluster-scoped objects in namespace `default`. core/v1 Events
//! work on every version and are what `kubectl describe` shows.)
//!
//! [`EventBroadcaster::flush`] waits until queued events are written (graceful shutdown).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tokio::sync::mpsc;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Informational.
    Normal,
    /// Something went wrong.
    Warning,
}

impl EventType {
    /// `Normal` / `Warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

struct Pending {
    component: String,
    regarding: ObjectReference,
    type_: EventType,
    reason: String,
    message: String,
}

/// Records events for one component. Cheap to clone; clones share the writer.
#[derive(Clone)]
pub struct EventRecorder {
    component: String,
    tx: mpsc::Sender<Pending>,
    pending: Arc<AtomicUsize>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

/// How many events may wait for the writer before new ones are dropped (with a log line).
const QUEUE_CAPACITY: usize = 10_000;
/// Repeats within this window are counted on the first event.
const SERIES_WINDOW: Duration = Duration::from_secs(600);

/// The background writer shared by every recorder made from it.
#[derive(Clone)]
pub struct EventBroadcaster {
    tx: mpsc::Sender<Pending>,
    pending: Arc<AtomicUsize>,
}

impl std::fmt::Debug for EventBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBroadcaster").finish_non_exhaustive()
    }
}

impl EventBroadcaster {
    /// Starts the writer task with `client`; `instance` is the reporting instance (e.g. the
    /// holder identity `<hostname>_<uuid>`), `host` goes into `deprecatedSource.host`.
    pub fn start(client: Client, instance: String, host: String) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let pending = Arc::new(AtomicUsize::new(0));
        tokio::spawn(write_events(client, instance, host, rx, pending.clone()));
        Self { tx, pending }
    }

    /// A recorder for `component` (shown as the event's source).
    pub fn recorder(&self, component: &str) -> EventRecorder {
        EventRecorder {
            component: component.to_string(),
            tx: self.tx.clone(),
            pending: self.pending.clone(),
        }
    }

    /// Waits until every queued event has been written, or `timeout` passes.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.pending.load(Ordering::SeqCst) > 0 {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

impl EventRecorder {
    /// The component name events are recorded under.
    pub fn component(&self) -> &str {
        &self.component
    }

    /// Queues an event about `regarding`. Never blocks; drops the event (logged) when the
    /// writer is more than 10 000 events behind.
    pub fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        tracing::debug!(
            component = %self.component,
            object = regarding.name.as_deref().unwrap_or_default(),
            r#type = type_.as_str(),
            reason,
            message = %message,
            "event"
        );
        self.pending.fetch_add(1, Ordering::SeqCst);
        let ev = Pending {
            component: self.component.clone(),
            regarding: regarding.clone(),
            type_,
            reason: reason.to_string(),
            message,
        };
        if self.tx.try_send(ev).is_err() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(component = %self.component, reason, "event queue full, dropping event");
        }
    }
}

#[derive(Hash, PartialEq, Eq)]
struct SeriesKey {
    component: String,
    namespace: String,
    uid: String,
    name: String,
    type_: EventType,
    reason: String,
    message: String,
}

async fn write_events(
    client: Client,
    instance: String,
    host: String,
    mut rx: mpsc::Receiver<Pending>,
    pending: Arc<AtomicUsize>,
) {
    // key -> (event name, first seen, count)
    let mut series: HashMap<SeriesKey, (String, Timestamp, i32)> = HashMap::new();
    while let Some(ev) = rx.recv().await {
        let now = Timestamp::now();
        let namespace = ev
            .regarding
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        let key = SeriesKey {
            component: ev.component.clone(),
            namespace: namespace.clone(),
            uid: ev.regarding.uid.clone().unwrap_or_default(),
            name: ev.regarding.name.clone().unwrap_or_default(),
            type_: ev.type_,
            reason: ev.reason.clone(),
            message: ev.message.clone(),
        };
        series.retain(|_, (_, first, _)| now.duration_since(*first).unsigned_abs() < SERIES_WINDOW);
        // A repeat within the series window patches the first event's count; when that event
        // is gone (expired, deleted, or never stored: a server-side dry run), a new one is
        // created instead.
        let mut result = Ok(());
        let mut create = true;
        if let Some((name, _, count)) = series.get_mut(&key) {
            *count += 1;
            let patch = serde_json::json!({ "count": *count, "lastTimestamp": Time(now) });
            result = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ());
            create = matches!(&result, Err(kube::Error::Api(s)) if s.code == 404);
            if create {
                series.remove(&key);
            }
        }
        if create {
            let name = format!("{}.{:x}", key.name.replace(':', "-"), now.as_nanosecond());
            let event = Event {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                involved_object: ev.regarding.clone(),
                reason: Some(ev.reason.clone()),
                message: Some(truncate(&ev.message, 1024)),
                type_: Some(ev.type_.as_str().to_string()),
                count: Some(1),
                first_timestamp: Some(Time(now)),
                last_timestamp: Some(Time(now)),
                source: Some(EventSource {
                    component: Some(ev.component.clone()),
                    host: Some(host.clone()),
                }),
                reporting_component: Some(ev.component.clone()),
                reporting_instance: Some(truncate(&instance, 128)),
                ..Default::default()
            };
            result = api.create(&PostParams::default(), &event).await.map(|_| ());
            if result.is_ok() {
                series.insert(key, (name, now, 1));
            }
        }
        if let Err(e) = result {
            tracing::warn!(component = %ev.component, reason = %ev.reason, error = %e, "could not write event");
        }
        pending.fetch_sub(1, Ordering::SeqCst);
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}
