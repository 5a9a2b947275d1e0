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
