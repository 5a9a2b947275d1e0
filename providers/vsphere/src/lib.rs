//! The out-of-tree vSphere cloud provider (phase 2: builds on `k8s-legacy-cloud-provider-vsphere`).
//!
//! This crate is being built up; see the repository's issues for what is implemented.
