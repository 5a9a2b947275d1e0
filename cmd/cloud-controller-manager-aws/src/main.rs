//! `cloud-controller-manager-aws`: the cloud-controller-manager with the aws provider.
//!
//! The application (flags, leader election, controllers) is not wired in yet: this binary only
//! proves that the aws provider links alone. It prints that and exits non-zero.

fn main() {
    eprintln!(
        "cloud-controller-manager-aws {}: the controller-manager application is not implemented yet",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
