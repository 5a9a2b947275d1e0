//! Generic controller-manager machinery (the counterpart of `k8s.io/controller-manager`).
//!
//! This crate is being built up; see the repository's issues for what is implemented.
