//! Controllers of the AWS cloud-controller-manager beyond the framework's four (upstream
//! `pkg/controllers`).

pub mod tagging;
