//! The tagging controller's flags (upstream `pkg/controllers/options`), with upstream names,
//! defaults and checks, plus two checks of our own (see [`TaggingFlags::validate`]).

use std::collections::BTreeMap;

use clap::{ArgAction, Args};
use k8s_cloud_provider::app::options::go_bool;

/// The only resource kind the controller tags (`--resources`).
pub const RESOURCE_INSTANCE: &str = "instance";

/// Flags of the tagging controller, in their own `--help` section. Field names (clap's argument
/// IDs) start with `tagging_` where the framework's flags could have the same name.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Tagging controller flags")]
pub struct TaggingFlags {
    /// Tags to apply to AWS resources in the tagging controller, in a form of key=value
    /// (comma-separated; the flag may be repeated).
    #[arg(long = "tags", action = ArgAction::Append)]
    pub tags: Vec<String>,
    /// AWS resources name to add/remove tags in the tagging controller (supported: instance;
    /// repeat the flag for more).
    #[arg(long = "resources", action = ArgAction::Append)]
    pub resources: Vec<String>,
    /// Steady-state rate limit (per sec) at which the controller processes items in its queue.
    /// A value of zero (default) disables rate limiting.
    #[arg(
        long = "tagging-controller-rate-limit",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub tagging_rate_limit: f64,
    /// Burst limit at which the controller processes items in its queue. A value of zero
    /// (default) disables rate limiting.
    #[arg(
        long = "tagging-controller-burst-limit",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub tagging_burst_limit: i64,
    /// The number of workers concurrently synchronizing nodes.
    #[arg(
        long = "tagging-controller-concurrent-node-syncs",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub tagging_concurrent_node_syncs: i64,
    /// Enables batching create and delete tag calls.
    #[arg(long = "tagging-controller-enable-batching", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub tagging_enable_batching: bool,
}

/// The tagging controller's settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TaggingOptions {
    /// `--tags`, merged (a later flag's key wins).
    pub tags: BTreeMap<String, String>,
    /// `--resources` (each is `instance`).
    pub resources: Vec<String>,
    /// `--tagging-controller-rate-limit` and `--tagging-controller-burst-limit`, when both are
    /// positive: the queue's overall token bucket, applied to every enqueue as upstream.
    pub rate_limit: Option<(f64, u32)>,
    /// `--tagging-controller-concurrent-node-syncs`.
    pub workers: usize,
    /// `--tagging-controller-enable-batching`.
    pub batching: bool,
}

/// Parses one `--tags` value: `k=v` pairs separated by commas, each split at its first `=`
/// (pflag's `StringToString`; unlike pflag, no CSV quoting: a value cannot hold a comma).
pub fn parse_tags(value: &str, into: &mut BTreeMap<String, String>) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    for pair in value.split(',') {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("--tags: {pair:?} in {value:?} must be formatted as key=value"))?;
        into.insert(k.to_string(), v.to_string());
    }
    Ok(())
}

impl TaggingFlags {
    /// Checks the flags as upstream's `Validate` does (every problem reported, each naming its
    /// flag and value) and, deliberately beyond upstream:
    /// - a tag key must be 1–128 characters and a value at most 256 (EC2's limits), and must not
    ///   start with `aws:` (reserved by AWS): otherwise every `CreateTags` would fail;
    /// - a key must not be a cluster-ownership tag (`kubernetes.io/cluster/…`,
    ///   `KubernetesCluster`): the provider reads those to decide which resources the cluster
    ///   owns, and the controller removes its tags when a Node goes — it must never change
    ///   what the cluster owns.
    pub fn validate(&self) -> Result<TaggingOptions, Vec<String>> {
        let mut errors = Vec::new();
        let mut tags = BTreeMap::new();
        for value in &self.tags {
            if let Err(e) = parse_tags(value, &mut tags) {
                errors.push(e);
            }
        }
        if tags.is_empty() && errors.is_empty() {
            errors.push("--tags must not be empty and must be a form of key=value".to_string());
        }
        for (k, v) in &tags {
            if k.is_empty() || k.chars().count() > 128 {
                errors.push(format!("--tags: key {k:?} must be 1 to 128 characters long"));
            }
            if v.chars().count() > 256 {
                errors.push(format!(
                    "--tags: the value of {k:?} is longer than 256 characters"
                ));
            }
            if k.starts_with("aws:") {
                errors.push(format!(
                    "--tags: key {k:?} uses the prefix aws:, which AWS reserves"
                ));
            }
            if k.starts_with("kubernetes.io/cluster/") || k == "KubernetesCluster" {
                errors.push(format!(
                    "--tags: key {k:?} is a cluster-ownership tag, which the tagging controller must not set or remove"
                ));
            }
        }
        if self.resources.is_empty() {
            errors.push("--resources must not be empty".to_string());
        }
        for r in &self.resources {
            if r != RESOURCE_INSTANCE {
                errors.push(format!(
                    "--resources: {r} is not a supported resource. Current supported resources [{RESOURCE_INSTANCE}]"
                ));
            }
        }
        if self.tagging_rate_limit < 0.0 || !self.tagging_rate_limit.is_finite() {
            errors.push(format!(
                "--tagging-controller-rate-limit should not be less than zero (got {})",
                self.tagging_rate_limit
            ));
        }
        if self.tagging_burst_limit < 0 {
            errors.push(format!(
                "--tagging-controller-burst-limit should not be less than zero (got {})",
                self.tagging_burst_limit
            ));
        }
        if self.tagging_concurrent_node_syncs <= 0 {
            errors.push(format!(
                "--tagging-controller-concurrent-node-syncs must be a positive number (got {})",
                self.tagging_concurrent_node_syncs
            ));
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let rate_limit = (self.tagging_rate_limit > 0.0 && self.tagging_burst_limit > 0).then(|| {
            (
                self.tagging_rate_limit,
                u32::try_from(self.tagging_burst_limit).unwrap_or(u32::MAX),
            )
        });
        Ok(TaggingOptions {
            tags,
            resources: self.resources.clone(),
            rate_limit,
            workers: usize::try_from(self.tagging_concurrent_node_syncs).unwrap_or(1),
            batching: self.tagging_enable_batching,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::{FromArgMatches, Parser};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: TaggingFlags,
    }

    fn parse(args: &[&str]) -> Result<TaggingOptions, Vec<String>> {
        let m = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(std::iter::once("ccm").chain(args.iter().copied()))
            .map_err(|e| vec![e.to_string()])?;
        TaggingFlags::from_arg_matches(&m)
            .map_err(|e| vec![e.to_string()])?
            .validate()
    }

    #[test]
    fn flags_parse_as_upstream() {
        let o = parse(&[
            "--tags=a=1,b=x=y",
            "--tags",
            "c=",
            "--resources",
            "instance",
            "--tagging-controller-rate-limit=2.5",
            "--tagging-controller-burst-limit=4",
            "--tagging-controller-concurrent-node-syncs=3",
            "--tagging-controller-enable-batching",
        ])
        .expect("valid");
        let tags: Vec<_> = o.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(tags, ["a=1", "b=x=y", "c="]);
        assert_eq!(o.rate_limit, Some((2.5, 4)));
        assert_eq!(o.workers, 3);
        assert!(o.batching);
        let d = parse(&["--tags=a=1", "--resources=instance"]).expect("valid");
        assert_eq!((d.rate_limit, d.workers, d.batching), (None, 1, false));
        let half = parse(&[
            "--tags=a=1",
            "--resources=instance",
            "--tagging-controller-rate-limit=3",
        ])
        .expect("valid");
        assert_eq!(
            half.rate_limit, None,
            "a rate without a burst keeps the default limiter"
        );
    }

    #[test]
    fn every_bad_flag_is_named_with_its_value() {
        let errors = parse(&[
            "--tags=novalue",
            "--resources=volume",
            "--tagging-controller-rate-limit=-1",
            "--tagging-controller-burst-limit=-2",
            "--tagging-controller-concurrent-node-syncs=0",
        ])
        .expect_err("invalid");
        let all = errors.join("\n");
        for needle in [
            "--tags: \"novalue\"",
            "--resources: volume is not a supported resource",
            "--tagging-controller-rate-limit should not be less than zero (got -1)",
            "--tagging-controller-burst-limit should not be less than zero (got -2)",
            "--tagging-controller-concurrent-node-syncs must be a positive number (got 0)",
        ] {
            assert!(all.contains(needle), "{needle} missing from {all}");
        }
        let missing = parse(&[]).expect_err("invalid");
        assert!(
            missing.iter().any(|e| e.starts_with("--tags must not be empty")),
            "{missing:?}"
        );
        assert!(
            missing.iter().any(|e| e == "--resources must not be empty"),
            "{missing:?}"
        );
    }

    #[test]
    fn ownership_and_reserved_tags_are_refused() {
        for (tag, why) in [
            ("kubernetes.io/cluster/prod=owned", "cluster-ownership tag"),
            ("KubernetesCluster=prod", "cluster-ownership tag"),
            ("aws:cloudformation:stack-name=x", "prefix aws:"),
            ("=v", "1 to 128 characters"),
        ] {
            let e = parse(&[&format!("--tags={tag}"), "--resources=instance"]).expect_err(tag);
            assert!(e.join(" ").contains(why), "{tag}: {e:?}");
        }
    }
}
