//! `cloud-controller-manager-openstack orphans`: lists the Octavia load balancers and floating
//! IPs this cluster made that no Service wants any more; with `--delete` (after a confirmation,
//! or `--yes`) deletes them, reading each again (and every Service) right before. The rules are
//! those of [`k8s_legacy_cloud_provider_openstack::orphans`]. Reads every Service of the cluster
//! first: if that fails, nothing is listed or deleted. `--cluster-name` is the CCM's (its load
//! balancers are named after it); another cluster's resources never match. `--delete` first
//! checks that the kubeconfig's cluster is one of the cloud config's project
//! ([`OpenStackCloud::verify_cluster`](k8s_legacy_cloud_provider_openstack::OpenStackCloud::verify_cluster):
//! its Nodes' servers are there); otherwise nothing is deleted.
//!
//! What every provider's `orphans` does is [`k8s_cloud_provider::orphans`]'s: the Services
//! listed before and after the cloud's resources, deadlines for the listing and the prompt,
//! the Services listed again before each deletion.
//!
//! Output: a table (`--output=tsv`: one tab-separated line per orphan: kind, name, ID, the
//! Service it was made for, why). Exit code: 0 when the listing (and every deletion)
//! succeeded, 1 otherwise.

use std::{process::ExitCode, sync::Arc};

use clap::{Args, FromArgMatches};
use k8s_cloud_provider::{
    app::{ClusterAccessFlags, ProviderCommand},
    orphans::{OrphanFinder, OrphanRow, OrphansRunFlags},
};
use k8s_legacy_cloud_provider_openstack::{OpenStackCloud, orphans::Orphan};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, api::ListParams};

/// Find the load balancers, floating IPs and security groups this cluster made that no Service wants, and
/// optionally delete them.
#[derive(Debug, Clone, Args)]
pub struct OrphansFlags {
    /// Cluster and cloud access.
    #[command(flatten)]
    pub access: ClusterAccessFlags,
    /// The --cluster-name the CCM runs with (its load balancers are named
    /// kube_service_<cluster>_<namespace>_<name>).
    #[arg(long = "cluster-name", default_value = "kubernetes")]
    pub cluster_name: String,
    /// Deleting, prompting, deadlines, output.
    #[command(flatten)]
    pub run: OrphansRunFlags,
}

/// The command as the OpenStack binary registers it.
pub fn provider_command() -> ProviderCommand {
    ProviderCommand {
        name: "orphans",
        about: "List (and with --delete, delete) the Octavia load balancers, floating IPs and security groups (manage-security-groups) this cluster made that no Service wants any more",
        flags: <OrphansFlags as Args>::augment_args,
        run: |matches| Box::pin(async move { run(matches).await }),
    }
}

async fn run(matches: clap::ArgMatches) -> ExitCode {
    let flags = match OrphansFlags::from_arg_matches(&matches) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match orphans(&flags).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The OpenStack side of `orphans`.
struct OpenStackOrphans {
    cloud: Arc<OpenStackCloud>,
    client: kube::Client,
    cluster: String,
}

#[k8s_cloud_provider::async_trait]
impl OrphanFinder for OpenStackOrphans {
    type Orphan = Orphan;

    fn row(&self, o: &Orphan) -> OrphanRow {
        OrphanRow::new(o.kind.to_string(), &o.name, &o.id, &o.owner, &o.reason)
    }

    fn plan_step(&self, o: &Orphan) -> String {
        format!(
            "read it again, check no Service wants it, delete the {} (as the Service's deletion would)",
            o.kind
        )
    }

    fn nothing_found(&self) -> String {
        format!(
            "No orphans: every load balancer, floating IP and security group cluster {:?} made is wanted by a Service.",
            self.cluster
        )
    }

    async fn verify_cluster(&self) -> Result<String, String> {
        // The kubeconfig's cluster is one of the cloud config's project (its Nodes' servers are
        // there).
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| format!("listing the cluster's Nodes (nothing is deleted without them): {e}"))?;
        self.cloud.verify_cluster(&nodes).await.map_err(|e| e.to_string())
    }

    async fn find(&self, services: &[Service]) -> Result<Vec<Orphan>, String> {
        // In the listing's order: floating IPs, load balancers, then security groups (as a
        // Service's deletion).
        self.cloud
            .orphans(&self.cluster, services)
            .await
            .map_err(|e| format!("listing cloud resources: {e}"))
    }

    async fn delete(&self, o: &Orphan, services: &[Service]) -> Result<(), String> {
        self.cloud
            .delete_orphan(&self.cluster, services, o)
            .await
            .map_err(|e| e.to_string())
    }
}

async fn orphans(flags: &OrphansFlags) -> Result<bool, String> {
    let client = flags
        .access
        .kube_client("cloud-controller-manager-openstack/orphans")
        .await?;
    let finder = OpenStackOrphans {
        cloud: super::openstack_cloud(flags.access.cloud_config_bytes()?).await?,
        client: client.clone(),
        cluster: flags.cluster_name.clone(),
    };
    k8s_cloud_provider::orphans::run(&finder, &client, &flags.run).await
}
