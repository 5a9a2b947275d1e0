//! The end-to-end tests: one test binary, one module per area (the file of the same name), so
//! that the harness, kube, k8s-openapi and the AWS SDK are compiled and linked once instead of
//! once per area (a clean build of the 36 binaries took 102 s on 2 cores, 197 s of CPU; of this
//! one 37 s, 69 s of CPU). nextest still runs each test in a process of its own; a test's name
//! starts with its area (`aws_lb::classic::…`, `real_cluster::…`), which `.config/nextest.toml`
//! filters on.

mod app;
mod aws;
mod aws_cloud_call_timeout;
mod aws_cloud_config;
mod aws_doctor;
#[path = "aws_lb/main.rs"]
mod aws_lb;
mod aws_lb_adoption;
mod aws_orphans;
mod aws_orphans_safety;
mod aws_shadow;
mod aws_tagging;
mod aws_upstream;
mod charts;
mod cloud_controllers;
mod deploy;
mod ecr_credential_provider;
mod harness;
mod image;
mod leader_supervision;
mod migration;
mod migration_guide;
mod node_ipam;
mod openstack;
mod openstack_doctor;
#[path = "openstack_lb/main.rs"]
mod openstack_lb;
mod openstack_scale;
mod real_cluster;
mod real_cluster_local_up;
mod real_cluster_node_ipam;
mod reliability;
mod sample_provider;
mod secure_port;
mod secure_port_load;
mod user_texts;
mod vsphere;
mod vsphere_doctor;
mod vsphere_safety;

/// Every file and directory of `tests/tests` is a module of this binary: with `autotests = false`
/// (tests/Cargo.toml), a test file not declared above would never be compiled or run.
#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let this = include_str!("e2e.rs");
    let dir = rcp_e2e::paths::workspace_root().join("tests/tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/tests is readable") {
        let name = entry.expect("a directory entry").file_name();
        let name = name.to_string_lossy();
        let module = name.strip_suffix(".rs").unwrap_or(&name);
        if module != "e2e" && !this.contains(&format!("\nmod {module};\n")) {
            missing.push(name.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "not declared as modules in tests/tests/e2e.rs (never compiled or run): {missing:?}"
    );
}

/// `cargo metadata --no-deps` of the workspace, as JSON.
fn workspace_metadata() -> serde_json::Value {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .current_dir(rcp_e2e::paths::workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {out:?}");
    serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON")
}

/// The binaries built without a test harness (`test = false` in their Cargo.toml, so that CI
/// builds no empty test binary of them) hold no tests: one added there would never run.
#[test]
fn binaries_without_a_test_build_hold_no_tests() {
    let metadata = workspace_metadata();
    let mut without_test_build = 0;
    let mut holding_tests = Vec::new();
    for target in metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .flat_map(|p| p["targets"].as_array().expect("targets"))
        .filter(|t| t["test"] == false)
    {
        without_test_build += 1;
        let path = target["src_path"].as_str().expect("src_path");
        let source = std::fs::read_to_string(path).expect("the target's source is readable");
        if ["#[test]", "#[tokio::test]", "#[cfg(test)]"]
            .iter()
            .any(|attr| source.contains(attr))
        {
            holding_tests.push(path.to_string());
        }
    }
    assert!(
        without_test_build > 0,
        "no target has test = false: this check checks nothing"
    );
    assert!(
        holding_tests.is_empty(),
        "tests in targets built with test = false (they would never run): {holding_tests:?}"
    );
}

/// No crate of the workspace asks for a feature of tokio the shipped binaries do not have, for
/// its tests either: with one (`test-util` did so), the workspace's test build has its own tokio
/// and rebuilds everything above it (kube, hyper, the AWS SDK, our crates) beside the binaries
/// the tests run, which were built with the shipped features (~50 units, the AWS SDK twice). A
/// test that needs a clock takes it as an argument instead (`TokenBucket::reserve_at`).
#[test]
fn no_test_asks_tokio_for_features_the_shipped_binaries_lack() {
    let metadata = workspace_metadata();
    let mut dev_only = Vec::new();
    let mut shipped = std::collections::BTreeSet::new();
    let mut tokio_dependencies = 0;
    for package in metadata["packages"].as_array().expect("packages") {
        for dependency in package["dependencies"].as_array().expect("dependencies") {
            if dependency["name"] != "tokio" {
                continue;
            }
            tokio_dependencies += 1;
            let features = dependency["features"]
                .as_array()
                .expect("features")
                .iter()
                .map(|f| f.as_str().expect("a feature").to_string());
            if dependency["kind"] == "dev" {
                dev_only
                    .extend(features.map(|f| (package["name"].as_str().unwrap_or_default().to_string(), f)));
            } else {
                shipped.extend(features);
            }
        }
    }
    assert!(
        tokio_dependencies > 0,
        "no crate depends on tokio: this check checks nothing"
    );
    let extra: Vec<_> = dev_only
        .into_iter()
        .filter(|(_, f)| !shipped.contains(f))
        .collect();
    assert!(
        extra.is_empty(),
        "dev-dependencies ask tokio for features no shipped crate asks for (crate, feature): {extra:?}"
    );
}
