//! Typed bindings for the vCenter vim25 SOAP API and the vSphere Automation REST API.
//!
//! This crate is being built up; see the repository's issues for what is implemented.
