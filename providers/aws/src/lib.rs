//! The out-of-tree AWS cloud provider (phase 2: builds on `k8s-legacy-cloud-provider-aws`).
//!
//! This crate is being built up; see the repository's issues for what is implemented.
