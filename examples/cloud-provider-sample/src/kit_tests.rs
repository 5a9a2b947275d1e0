//! The sample against a real kube-apiserver, with the framework's test kit
//! (`k8s-cloud-provider-testkit`): what a vendor's CI runs for their provider.

use std::time::Duration;

use k8s_cloud_provider::{
    k8s_openapi::api::core::v1::{Node, Service},
    kube::Api,
};
use k8s_cloud_provider_testkit::{ControlPlane, objects, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_their_machines_and_services_their_pool_addresses() {
    let cp = ControlPlane::start()
        .await
        .expect("etcd and kube-apiserver");
    let inventory = cp.dir().join("inventory.json");
    std::fs::write(
        &inventory,
        r#"{ "machines": [ { "id": "m-1", "name": "node-a", "type": "small", "zone": "zone-a",
             "region": "region-1",
             "addresses": [ { "type": "InternalIP", "address": "10.0.0.1" } ] } ] }"#,
    )
    .expect("inventory");
    let config = cp.dir().join("cloud.conf");
    std::fs::write(
        &config,
        format!(
            "[Global]\ninventory = {}\n\n[LoadBalancer]\naddress-pool = 192.0.2.10-192.0.2.10\n",
            inventory.display()
        ),
    )
    .expect("cloud config");
    let ccm = cp
        .run_ccm(
            crate::provider::provider_spec(),
            &[
                &format!("--cloud-config={}", config.display()),
                "--controllers=cloud-node,service,pool-usage",
                "--pool-usage-interval=1s",
            ],
        )
        .expect("the sample's flags are accepted");
    let client = cp.client().await.expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&Default::default(), &objects::node("node-a"))
        .await
        .expect("node-a");
    let provider_id = wait_for("node-a initialised", Duration::from_secs(60), || async {
        nodes.get("node-a").await.ok()?.spec?.provider_id
    })
    .await
    .expect("node-a initialised");
    assert_eq!(provider_id, "sample://m-1");
    let services: Api<Service> = Api::namespaced(client, "default");
    services
        .create(
            &Default::default(),
            &objects::load_balancer_service("web", &[80]),
        )
        .await
        .expect("web");
    let ip = wait_for("web's address", Duration::from_secs(60), || async {
        objects::ingress(&services.get("web").await.ok()?)
    })
    .await
    .expect("web's address");
    assert_eq!(ip, "192.0.2.10");
    ccm.stop().await.expect("a clean stop");
}
