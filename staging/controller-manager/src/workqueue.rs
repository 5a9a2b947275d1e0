//! A rate-limited work queue with the semantics of client-go's `workqueue`:
//!
//! - **de-duplication**: a key added several times before a worker takes it is processed once;
//! - **processing set**: a key is never handed to two workers at once; a key re-added while it
//!   is being processed is queued again when the worker calls [`WorkQueue::done`];
//! - **per-key exponential back-off**: [`WorkQueue::add_rate_limited`] re-adds a key after
//!   `base × 2^failures` (capped at `max`); [`WorkQueue::forget`] resets the count;
//! - **delayed adds**: [`WorkQueue::add_after`] (used for a provider's fixed retry delay).
//!
//! Metrics (label `name`) follow client-go: `workqueue_depth`, `workqueue_adds_total`,
//! `workqueue_retries_total`, `workqueue_queue_duration_seconds`,
//! `workqueue_work_duration_seconds`, `workqueue_longest_running_processor_seconds`,
//! `workqueue_unfinished_work_seconds`.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    hash::Hash,
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::WorkQueueMetrics;

/// Per-key exponential back-off: `base × 2^failures`, capped at `max`.
#[derive(Debug, Clone, Copy)]
pub struct ExponentialBackoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Upper bound of the delay.
    pub max: Duration,
}

impl ExponentialBackoff {
    /// client-go's default controller rate limiter's per-item part: 5 ms → 1000 s.
    pub const CONTROLLER_DEFAULT: Self = Self {
        base: Duration::from_millis(5),
        max: Duration::from_secs(1000),
    };

    /// The delay after `failures` earlier failures.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u64.saturating_pow(failures.min(62));
        let nanos = (self.base.as_nanos() as u64).saturating_mul(factor);
        Duration::from_nanos(nanos).min(self.max)
    }
}

struct State<T> {
    queue: VecDeque<T>,
    dirty: HashSet<T>,
    processing: HashMap<T, Instant>,
    added_at: HashMap<T, Instant>,
    failures: HashMap<T, u32>,
    shutting_down: bool,
}

/// A de-duplicating, rate-limited work queue of keys. Cheap to clone (shared).
pub struct WorkQueue<T> {
    inner: Arc<Inner<T>>,
}

struct Inner<T> {
    name: String,
    state: Mutex<State<T>>,
    notify: Notify,
    backoff: ExponentialBackoff,
    shutdown: CancellationToken,
    metrics: Option<WorkQueueMetrics>,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> WorkQueue<T> {
    /// Creates a queue named `name` (the metrics label) with the given back-off.
    pub fn new(name: &str, backoff: ExponentialBackoff, metrics: Option<WorkQueueMetrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.to_string(),
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashMap::new(),
                    added_at: HashMap::new(),
                    failures: HashMap::new(),
                    shutting_down: false,
                }),
                notify: Notify::new(),
                backoff,
                shutdown: CancellationToken::new(),
                metrics,
            }),
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Adds a key now (no-op if it is already waiting).
    pub fn add(&self, item: T) {
        let mut s = self.inner.state.lock();
        if s.shutting_down || s.dirty.contains(&item) {
            return;
        }
        if let Some(m) = &self.inner.metrics {
            m.adds.with_label_values(&[&self.inner.name]).inc();
        }
        s.dirty.insert(item.clone());
        s.added_at.entry(item.clone()).or_insert_with(Instant::now);
        if s.processing.contains_key(&item) {
            return;
        }
        s.queue.push_back(item);
        self.update_depth(&s);
        drop(s);
        self.inner.notify.notify_one();
    }

    /// Adds a key after `delay`.
    pub fn add_after(&self, item: T, delay: Duration) {
        if delay.is_zero() {
            self.add(item);
            return;
        }
        let queue = self.clone();
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => queue.add(item),
                _ = shutdown.cancelled() => {}
            }
        });
    }

    /// Adds a key after its back-off delay and counts a failure.
    pub fn add_rate_limited(&self, item: T) {
        let failures = {
            let mut s = self.inner.state.lock();
            let f = s.failures.entry(item.clone()).or_insert(0);
            let before = *f;
            *f = f.saturating_add(1);
            before
        };
        if let Some(m) = &self.inner.metrics {
            m.retries.with_label_values(&[&self.inner.name]).inc();
        }
        self.add_after(item, self.inner.backoff.delay(failures));
    }

    /// Forgets a key's failures (its next back-off starts at `base` again).
    pub fn forget(&self, item: &T) {
        self.inner.state.lock().failures.remove(item);
    }

    /// How many times the key has been re-added with back-off since the last `forget`.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.inner.state.lock().failures.get(item).copied().unwrap_or(0)
    }

    /// Waits for the next key; `None` once the queue is shut down.
    pub async fn get(&self) -> Option<T> {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.inner.state.lock();
                if s.shutting_down {
                    return None;
                }
                if let Some(item) = s.queue.pop_front() {
                    s.dirty.remove(&item);
                    let now = Instant::now();
                    if let Some(added) = s.added_at.remove(&item)
                        && let Some(m) = &self.inner.metrics
                    {
                        m.queue_duration
                            .with_label_values(&[&self.inner.name])
                            .observe(now.duration_since(added).as_secs_f64());
                    }
                    s.processing.insert(item.clone(), now);
                    self.update_depth(&s);
                    // Wake another worker if more work is waiting.
                    if !s.queue.is_empty() {
                        self.inner.notify.notify_one();
                    }
                    return Some(item);
                }
            }
            notified.await;
        }
    }

    /// Marks a key as processed; if it was re-added meanwhile, it is queued again.
    pub fn done(&self, item: &T) {
        let mut s = self.inner.state.lock();
        if let Some(started) = s.processing.remove(item)
            && let Some(m) = &self.inner.metrics
        {
            m.work_duration
                .with_label_values(&[&self.inner.name])
                .observe(started.elapsed().as_secs_f64());
        }
        if s.dirty.contains(item) && !s.shutting_down {
            s.queue.push_back(item.clone());
            self.update_depth(&s);
            drop(s);
            self.inner.notify.notify_one();
        }
    }

    /// Number of keys waiting (not counting those being processed).
    pub fn len(&self) -> usize {
        self.inner.state.lock().queue.len()
    }

    /// Whether no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops the queue: waiting and future `get` calls return `None`, delayed adds are dropped.
    pub fn shut_down(&self) {
        self.inner.state.lock().shutting_down = true;
        self.inner.shutdown.cancel();
        self.inner.notify.notify_waiters();
    }

    /// Refreshes the gauges that depend on time (`unfinished_work`, `longest_running`).
    pub fn update_time_metrics(&self) {
        let Some(m) = &self.inner.metrics else { return };
        let s = self.inner.state.lock();
        let now = Instant::now();
        let durations: Vec<f64> = s
            .processing
            .values()
            .map(|t| now.duration_since(*t).as_secs_f64())
            .collect();
        m.unfinished_work
            .with_label_values(&[&self.inner.name])
            .set(durations.iter().sum());
        m.longest_running
            .with_label_values(&[&self.inner.name])
            .set(durations.iter().cloned().fold(0.0, f64::max));
    }

    fn update_depth(&self, s: &State<T>) {
        if let Some(m) = &self.inner.metrics {
            m.depth
                .with_label_values(&[&self.inner.name])
                .set(s.queue.len() as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue<String> {
        WorkQueue::new(
            "test",
            ExponentialBackoff {
                base: Duration::from_millis(10),
                max: Duration::from_millis(80),
            },
            None,
        )
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = ExponentialBackoff {
            base: Duration::from_secs(5),
            max: Duration::from_secs(300),
        };
        let delays: Vec<u64> = (0..8).map(|f| b.delay(f).as_secs()).collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }

    #[tokio::test]
    async fn deduplicates_waiting_keys() {
        let q = queue();
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        assert_eq!(q.get().await.as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn a_key_is_not_handed_out_twice_while_processing() {
        let q = queue();
        q.add("a".into());
        let first = q.get().await.unwrap();
        q.add("a".into()); // re-added while processing: deferred
        assert!(q.is_empty());
        let second = tokio::time::timeout(Duration::from_millis(50), q.get()).await;
        assert!(second.is_err(), "must not hand out a key being processed");
        q.done(&first);
        assert_eq!(q.get().await.as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn rate_limited_adds_back_off_and_forget_resets() {
        let q = queue();
        let start = Instant::now();
        q.add_rate_limited("a".into()); // 10 ms
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.done(&"a".to_string());
        assert!(start.elapsed() >= Duration::from_millis(10));
        q.add_rate_limited("a".into()); // 20 ms
        assert_eq!(q.num_requeues(&"a".into()), 2);
        q.forget(&"a".into());
        assert_eq!(q.num_requeues(&"a".into()), 0);
        assert_eq!(q.get().await.as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn shut_down_releases_waiters() {
        let q = queue();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.get().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.shut_down();
        assert_eq!(waiter.await.unwrap(), None);
    }
}
