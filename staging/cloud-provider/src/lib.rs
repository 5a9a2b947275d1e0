//! The Kubernetes cloud-provider framework in Rust (the counterpart of `k8s.io/cloud-provider`).
//!
//! This crate is being built up; see the repository's issues for what is implemented.
