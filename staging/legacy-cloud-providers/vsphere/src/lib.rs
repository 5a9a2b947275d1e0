//! The staged vSphere cloud provider (the counterpart of `legacy-cloud-providers/vsphere`).
//!
//! This crate is being built up; see the repository's issues for what is implemented.
