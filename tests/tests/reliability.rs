//! Reliability under faults, short forms of the benchmarks (`hack/bench-crash-trials.sh`,
//! `bench-cloud-faults`): the AWS CCM SIGKILLed mid-operation and restarted, and the AWS API
//! answering 30 % of the requests with throttling, server errors, resets, delays and lost
//! answers. In both, every Service's load balancer converges, and the cloud (read from moto
//! directly) never holds a second load balancer for a Service nor anything of a deleted one.

use std::time::{Duration, Instant};

use anyhow::Result;
use rand::Rng;
use rcp_e2e::{
    aws_chaos::{AwsChaosRig, crash_trial, median_max},
    fault_proxy::{FaultKind, RandomFaults},
};

/// Per step; generous (a slow CI machine must not fail the test): the figures are printed.
const LIMIT: Duration = Duration::from_secs(240);

#[tokio::test]
async fn crash_trials_leave_no_leaked_or_duplicated_cloud_resources() -> Result<()> {
    let trials: usize = env_or("RCP_CRASH_TRIALS", 5);
    let rig = AwsChaosRig::start(2, &[]).await?;
    // A warm-up lifecycle without a kill gives the span over which kills are spread.
    let warm = rig.service_lifecycle("warm-up", LIMIT).await?;
    assert!(warm.problems.is_empty(), "{:?}", warm.problems);
    let span = warm
        .converged
        .last()
        .map(|(_, t)| *t)
        .unwrap_or_else(Instant::now)
        - warm.started.unwrap_or_else(Instant::now);
    let span = span.max(Duration::from_millis(500));
    let mut results = Vec::new();
    for i in 0..trials {
        let kill_at = Duration::from_millis(rand::rng().random_range(0..span.as_millis() as u64));
        let r = crash_trial(&rig, i, kill_at, LIMIT).await;
        println!(
            "trial {i}: killed at {:?} during {:?}, converged {:?} after the kill, lifecycle {:?}, problems {:?}",
            r.kill_at, r.killed_during, r.convergence, r.took, r.problems
        );
        results.push(r);
    }
    let leftovers = rig.leftovers(LIMIT).await?;
    let problems: Vec<_> = results.iter().flat_map(|r| r.problems.clone()).collect();
    let duplicates = problems
        .iter()
        .filter(|p| p.contains("duplicate") || p.contains(" load balancers") || p.contains("target groups"))
        .count();
    let leaks = problems.iter().filter(|p| p.contains("left")).count();
    let convergence: Vec<Duration> = results.iter().filter_map(|r| r.convergence).collect();
    let (median, max) = median_max(&convergence);
    let mut during: std::collections::BTreeMap<String, usize> = Default::default();
    for r in &results {
        *during.entry(format!("{:?}", r.killed_during)).or_default() += 1;
    }
    println!(
        "crash trials: {trials} trials (kills during {during:?}), {} CCM starts; leaks {leaks}, duplicates {duplicates}, other problems {}; convergence after a kill median {median:.2?} max {max:.2?}; leftovers at the end {leftovers:?}",
        rig.starts(),
        problems.len() - leaks - duplicates,
    );
    assert!(problems.is_empty(), "leaks or duplicates: {problems:#?}");
    assert_eq!(
        rig.starts(),
        trials + 1,
        "every trial killed and restarted the CCM once"
    );
    assert!(
        leftovers.classic.is_empty()
            && leftovers.network.is_empty()
            && leftovers.target_groups.is_empty()
            && leftovers.security_groups.is_empty()
            && leftovers.node_group_rules == rig.node_rules_at_start(),
        "cluster-owned resources left after every Service was deleted: {leftovers:?}"
    );
    Ok(())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `RCP_FAULT_SHARE` (default 0.3), `RCP_FAULT_SERVICES` (2) and `RCP_FAULT_KINDS` (`all`, or
/// `throttle`) let `hack/bench-cloud-faults.sh` run the same scenario as a benchmark.
#[tokio::test]
async fn load_balancers_converge_under_30_percent_cloud_faults() -> Result<()> {
    let share: f64 = env_or("RCP_FAULT_SHARE", 0.3);
    let count: usize = env_or("RCP_FAULT_SERVICES", 2);
    let kinds = match std::env::var("RCP_FAULT_KINDS").as_deref() {
        Ok("throttle") => vec![FaultKind::Throttle],
        _ => FaultKind::ALL.to_vec(),
    };
    let rig = AwsChaosRig::start(2, &[]).await?;
    rig.proxy.reset_counts();
    let calls_before = rig
        .metric("cloudprovider_aws_api_request_duration_seconds_count")
        .await;
    rig.proxy.set_random_faults(Some(RandomFaults {
        share,
        kinds: kinds.clone(),
        only: vec!["Action=".into()],
    }));
    let start = Instant::now();
    let lifecycles = futures::future::join_all((0..count).map(|i| {
        let rig = rig.clone();
        async move { rig.service_lifecycle(&format!("faulty-{i}"), LIMIT).await }
    }))
    .await;
    let took = start.elapsed();
    rig.proxy.set_random_faults(None);
    let mut problems = Vec::new();
    for l in lifecycles {
        problems.extend(l?.problems);
    }
    let leftovers = rig.leftovers(LIMIT).await?;
    let requests = rig.proxy.total();
    let logical = rig
        .metric("cloudprovider_aws_api_request_duration_seconds_count")
        .await
        - calls_before;
    let throttled = rig.metric("cloudprovider_aws_api_throttled_requests_total").await;
    let errors = rig.metric("cloudprovider_aws_api_request_errors").await;
    let panics = rig.metric("controller_panics_total").await;
    println!(
        "faults {:.0} % ({kinds:?}): {count} Services through create/add port/NLB/delete in {took:.1?}; {requests} HTTP requests ({} faulted: {:?}); {logical} provider calls ({errors} failed after the SDK's retries); {:.2} HTTP requests per provider call; {:.2} requests/s; throttled attempts counted {throttled}; panics {panics}",
        share * 100.0,
        rig.proxy.faulted(),
        rig.proxy.faulted_by_kind(),
        requests as f64 / logical.max(1.0),
        requests as f64 / took.as_secs_f64(),
    );
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        leftovers.classic.is_empty()
            && leftovers.network.is_empty()
            && leftovers.target_groups.is_empty()
            && leftovers.security_groups.is_empty()
            && leftovers.node_group_rules == rig.node_rules_at_start(),
        "left behind: {leftovers:?}"
    );
    assert_eq!(panics, 0.0);
    if share > 0.0 {
        assert!(rig.proxy.faulted() > 0, "faults were injected");
        assert!(
            throttled > 0.0,
            "throttling answers are counted in the throttling metric"
        );
    }
    Ok(())
}
