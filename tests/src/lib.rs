//! The end-to-end test harness: real servers on 127.0.0.1, started per test and stopped when
//! their handles drop (also when a test panics; their logs are printed then).
//!
//! - [`TestCluster`]: etcd + kube-apiserver (hack/kube/go.mod's version, RBAC on), an admin kubeconfig, kubeconfigs
//!   for other users (impersonation) and service accounts (TokenRequest).
//! - [`Moto`]: moto's AWS emulator, with [`moto::World`] to build a cluster-tagged VPC.
//! - [`Vcsim`]: govmomi's vCenter simulator.
//! - [`openstack::OpenStack`]: a real OpenStack (keystone, nova, neutron, octavia) shared by the
//!   run, with a [`openstack::Project`] and catalog region per test.
//! - [`imds::ImdsStub`]: an EC2 instance-metadata server for one instance of a moto world.
//! - [`fault_proxy::FaultProxy`]: a rule-driven proxy that hides, empties, delays or drops
//!   chosen requests to a test server, or injects random faults.
//! - [`aws_chaos::AwsChaosRig`]: the AWS CCM killed and restarted mid-operation, with the
//!   cloud's state checked after every step of a Service's life.
//!
//! The servers are installed by `hack/install-test-deps.sh`; see [`paths`].

pub mod aws_chaos;
pub mod bench;
pub mod ccm;
pub mod certs;
pub mod cluster;
pub mod fault_proxy;
pub mod imds;
pub mod k8s;
pub mod kcm;
pub mod kube_node;
pub mod local_up;
pub mod moto;
pub mod openstack;
pub mod paths;
pub mod process;
pub mod registry;
pub mod secrets;
pub mod vcsim;

pub use cluster::TestCluster;
pub use moto::Moto;
pub use vcsim::Vcsim;

/// One-time process set-up for tests: the rustls crypto provider (aws-lc-rs, the one every TLS
/// user in this workspace is built with) and a tracing subscriber writing to the test output.
pub fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client=error")),
            )
            .with_test_writer()
            .try_init();
    });
}
