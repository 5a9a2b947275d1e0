//! A rate-limited work queue with the semantics of client-go's `workqueue`:
//!
//! - **de-duplication**: a key added several times before a worker takes it is processed once;
//! - **processing set**: a key is never handed to two workers at once; a key re-added while it
//!   is being processed is queued again when the worker calls [`WorkQueue::done`];
//! - **per-key exponential back-off**: [`WorkQueue::add_rate_limited`] re-adds a key after
//!   `base × 2^failures` (capped at `max`); [`WorkQueue::forget`] resets the count;
//! - **delayed adds**: [`WorkQueue::add_after`] (used for a provider's fixed retry delay), held
//!   in one heap served by one timer task per queue (not a task per add), de-duplicated: a key
//!   already waiting keeps the earlier of its two ready times (client-go's delaying queue);
//! - **overall rate limit**: with [`WorkQueue::with_bucket`] (client-go's default controller
//!   rate limiter: 10 qps, burst 100), a rate-limited add waits the longer of its per-key
//!   back-off and the shared token bucket's delay.
//!
//! The time gauges (`workqueue_unfinished_work_seconds`,
//! `workqueue_longest_running_processor_seconds`) are refreshed every 500 ms, as client-go
//! does; [`WorkQueue::longest_running`] feeds the controllers' stuck-worker health checks.
//!
//! Metrics (label `name`) follow client-go: `workqueue_depth`, `workqueue_adds_total`,
//! `workqueue_retries_total`, `workqueue_queue_duration_seconds`,
//! `workqueue_work_duration_seconds`, `workqueue_longest_running_processor_seconds`,
//! `workqueue_unfinished_work_seconds`.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, HashSet, VecDeque},
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

/// client-go's `BucketRateLimiter`: a token bucket shared by every key.
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Takes a token; how long the caller must wait for it.
    fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst) - 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

struct State<T> {
    queue: VecDeque<T>,
    dirty: HashSet<T>,
    processing: HashMap<T, Instant>,
    added_at: HashMap<T, Instant>,
    failures: HashMap<T, u32>,
    /// Delayed adds: the ready time of each waiting key, and a heap of (ready, seq, key)
    /// whose stale entries (the key's ready time changed) are skipped.
    waiting: HashMap<T, Instant>,
    heap: BinaryHeap<Reverse<(Instant, u64, WaitingKey<T>)>>,
    seq: u64,
    timer_started: bool,
    bucket: Option<Bucket>,
    shutting_down: bool,
}

/// A key in the delay heap (ordered by ready time and sequence only).
struct WaitingKey<T>(T);

impl<T> PartialEq for WaitingKey<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<T> Eq for WaitingKey<T> {}
impl<T> PartialOrd for WaitingKey<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for WaitingKey<T> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// How often the time gauges are refreshed (client-go: 500 ms).
const TIME_METRICS_PERIOD: Duration = Duration::from_millis(500);

/// A de-duplicating, rate-limited work queue of keys. Cheap to clone (shared).
pub struct WorkQueue<T> {
    inner: Arc<Inner<T>>,
}

struct Inner<T> {
    name: String,
    state: Mutex<State<T>>,
    notify: Notify,
    /// Wakes the timer task when an earlier delayed add arrives.
    timer: Notify,
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
                    waiting: HashMap::new(),
                    heap: BinaryHeap::new(),
                    seq: 0,
                    timer_started: false,
                    bucket: None,
                    shutting_down: false,
                }),
                notify: Notify::new(),
                timer: Notify::new(),
                backoff,
                shutdown: CancellationToken::new(),
                metrics,
            }),
        }
    }

    /// Adds client-go's overall token bucket (`qps`, `burst`) to the per-key back-off: the
    /// default controller rate limiter is `with_bucket(10.0, 100)`.
    pub fn with_bucket(self, qps: f64, burst: u32) -> Self {
        self.inner.state.lock().bucket = Some(Bucket {
            qps: qps.max(f64::MIN_POSITIVE),
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            last: Instant::now(),
        });
        self
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

    /// Adds a key after `delay` (a key already waiting keeps the earlier ready time).
    pub fn add_after(&self, item: T, delay: Duration) {
        if delay.is_zero() {
            self.add(item);
            return;
        }
        let ready = Instant::now() + delay;
        let mut s = self.inner.state.lock();
        if s.shutting_down {
            return;
        }
        if s.waiting.get(&item).is_some_and(|at| *at <= ready) {
            return;
        }
        s.waiting.insert(item.clone(), ready);
        s.seq += 1;
        let seq = s.seq;
        let earliest = s.heap.peek().is_none_or(|Reverse((at, _, _))| ready < *at);
        s.heap.push(Reverse((ready, seq, WaitingKey(item))));
        let start = !s.timer_started;
        s.timer_started = true;
        drop(s);
        if start {
            self.start_timer();
        } else if earliest {
            self.inner.timer.notify_one();
        }
    }

    /// The one task that moves due keys from the delay heap to the queue, and refreshes the
    /// time gauges every 500 ms.
    fn start_timer(&self) {
        let weak = Arc::downgrade(&self.inner);
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let queue = WorkQueue { inner };
                let now = Instant::now();
                let mut due = Vec::new();
                let next = {
                    let mut s = queue.inner.state.lock();
                    while let Some(Reverse((at, _, _))) = s.heap.peek() {
                        if *at > now {
                            break;
                        }
                        let Some(Reverse((at, _, WaitingKey(item)))) = s.heap.pop() else {
                            break;
                        };
                        if s.waiting.get(&item) == Some(&at) {
                            s.waiting.remove(&item);
                            due.push(item);
                        }
                    }
                    s.heap.peek().map(|Reverse((at, _, _))| *at)
                };
                for item in due {
                    queue.add(item);
                }
                queue.update_time_metrics();
                let wait = next
                    .map(|at| at.saturating_duration_since(Instant::now()))
                    .unwrap_or(TIME_METRICS_PERIOD)
                    .min(TIME_METRICS_PERIOD);
                let timer = queue.inner.clone();
                drop(queue);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = timer.timer.notified() => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        });
    }

    /// Starts the timer task if it is not running (the time gauges then refresh even when
    /// no delayed add ever happens). Needs a Tokio runtime.
    pub fn start_time_metrics(&self) {
        let mut s = self.inner.state.lock();
        if s.timer_started {
            return;
        }
        s.timer_started = true;
        drop(s);
        self.start_timer();
    }

    /// How long the key processed longest right now has been in process.
    pub fn longest_running(&self) -> Duration {
        let s = self.inner.state.lock();
        let now = Instant::now();
        s.processing
            .values()
            .map(|t| now.duration_since(*t))
            .max()
            .unwrap_or_default()
    }

    /// Adds a key after its back-off delay (and the overall bucket's, if any) and counts a
    /// failure.
    pub fn add_rate_limited(&self, item: T) {
        let (failures, bucket_delay) = {
            let mut s = self.inner.state.lock();
            let f = s.failures.entry(item.clone()).or_insert(0);
            let before = *f;
            *f = f.saturating_add(1);
            let bucket = s
                .bucket
                .as_mut()
                .map(|b| b.reserve(Instant::now()))
                .unwrap_or_default();
            (before, bucket)
        };
        if let Some(m) = &self.inner.metrics {
            m.retries.with_label_values(&[&self.inner.name]).inc();
        }
        self.add_after(item, self.inner.backoff.delay(failures).max(bucket_delay));
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
        {
            let mut s = self.inner.state.lock();
            s.shutting_down = true;
            s.waiting.clear();
            s.heap.clear();
        }
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
    async fn delayed_adds_share_one_timer_and_keep_the_earliest_time() {
        let q = queue();
        let start = Instant::now();
        q.add_after("a".into(), Duration::from_millis(300));
        q.add_after("a".into(), Duration::from_millis(30)); // earlier wins
        q.add_after("a".into(), Duration::from_millis(500)); // later is ignored
        q.add_after("b".into(), Duration::from_millis(60));
        assert_eq!(q.get().await.as_deref(), Some("a"));
        assert!(
            start.elapsed() < Duration::from_millis(250),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(q.get().await.as_deref(), Some("b"));
        q.done(&"a".to_string());
        let again = tokio::time::timeout(Duration::from_millis(600), q.get()).await;
        assert!(
            again.is_err(),
            "the ignored later add of a did not fire: {again:?}"
        );
        // Thousands of delayed adds are one heap, not thousands of tasks.
        for i in 0..5000 {
            q.add_after(format!("k{i}"), Duration::from_millis(20));
        }
        for _ in 0..5000 {
            let k = q.get().await.unwrap();
            q.done(&k);
        }
    }

    #[tokio::test]
    async fn the_overall_bucket_spaces_out_rate_limited_adds() {
        let q = queue().with_bucket(100.0, 2);
        let start = Instant::now();
        for i in 0..5 {
            q.add_rate_limited(format!("k{i}"));
        }
        for _ in 0..5 {
            q.get().await.unwrap();
        }
        // Two come from the burst, the other three wait 10 ms each for a token.
        assert!(
            start.elapsed() >= Duration::from_millis(25),
            "{:?}",
            start.elapsed()
        );
        let mut b = Bucket {
            qps: 10.0,
            burst: 100.0,
            tokens: 100.0,
            last: Instant::now(),
        };
        let now = b.last;
        let delays: Vec<Duration> = (0..102).map(|_| b.reserve(now)).collect();
        assert_eq!(delays[99], Duration::ZERO);
        assert_eq!(delays[100], Duration::from_millis(100));
        assert_eq!(delays[101], Duration::from_millis(200));
    }

    #[tokio::test]
    async fn longest_running_reports_a_stuck_key() {
        let q = queue();
        q.add("a".into());
        let a = q.get().await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(q.longest_running() >= Duration::from_millis(30));
        q.done(&a);
        assert_eq!(q.longest_running(), Duration::ZERO);
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
