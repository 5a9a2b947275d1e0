//! The staged AWS cloud provider (the counterpart of `legacy-cloud-providers/aws`).
//!
//! This crate is being built up; see the repository's issues for what is implemented.
