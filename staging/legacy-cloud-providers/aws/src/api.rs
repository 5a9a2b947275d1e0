//! Every AWS call of the provider goes through [`AwsApi::call`], which
//!
//! 1. waits the region's shared throttling back-off (AWS-74, upstream's
//!    `CrossRequestRetryDelay`: requests and throttling errors are counted, both decayed ×0.8
//!    every 20 s; when throttling errors are ≥ 10 % of requests, every request of the region
//!    first sleeps `60 s × error share`, rounded down to whole seconds). Unlike upstream, both
//!    EC2's `RequestLimitExceeded` **and** ELB's `Throttling` (and the SDK's other throttling
//!    codes) count;
//! 2. records `cloudprovider_aws_api_request_duration_seconds{request}`,
//!    `cloudprovider_aws_api_request_errors{request}` and
//!    `cloudprovider_aws_api_throttled_requests_total{operation_name}` (AWS-78);
//! 3. turns the SDK error into an [`AwsError`] carrying the operation, the AWS error code and
//!    the message (never credentials).
//!
//! The SDK's own standard retries (3 attempts, exponential back-off with jitter) stay on.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::{display::DisplayErrorContext, metadata::ProvideErrorMetadata};
use parking_lot::Mutex;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};
use tracing::{debug, warn};

/// Decay interval of the throttling counters.
const DECAY_INTERVAL: Duration = Duration::from_secs(20);
/// Decay factor applied per interval.
const DECAY_FRACTION: f64 = 0.8;
/// Longest delay inserted before a request.
const MAX_DELAY: Duration = Duration::from_secs(60);

/// Error codes treated as throttling.
pub const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestThrottled",
    "EC2ThrottledException",
    "SlowDown",
];

/// The process-wide back-off of one region, shared by every AWS client of that region.
#[derive(Debug)]
pub struct CrossRequestRetryDelay {
    state: Mutex<BackoffState>,
}

#[derive(Debug)]
struct BackoffState {
    requests: f64,
    throttled: f64,
    last_decay: Instant,
}

impl Default for CrossRequestRetryDelay {
    fn default() -> Self {
        // Starts with 4 fake requests so that one early error does not mean 100 %.
        Self {
            state: Mutex::new(BackoffState {
                requests: 4.0,
                throttled: 0.0,
                last_decay: Instant::now(),
            }),
        }
    }
}

impl CrossRequestRetryDelay {
    /// Counts a request and returns how long to wait before sending it.
    pub fn delay_for_request(&self, now: Instant) -> Duration {
        let mut s = self.state.lock();
        let elapsed = now.saturating_duration_since(s.last_decay);
        if elapsed > DECAY_INTERVAL {
            let intervals = (elapsed.as_secs_f64() / DECAY_INTERVAL.as_secs_f64()).floor();
            let m = DECAY_FRACTION.powf(intervals);
            s.requests *= m;
            s.throttled *= m;
            s.last_decay = now;
        }
        s.requests += 1.0;
        let mut share = if s.requests > 0.5 {
            s.throttled / s.requests
        } else {
            0.0
        };
        if share < 0.1 {
            share = 0.0;
        }
        Duration::from_secs((MAX_DELAY.as_secs_f64() * share).floor() as u64)
    }

    /// Counts a throttling error.
    pub fn record_throttling(&self) {
        self.state.lock().throttled += 1.0;
    }
}

/// The AWS API metrics (names exact as upstream).
#[derive(Debug, Clone)]
pub struct AwsMetrics {
    /// `cloudprovider_aws_api_request_duration_seconds{request}`.
    pub request_duration: HistogramVec,
    /// `cloudprovider_aws_api_request_errors{request}`.
    pub request_errors: IntCounterVec,
    /// `cloudprovider_aws_api_throttled_requests_total{operation_name}`.
    pub throttled_requests: IntCounterVec,
}

impl Default for AwsMetrics {
    fn default() -> Self {
        Self {
            request_duration: HistogramVec::new(
                HistogramOpts::new(
                    "cloudprovider_aws_api_request_duration_seconds",
                    "Latency of AWS API calls",
                )
                .buckets(prometheus::exponential_buckets(0.005, 2.0, 14).expect("static buckets")),
                &["request"],
            )
            .expect("valid metric"),
            request_errors: IntCounterVec::new(
                Opts::new("cloudprovider_aws_api_request_errors", "AWS API errors"),
                &["request"],
            )
            .expect("valid metric"),
            throttled_requests: IntCounterVec::new(
                Opts::new(
                    "cloudprovider_aws_api_throttled_requests_total",
                    "AWS API throttled requests",
                ),
                &["operation_name"],
            )
            .expect("valid metric"),
        }
    }
}

impl AwsMetrics {
    /// Registers the metrics.
    pub fn register(&self, metrics: &k8s_controller_manager::metrics::Metrics) {
        metrics.register(Box::new(self.request_duration.clone()));
        metrics.register(Box::new(self.request_errors.clone()));
        metrics.register(Box::new(self.throttled_requests.clone()));
    }

    /// Calls made so far, by request label.
    pub fn calls(&self, request: &str) -> u64 {
        self.request_duration
            .with_label_values(&[request])
            .get_sample_count()
    }
}

/// A failed AWS call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("AWS {operation} failed{}: {message}", code.as_ref().map(|c| format!(" ({c})")).unwrap_or_default())]
pub struct AwsError {
    /// Our operation name (`describe_instances`, …).
    pub operation: &'static str,
    /// The AWS error code, if the service answered one.
    pub code: Option<String>,
    /// The message, with the SDK's error context.
    pub message: String,
}

impl AwsError {
    /// Whether the error code is `code`.
    pub fn is(&self, code: &str) -> bool {
        self.code.as_deref() == Some(code)
    }

    /// Whether the error code starts with `prefix` (e.g. `InvalidInstanceID.`).
    pub fn code_starts_with(&self, prefix: &str) -> bool {
        self.code.as_deref().is_some_and(|c| c.starts_with(prefix))
    }
}

/// Back-off and metrics shared by every client of one region.
#[derive(Debug, Clone, Default)]
pub struct AwsApi {
    /// The region's back-off.
    pub backoff: Arc<CrossRequestRetryDelay>,
    /// The metrics.
    pub metrics: AwsMetrics,
}

impl AwsApi {
    /// Runs one AWS call under the back-off, with metrics and error mapping.
    pub async fn call<T, E, R, Fut>(&self, operation: &'static str, fut: Fut) -> Result<T, AwsError>
    where
        Fut: Future<Output = Result<T, SdkError<E, R>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        let delay = self.backoff.delay_for_request(Instant::now());
        if !delay.is_zero() {
            warn!(
                operation,
                ?delay,
                "Inserting delay before AWS request ({operation}) to avoid RequestLimitExceeded: {delay:?}"
            );
            tokio::time::sleep(delay).await;
        }
        let start = Instant::now();
        let result = fut.await;
        self.metrics
            .request_duration
            .with_label_values(&[operation])
            .observe(start.elapsed().as_secs_f64());
        match result {
            Ok(v) => {
                debug!(operation, took = ?start.elapsed(), "AWS request");
                Ok(v)
            }
            Err(e) => {
                let code = e.code().map(str::to_string);
                if code.as_deref().is_some_and(|c| THROTTLING_CODES.contains(&c)) {
                    self.backoff.record_throttling();
                    self.metrics
                        .throttled_requests
                        .with_label_values(&[operation])
                        .inc();
                }
                self.metrics.request_errors.with_label_values(&[operation]).inc();
                let message = match e.message() {
                    Some(m) => m.to_string(),
                    None => DisplayErrorContext(&e).to_string(),
                };
                debug!(operation, code = code.as_deref().unwrap_or_default(), message = %message, "AWS request failed");
                Err(AwsError {
                    operation,
                    code,
                    message,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_delay_below_ten_percent_then_proportional_then_decays() {
        let b = CrossRequestRetryDelay::default();
        let t0 = Instant::now();
        for _ in 0..16 {
            assert_eq!(b.delay_for_request(t0), Duration::ZERO);
        }
        b.record_throttling(); // 1 / 20 = 5 %
        assert_eq!(b.delay_for_request(t0), Duration::ZERO);
        for _ in 0..5 {
            b.record_throttling();
        }
        // 6 throttled / 22 requests ≈ 27 % → 16 s.
        assert_eq!(b.delay_for_request(t0), Duration::from_secs(16));
        // Counters decay together, so the share stays until successes dilute it.
        let later = t0 + Duration::from_secs(61);
        let d = b.delay_for_request(later);
        assert!(d > Duration::ZERO && d <= Duration::from_secs(16), "{d:?}");
        for _ in 0..100 {
            b.delay_for_request(later);
        }
        assert_eq!(b.delay_for_request(later), Duration::ZERO);
    }
}
