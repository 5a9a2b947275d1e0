//! Shared by the `bench-*` binaries: the AWS calls a CCM made (from its own metrics), its CPU
//! time and peak memory, printed in the same form by every benchmark.

use std::collections::BTreeMap;

use anyhow::Result;

use crate::ccm::CcmProcess;

/// The CCM's histogram of AWS requests: its `_count` series count the calls by operation, its
/// `_sum` series add up the seconds they took (SDK retries included).
pub const AWS_CALLS_METRIC: &str = "cloudprovider_aws_api_request_duration_seconds";

/// Calls of one AWS operation: how many, and the seconds they took in all.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallStats {
    /// Calls made.
    pub count: f64,
    /// Seconds spent waiting for their answers.
    pub seconds: f64,
}

/// AWS calls by operation label (`describe_instances`, `elb_create_load_balancer`, …) so far.
pub async fn aws_calls(ccm: &CcmProcess) -> Result<BTreeMap<String, CallStats>> {
    let metrics = ccm.metrics().await?;
    Ok(parse_aws_calls(&metrics))
}

/// [`aws_calls`] of a `/metrics` text.
pub fn parse_aws_calls(metrics: &str) -> BTreeMap<String, CallStats> {
    let mut out: BTreeMap<String, CallStats> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(AWS_CALLS_METRIC) else {
            continue;
        };
        let is_count = rest.starts_with("_count{");
        if !is_count && !rest.starts_with("_sum{") {
            continue;
        }
        let Some((series, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let Some(op) = series
            .split("request=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        let stats = out.entry(op.to_string()).or_default();
        if is_count {
            stats.count += value;
        } else {
            stats.seconds += value;
        }
    }
    out
}

/// The calls made between two snapshots of [`aws_calls`], by operation (only those made).
pub fn calls_between(
    before: &BTreeMap<String, CallStats>,
    after: &BTreeMap<String, CallStats>,
) -> BTreeMap<String, CallStats> {
    after
        .iter()
        .map(|(op, total)| {
            let earlier = before.get(op).copied().unwrap_or_default();
            let made = CallStats {
                count: total.count - earlier.count,
                seconds: total.seconds - earlier.seconds,
            };
            (op.clone(), made)
        })
        .filter(|(_, made)| made.count > 0.0)
        .collect()
}

/// The API an operation label belongs to.
pub fn api_of(operation: &str) -> &'static str {
    if operation.starts_with("elbv2_") {
        "ELBv2"
    } else if operation.starts_with("elb_") {
        "ELB"
    } else {
        "EC2"
    }
}

/// Prints the calls made between two snapshots, grouped by API (ELB, ELBv2, EC2), with the
/// count per `unit` (e.g. 500 Services) and each operation's mean and total answer time (the
/// time is summed over concurrent calls, so it shows where the cloud's time goes, not wall
/// time), and returns their total count.
pub fn print_calls(
    phase: &str,
    before: &BTreeMap<String, CallStats>,
    after: &BTreeMap<String, CallStats>,
    units: usize,
    unit: &str,
) -> f64 {
    let mut by_api: BTreeMap<&str, Vec<(String, CallStats)>> = BTreeMap::new();
    for (op, made) in calls_between(before, after) {
        by_api.entry(api_of(&op)).or_default().push((op, made));
    }
    let mut total = 0.0;
    for (api, ops) in &by_api {
        let sum: f64 = ops.iter().map(|(_, s)| s.count).sum();
        total += sum;
        println!(
            "  {phase}: {api} calls {sum} ({:.3} per {unit})",
            sum / units.max(1) as f64
        );
        for (op, s) in ops {
            println!(
                "    {op}: {} (mean {:.1} ms, {:.1} s in all)",
                s.count,
                1000.0 * s.seconds / s.count.max(1.0),
                s.seconds
            );
        }
    }
    if by_api.is_empty() {
        println!("  {phase}: no AWS calls");
    }
    total
}

/// CPU seconds (user + system) a process has used so far, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / clock_ticks_per_second() as f64)
}

/// `sysconf(_SC_CLK_TCK)` as `getconf CLK_TCK` prints it (100 on every Linux we run on).
fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// Prints the CCM's CPU seconds so far and its peak RSS.
pub fn print_process_figures(ccm: &CcmProcess) {
    if let Some(cpu) = cpu_seconds(ccm.pid()) {
        println!("CCM CPU time (user + system): {cpu:.2} s");
    }
    if let Some(kb) = ccm.peak_rss_kb() {
        println!("CCM peak RSS (VmHWM): {:.1} MB", kb as f64 / 1024.0);
    }
}

/// The CCM flags a benchmark ran with, for its heading.
pub fn describe_flags(extra: &[String]) -> String {
    if extra.is_empty() {
        "(defaults)".into()
    } else {
        extra.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_read_by_operation_and_subtracted() {
        let before = parse_aws_calls(
            "cloudprovider_aws_api_request_duration_seconds_count{request=\"describe_instances\"} 3\n",
        );
        let after = parse_aws_calls(
            "# HELP x\ncloudprovider_aws_api_request_duration_seconds_count{request=\"describe_instances\"} 5\n\
             cloudprovider_aws_api_request_duration_seconds_count{request=\"create_route\"} 7\n\
             cloudprovider_aws_api_request_duration_seconds_sum{request=\"create_route\"} 0.5\n\
             cloudprovider_aws_api_request_duration_seconds_bucket{request=\"create_route\",le=\"1\"} 7\n",
        );
        let made = calls_between(&before, &after);
        let count = |op: &str| made.get(op).map(|s| s.count);
        assert_eq!(count("describe_instances"), Some(2.0));
        assert_eq!(count("create_route"), Some(7.0));
        assert_eq!(made["create_route"].seconds, 0.5);
        assert_eq!(made.len(), 2);
        assert_eq!(api_of("elbv2_create_load_balancer"), "ELBv2");
        assert_eq!(api_of("elb_create_load_balancer"), "ELB");
        assert_eq!(api_of("create_route"), "EC2");
    }

    #[test]
    fn the_cpu_time_of_this_process_grows_when_it_computes() {
        // Computes until 0.05 s of CPU are counted, for at most 20 s of wall time: on a loaded
        // machine (CI's 2 cores) 200 ms of wall time gave this process only 0.03 s of CPU.
        let before = cpu_seconds(std::process::id()).expect("own /proc/<pid>/stat");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        let mut after = before;
        while after - before < 0.05 && start.elapsed() < std::time::Duration::from_secs(20) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            after = cpu_seconds(std::process::id()).expect("own /proc/<pid>/stat");
        }
        assert!(
            after - before >= 0.05,
            "{before} → {after} after {:?} of computing",
            start.elapsed()
        );
    }
}
