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
//! The SDK's own standard retries (3 attempts, exponential back-off with jitter) stay on; the
//! [`AttemptCounter`] interceptor on every client counts each of their attempts, and each
//! throttled one, for the shared back-off and the throttling metric — as upstream's request
//! handlers do — so a throttled call the SDK retried into success still slows the region down.
//! (The SDK's adaptive retry mode was considered: its client-side rate limiter is per client,
//! not per region, and it would hide throttling from this shared back-off.)

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::{display::DisplayErrorContext, metadata::ProvideErrorMetadata};
use k8s_controller_manager::writes::DryRun;
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
        self.record_attempt();
        self.current_delay(now)
    }

    /// Counts a throttling error.
    pub fn record_throttling(&self) {
        self.state.lock().throttled += 1.0;
    }

    /// How long to wait before a call, without counting it (the [`AttemptCounter`] counts
    /// each attempt): 60 s × the share of throttled requests, when that share is ≥ 10 %.
    pub fn current_delay(&self, now: Instant) -> Duration {
        let mut s = self.state.lock();
        let elapsed = now.saturating_duration_since(s.last_decay);
        if elapsed > DECAY_INTERVAL {
            let intervals = (elapsed.as_secs_f64() / DECAY_INTERVAL.as_secs_f64()).floor();
            let m = DECAY_FRACTION.powf(intervals);
            s.requests *= m;
            s.throttled *= m;
            s.last_decay = now;
        }
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

    /// Counts one attempt (a request on the wire).
    pub fn record_attempt(&self) {
        self.state.lock().requests += 1.0;
    }
}

/// Whether an AWS error response body names a throttling code (`<Code>Throttling</Code>` in
/// the query/XML protocols, `"__type":"…Throttling…"` in JSON ones).
pub fn is_throttling_body(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body);
    THROTTLING_CODES.iter().any(|c| {
        text.contains(&format!("<Code>{c}</Code>"))
            || text.contains(&format!("\"{c}\""))
            || text.contains(&format!("#{c}\""))
    })
}

/// The SDK interceptor counting every attempt and every throttled attempt (see the module
/// documentation); `cloudprovider_aws_api_throttled_requests_total{operation_name}` is
/// labelled with the AWS operation name, as upstream's.
#[derive(Debug, Clone)]
pub struct AttemptCounter {
    backoff: Arc<CrossRequestRetryDelay>,
    metrics: AwsMetrics,
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for AttemptCounter {
    fn name(&self) -> &'static str {
        "k8s-aws-attempt-counter"
    }

    fn read_before_attempt(
        &self,
        _context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<
            '_,
        >,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        self.backoff.record_attempt();
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef<'_>,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let Some(response) = context.response() else {
            return Ok(());
        };
        if response.status().is_success() {
            return Ok(());
        }
        if response.body().bytes().is_some_and(is_throttling_body) {
            self.backoff.record_throttling();
            let operation = cfg
                .load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
                .map(|m| m.name().to_string())
                .unwrap_or_default();
            self.metrics
                .throttled_requests
                .with_label_values(&[operation.as_str()])
                .inc();
        }
        Ok(())
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

    /// Whether the call may succeed when made again: throttling ([`THROTTLING_CODES`]), a
    /// server-side error ([`SERVER_ERROR_CODES`]), or no answer at all (a connection reset, a
    /// timeout: no error code). A request the service refused (a validation error, a missing
    /// permission, a limit) is not.
    pub fn is_transient(&self) -> bool {
        match self.code.as_deref() {
            None => true,
            Some(c) => THROTTLING_CODES.contains(&c) || SERVER_ERROR_CODES.contains(&c),
        }
    }
}

/// The error codes of AWS server-side failures (HTTP 5xx) across EC2 and ELB.
pub const SERVER_ERROR_CODES: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "Unavailable",
];

/// Back-off and metrics shared by every client of one region.
#[derive(Debug, Clone, Default)]
pub struct AwsApi {
    /// The region's back-off.
    pub backoff: Arc<CrossRequestRetryDelay>,
    /// The metrics.
    pub metrics: AwsMetrics,
    /// Set once in shadow mode (`--dry-run`, from `Initialize`): from then on [`WriteGuard`]
    /// stops every AWS write of every client before it is sent.
    pub dry_run: Arc<std::sync::OnceLock<DryRun>>,
}

/// Whether an AWS operation only reads (`Describe…`, `Get…`, `List…`); any other operation is
/// treated as a write, so an operation added later is guarded by default.
pub fn is_read_operation(name: &str) -> bool {
    ["Describe", "Get", "List"].iter().any(|p| name.starts_with(p))
}

/// The SDK interceptor that enforces shadow mode on the AWS side: once [`AwsApi::dry_run`] is
/// set, every operation that is not a read ([`is_read_operation`]) is recorded (one
/// `dry run: would write` line with controller `aws`, the action `<service>:<operation>` and
/// the request's input as the object; one count) and fails before it is serialized, so nothing
/// is sent. It is on every SDK client of the provider, so it also covers the writes that do
/// not pass the framework's load balancer and route calls (the tagging controller's tags).
#[derive(Debug, Clone)]
pub struct WriteGuard {
    dry_run: Arc<std::sync::OnceLock<DryRun>>,
}

/// The error of an AWS write stopped by [`WriteGuard`].
#[derive(Debug, thiserror::Error)]
#[error("dry run: {0} was not sent (the controller manager runs with --dry-run)")]
pub struct DryRunRefused(String);

impl aws_smithy_runtime_api::client::interceptors::Intercept for WriteGuard {
    fn name(&self) -> &'static str {
        "k8s-aws-dry-run-write-guard"
    }

    // Not `read_before_execution`: the operation's metadata is in the config bag only once
    // the operation's configuration is applied, just before serialization.
    fn read_before_serialization(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<
            '_,
        >,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let Some(dry_run) = self.dry_run.get() else {
            return Ok(());
        };
        let (service, operation) = cfg
            .load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
            .map(|m| (m.service().to_string(), m.name().to_string()))
            .unwrap_or_default();
        if is_read_operation(&operation) {
            return Ok(());
        }
        let action = format!("{service}:{operation}");
        // `Input(TypeErasedBox[!Clone]:CreateTagsInput { … })` → `CreateTagsInput { … }`.
        let erased = format!("{:?}", context.input());
        let mut object = erased
            .split_once("]:")
            .map(|(_, rest)| rest.strip_suffix(')').unwrap_or(rest).to_string())
            .unwrap_or(erased);
        if object.len() > 400 {
            let cut = (0..=400).rev().find(|i| object.is_char_boundary(*i)).unwrap_or(0);
            object.truncate(cut);
            object.push('…');
        }
        dry_run.record("aws", &action, &object);
        Err(Box::new(DryRunRefused(action)))
    }
}

impl AwsApi {
    /// The shadow-mode guard to put on every SDK client of this region.
    pub fn write_guard(&self) -> WriteGuard {
        WriteGuard {
            dry_run: self.dry_run.clone(),
        }
    }

    /// The interceptor to put on every SDK client of this region.
    pub fn attempt_counter(&self) -> AttemptCounter {
        AttemptCounter {
            backoff: self.backoff.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// Runs one AWS call under the back-off, with metrics and error mapping.
    pub async fn call<T, E, R, Fut>(&self, operation: &'static str, fut: Fut) -> Result<T, AwsError>
    where
        Fut: Future<Output = Result<T, SdkError<E, R>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        let delay = self.backoff.current_delay(Instant::now());
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
                // Throttled attempts were counted by the AttemptCounter.
                let code = e.code().map(str::to_string);
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
    fn throttling_server_errors_and_lost_answers_are_transient_refusals_are_not() {
        let e = |code: Option<&str>| AwsError {
            operation: "elbv2_create_load_balancer",
            code: code.map(str::to_string),
            message: String::new(),
        };
        for transient in [
            None,
            Some("Throttling"),
            Some("RequestLimitExceeded"),
            Some("InternalError"),
            Some("ServiceUnavailable"),
        ] {
            assert!(e(transient).is_transient(), "{transient:?}");
        }
        for refused in [
            Some("ValidationError"),
            Some("TooManyLoadBalancers"),
            Some("AccessDenied"),
            Some("DuplicateLoadBalancerName"),
        ] {
            assert!(!e(refused).is_transient(), "{refused:?}");
        }
    }

    #[test]
    fn only_describe_get_and_list_operations_are_reads() {
        for read in [
            "DescribeInstances",
            "DescribeTags",
            "GetCallerIdentity",
            "ListTagsForResource",
        ] {
            assert!(is_read_operation(read), "{read}");
        }
        for write in [
            "CreateTags",
            "DeleteLoadBalancer",
            "AuthorizeSecurityGroupIngress",
            "RegisterTargets",
            "ModifyInstanceAttribute",
            "",
        ] {
            assert!(!is_read_operation(write), "{write:?}");
        }
    }

    #[test]
    fn throttling_bodies_are_recognised() {
        assert!(is_throttling_body(
            b"<Response><Errors><Error><Code>RequestLimitExceeded</Code></Error></Errors></Response>"
        ));
        assert!(is_throttling_body(
            b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code></Error></ErrorResponse>"
        ));
        assert!(!is_throttling_body(
            b"<ErrorResponse><Error><Code>LoadBalancerNotFound</Code></Error></ErrorResponse>"
        ));
    }

    #[test]
    fn current_delay_does_not_count_attempts_do() {
        let b = CrossRequestRetryDelay::default();
        let t0 = Instant::now();
        for _ in 0..6 {
            b.record_attempt();
        }
        for _ in 0..5 {
            b.record_throttling();
        }
        // 5 throttled / (4 + 6) attempts = 50 % → 30 s, however often it is asked.
        assert_eq!(b.current_delay(t0), Duration::from_secs(30));
        assert_eq!(b.current_delay(t0), Duration::from_secs(30));
    }

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
