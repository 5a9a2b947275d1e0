//! Kubernetes helpers for the tests: object builders, polling, events, in-process controllers.

use std::{future::Future, sync::Arc, time::Duration};

use anyhow::{Result, bail};
use k8s_cloud_provider::{
    CloudProvider,
    controllers::{ControllerContext, ControllersConfig, start_controller},
    well_known::TAINT_UNINITIALIZED,
};
use k8s_controller_manager::{events::EventBroadcaster, metrics::Metrics};
use k8s_openapi::api::core::v1::{Event, Node, NodeSpec, Service, ServicePort, ServiceSpec, Taint};
use kube::{Api, Client, api::ObjectMeta};
use tokio_util::sync::CancellationToken;

/// Polls `f` every 50 ms until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Node as kubelet `--cloud-provider=external` registers it: with the uninitialized taint.
pub fn tainted_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: TAINT_UNINITIALIZED.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// An initialised Node (no taint) with `spec.providerID`, as after the cloud-node controller.
pub fn node_with_provider_id(name: &str, provider_id: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.into()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The API server's count of requests for `resource` with `verb` (`apiserver_request_total`,
/// e.g. `tokenreviews` / `POST`): what a component asked of it.
pub async fn apiserver_requests(client: &Client, resource: &str, verb: &str) -> Result<f64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains(&format!("resource=\"{resource}\""))
                && l.contains(&format!("verb=\"{verb}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// core/v1 Events in `namespace` about the object `name`, as `(reason, message, source component)`.
pub async fn events_for(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<(String, String, String)>> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
                e.source.and_then(|s| s.component).unwrap_or_default(),
            )
        })
        .collect())
}

/// Waits until an Event about `name` satisfies `matches(reason, message)` and returns all of
/// its events. Events are written by a background task, so a test never reads them once and
/// asserts: the action that queued one can be visible before the Event is stored.
pub async fn wait_for_event(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
    matches: impl Fn(&str, &str) -> bool,
) -> Result<Vec<(String, String, String)>> {
    let found = wait_for(&format!("an event about {namespace}/{name}"), timeout, || async {
        let events = events_for(client, namespace, name).await.ok()?;
        events.iter().any(|e| matches(&e.0, &e.1)).then_some(events)
    })
    .await;
    if found.is_err() {
        let seen = events_for(client, namespace, name).await.unwrap_or_default();
        bail!("no matching event about {namespace}/{name}; events seen: {seen:?}");
    }
    found
}

/// Cloud controllers running inside the test process, stopped on drop.
pub struct InProcessControllers {
    /// Their context (informers, metrics, config).
    pub ctx: ControllerContext,
    shutdown: CancellationToken,
}

impl Drop for InProcessControllers {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts the named controllers (canonical names) with `cloud` and `config` against `client`,
/// and waits until the shared informers have synced.
pub async fn start_controllers(
    client: Client,
    cloud: Arc<dyn CloudProvider>,
    config: ControllersConfig,
    names: &[&str],
) -> Result<InProcessControllers> {
    crate::init();
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let events = EventBroadcaster::start(client.clone(), "test".into(), "localhost".into());
    let ctx = ControllerContext::new(client, cloud, config, metrics, events, shutdown.clone());
    ctx.start_informers();
    for name in names {
        start_controller(name, &ctx).map_err(|e| anyhow::anyhow!("starting {name}: {e}"))?;
    }
    let (nodes, services) = (ctx.nodes.store(), ctx.services.store());
    tokio::time::timeout(Duration::from_secs(30), async {
        nodes.wait_synced().await;
        services.wait_synced().await;
    })
    .await?;
    Ok(InProcessControllers { ctx, shutdown })
}

/// Sets the Node's `Ready` condition (what kubelet would report).
pub async fn set_ready(nodes: &Api<Node>, name: &str, status: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::NodeCondition;
    let cond = NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some("Test".into()),
        ..Default::default()
    };
    patch_node_status(
        nodes,
        name,
        serde_json::json!({ "status": { "conditions": [cond] } }),
    )
    .await
}

/// Merge-patches a Node's status subresource.
pub async fn patch_node_status(nodes: &Api<Node>, name: &str, patch: serde_json::Value) -> Result<()> {
    nodes
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// Waits (up to `timeout`) until the Service `name` has a load-balancer ingress hostname.
pub async fn wait_for_ingress(services: &Api<Service>, name: &str, timeout: Duration) -> Result<Service> {
    wait_for(&format!("{name} ingress"), timeout, || async {
        services
            .get(name)
            .await
            .ok()
            .filter(|s| ingress_hostname(s).is_some())
    })
    .await
}

/// Sets `status.nodeInfo.systemUUID` (what kubelet reports from SMBIOS).
pub async fn set_system_uuid(nodes: &Api<Node>, name: &str, uuid: &str) -> Result<()> {
    let patch = serde_json::json!({"status": {"nodeInfo": {"systemUUID": uuid, "machineID": "", "bootID": "", "kernelVersion": "",
        "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}});
    patch_node_status(nodes, name, patch).await
}

/// The Node, once the cloud-node controller has initialised it (no uninitialized taint, some
/// addresses); `None` before.
pub async fn initialised(nodes: &Api<Node>, name: &str) -> Option<Node> {
    use k8s_cloud_provider::node::helpers::{addresses, has_taint};
    let n = nodes.get_opt(name).await.ok()??;
    (!has_taint(&n, TAINT_UNINITIALIZED) && !addresses(&n).is_empty()).then_some(n)
}

/// Registers `names` the way kubelet `--cloud-provider=external` does (each Node tainted
/// uninitialized) and, with `timeout`, waits until the cloud-node controller has initialised
/// every one of them.
pub async fn register_tainted_nodes(
    nodes: &Api<Node>,
    names: &[&str],
    timeout: Option<Duration>,
) -> Result<()> {
    for name in names {
        nodes
            .create(&kube::api::PostParams::default(), &tainted_node(name))
            .await?;
    }
    if let Some(timeout) = timeout {
        for name in names {
            wait_for(&format!("{name} initialised"), timeout, || {
                initialised(nodes, name)
            })
            .await?;
        }
    }
    Ok(())
}

/// A `type: LoadBalancer` Service in `default` with TCP `ports` (`(port, name)`) and the AWS
/// annotations `annotations`, each key given without the
/// `service.beta.kubernetes.io/aws-load-balancer-` prefix.
pub fn load_balancer_service(name: &str, annotations: &[(&str, &str)], ports: &[(i32, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| {
                        (
                            format!("service.beta.kubernetes.io/aws-load-balancer-{k}"),
                            v.to_string(),
                        )
                    })
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            selector: Some([("app".to_string(), name.to_string())].into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(p, n)| ServicePort {
                        port: *p,
                        name: Some(n.to_string()),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

/// The first `status.loadBalancer.ingress[].ip` of a Service.
pub fn ingress_ip(s: &Service) -> Option<String> {
    s.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
}

/// The first `status.loadBalancer.ingress[].hostname` of a Service.
pub fn ingress_hostname(s: &Service) -> Option<String> {
    s.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .clone()
}

/// Writes the fake provider's cloud config (`dir/fake-cloud.json`) with one instance per node
/// name: `fake://i-<index>`, type `fake.large`, zone `fake-zone-a` of `fake-region`, InternalIP
/// `10.1.0.<index + 1>`. Returns its path.
pub fn write_fake_cloud_config(dir: &std::path::Path, nodes: &[&str]) -> Result<std::path::PathBuf> {
    let instances: serde_json::Map<String, serde_json::Value> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.to_string(),
                serde_json::json!({
                    "providerID": format!("fake://i-{i}"),
                    "instanceType": "fake.large",
                    "zone": "fake-zone-a",
                    "region": "fake-region",
                    "addresses": [{"type": "InternalIP", "address": format!("10.1.0.{}", i + 1)}]
                }),
            )
        })
        .collect();
    let path = dir.join("fake-cloud.json");
    std::fs::write(
        &path,
        serde_json::to_vec(&serde_json::json!({ "instances": instances }))?,
    )?;
    Ok(path)
}
