//! The README's main job as a user starts it: `LOCAL_UP_EXIT_AFTER_START=1
//! hack/local-up-cluster.sh [--provider openstack]` (the script, not the harness it runs) brings
//! up a cluster whose kubelets' Nodes the CCM Pod initialised, a LoadBalancer Service `hello`
//! with its cloud address, and a Ready CCM Pod, and prints them. The image is the debug build
//! (`RCP_IMAGE_PROFILE=dev`), as the release build takes ~15 min on 2 cores.
//!
//! In the real-node cluster group (`.config/nextest.toml`): the script's nodes claim the same
//! routes as the other real-node cluster tests. They ran after the test run until 2026-11-28
//! (~80 s of a CI run's serial tail); here they run beside the other tests.

use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use rcp_e2e::paths;
use regex::Regex;

/// Runs `hack/local-up-cluster.sh ARGS` until it has printed the cluster, and returns what it
/// printed (stdout and stderr, in a file under the test's temporary directory).
fn local_up(args: &[&str]) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let log_path = dir.path().join("local-up-cluster.log");
    let log = std::fs::File::create(&log_path)?;
    let status = Command::new(paths::workspace_root().join("hack/local-up-cluster.sh"))
        .args(args)
        .env("RCP_IMAGE_PROFILE", "dev")
        .env("LOCAL_UP_EXIT_AFTER_START", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .context("running hack/local-up-cluster.sh")?;
    let out = std::fs::read_to_string(&log_path)?;
    ensure!(
        status.success(),
        "hack/local-up-cluster.sh {args:?} failed ({status}):\n{out}"
    );
    Ok(out)
}

/// The line of `kubectl get pods` of a Ready CCM Pod.
const READY_CCM_POD: &str = r"cloud-controller-manager-[a-z0-9]+ +1/1 +Running";

/// Fails with the whole output unless `pattern` matches a line of it.
fn printed(out: &str, pattern: &str, what: &str) -> Result<()> {
    let re = Regex::new(pattern)?;
    ensure!(
        out.lines().any(|l| re.is_match(l)),
        "hack/local-up-cluster.sh printed no {what} (no line matches {pattern:?}):\n{out}"
    );
    Ok(())
}

#[test]
fn the_main_job_on_aws_prints_initialised_nodes_an_elb_and_a_ready_ccm_pod() -> Result<()> {
    let out = local_up(&[])?;
    printed(
        &out,
        r"aws:///us-east-1",
        "Node initialised with an AWS provider ID",
    )?;
    printed(
        &out,
        r"hello +LoadBalancer .*\.elb\.amazonaws\.com",
        "load balancer for default/hello",
    )?;
    printed(&out, READY_CCM_POD, "Ready CCM Pod")
}

#[test]
fn the_main_job_on_openstack_prints_initialised_nodes_a_floating_ip_and_a_ready_ccm_pod() -> Result<()> {
    let out = local_up(&["--provider", "openstack"])?;
    printed(
        &out,
        r"openstack:///",
        "Node initialised with an OpenStack provider ID",
    )?;
    printed(
        &out,
        r"hello +LoadBalancer .*172\.24\.77\.",
        "floating IP for default/hello",
    )?;
    printed(&out, READY_CCM_POD, "Ready CCM Pod")
}
