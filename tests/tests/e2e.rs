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
