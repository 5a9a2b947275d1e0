//! `cloud-controller-manager-vsphere`: the cloud-controller-manager with the vsphere provider.
//!
//! The application (flags, leader election, controllers) is not wired in yet: this binary only
//! proves that the vsphere provider links alone. It prints that and exits non-zero.

fn main() {
    eprintln!(
        "cloud-controller-manager-vsphere {}: the controller-manager application is not implemented yet",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
