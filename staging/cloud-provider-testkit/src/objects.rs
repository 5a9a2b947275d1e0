//! Objects as a cluster has them when the cloud controllers meet them.

use k8s_cloud_provider::well_known::TAINT_UNINITIALIZED;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Service, ServicePort, ServiceSpec, Taint};
use kube::api::ObjectMeta;

/// A Node as a kubelet with `--cloud-provider=external` registers it: no provider ID, the
/// `node.cloudprovider.kubernetes.io/uninitialized` taint the cloud-node controller removes
/// once it has initialised the Node from the cloud.
pub fn node(name: &str) -> Node {
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
        ..Default::default()
    }
}

/// A `type: LoadBalancer` Service `default/<name>` with one TCP port per entry of `ports`.
pub fn load_balancer_service(name: &str, ports: &[i32]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            selector: Some([("app".to_string(), name.to_string())].into()),
            ports: Some(
                ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(format!("port-{p}")),
                        port: *p,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The first `status.loadBalancer.ingress[]` IP (or hostname) of a Service.
pub fn ingress(service: &Service) -> Option<String> {
    service
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .iter()
        .find_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_comes_tainted_and_a_service_with_its_ports() {
        let n = node("a");
        assert_eq!(
            n.spec.unwrap().taints.unwrap()[0].key,
            "node.cloudprovider.kubernetes.io/uninitialized"
        );
        let s = load_balancer_service("web", &[80, 443]);
        assert_eq!(s.spec.as_ref().unwrap().ports.as_ref().unwrap().len(), 2);
        assert_eq!(ingress(&s), None);
    }
}
