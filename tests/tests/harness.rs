//! Proof that the harness runs real servers: a real API server (kube client and kubectl, RBAC),
//! real moto (the AWS SDK), real vcsim (SOAP over HTTPS).

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use rcp_e2e::{Moto, TestCluster, Vcsim, cluster::client_from_kubeconfig};

#[tokio::test]
async fn node_round_trips_between_kube_client_and_kubectl() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);

    // Written by the kube client, read by kubectl.
    let node = Node {
        metadata: ObjectMeta {
            name: Some("node-from-kube".into()),
            labels: Some([("written-by".to_string(), "kube-rs".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes.create(&PostParams::default(), &node).await?;
    let json = cluster.kubectl(&["get", "node", "node-from-kube", "-o", "json"])?;
    let seen: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(seen["metadata"]["labels"]["written-by"], "kube-rs");
    assert!(seen["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()));

    // Written by kubectl, read by the kube client.
    cluster.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-from-kubectl\n  labels:\n    written-by: kubectl\n",
    )?;
    let read = nodes.get("node-from-kubectl").await?;
    assert_eq!(read.metadata.labels.unwrap()["written-by"], "kubectl");
    let names: Vec<String> = nodes
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(
        names.contains(&"node-from-kube".to_string()) && names.contains(&"node-from-kubectl".to_string())
    );
    Ok(())
}

#[tokio::test]
async fn rbac_applies_to_minted_users_and_service_accounts() -> Result<()> {
    let cluster = TestCluster::start().await?;

    // An impersonated user with no bindings is forbidden.
    let nobody = client_from_kubeconfig(&cluster.kubeconfig_for_user("nobody", &[])?).await?;
    let err = Api::<Node>::all(nobody)
        .list(&Default::default())
        .await
        .expect_err("nobody may not list nodes");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "expected 403, got {err}"
    );

    // A service account with a TokenRequest token is authenticated as itself…
    let sa_config = cluster
        .kubeconfig_for_service_account("default", "harness-reader")
        .await?;
    let sa = client_from_kubeconfig(&sa_config).await?;
    let err = Api::<Node>::all(sa.clone())
        .list(&Default::default())
        .await
        .expect_err("no binding yet");
    let kube::Error::Api(status) = &err else {
        panic!("expected an API error, got {err}")
    };
    assert_eq!(status.code, 403);
    assert!(
        status
            .message
            .contains("system:serviceaccount:default:harness-reader"),
        "403 names the service account: {}",
        status.message
    );
    // …and can list nodes once bound to a role that allows it.
    cluster.kubectl(&[
        "create",
        "clusterrole",
        "node-reader",
        "--verb=list,get",
        "--resource=nodes",
    ])?;
    cluster.kubectl(&[
        "create",
        "clusterrolebinding",
        "harness-reader-nodes",
        "--clusterrole=node-reader",
        "--serviceaccount=default:harness-reader",
    ])?;
    // RBAC caches refresh quickly but not instantly.
    let mut last = None;
    for _ in 0..50 {
        match Api::<Node>::all(sa.clone()).list(&Default::default()).await {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("service account still cannot list nodes: {last:?}");
}

#[tokio::test]
async fn moto_runs_instances_the_sdk_can_describe() -> Result<()> {
    let moto = Moto::start().await?;
    let world = moto.build_world("harness-test", 3).await?;
    assert_eq!(world.instances.len(), 3);

    let ec2 = moto.ec2();
    let out = ec2.describe_instances().send().await?;
    let mut seen: Vec<(String, String, String)> = out
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| {
            (
                i.instance_id().unwrap_or_default().to_string(),
                i.placement()
                    .and_then(|p| p.availability_zone())
                    .unwrap_or_default()
                    .to_string(),
                i.private_dns_name().unwrap_or_default().to_string(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let zones: std::collections::BTreeSet<_> = seen.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(
        zones.into_iter().collect::<Vec<_>>(),
        vec!["us-east-1a", "us-east-1b"]
    );
    for (id, _, dns) in &seen {
        assert!(id.starts_with("i-"), "{id}");
        assert!(dns.ends_with(".ec2.internal"), "{dns}");
    }
    // The world's route table carries the cluster tag.
    let rts = ec2
        .describe_route_tables()
        .route_table_ids(&world.route_table_id)
        .send()
        .await?;
    let tags: Vec<_> = rts.route_tables()[0]
        .tags()
        .iter()
        .filter_map(|t| t.key())
        .collect();
    assert!(tags.contains(&"kubernetes.io/cluster/harness-test"), "{tags:?}");
    Ok(())
}

fn envelope(body: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><soapenv:Envelope \
         xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
         xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"><soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>"
    )
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let i = s.find(start)? + start.len();
    let j = s[i..].find(end)? + i;
    Some(&s[i..j])
}

#[tokio::test]
async fn vcsim_soap_login_and_vm_listing() -> Result<()> {
    let vcsim = Vcsim::start()?;
    let http = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .cookie_store(true)
        .build()?;
    let call = |body: String| {
        let http = http.clone();
        let url = vcsim.sdk_url();
        async move {
            let resp = http
                .post(url)
                .header("Content-Type", "text/xml; charset=\"utf-8\"")
                .header("SOAPAction", "\"urn:vim25/6.5\"")
                .body(envelope(&body))
                .send()
                .await?;
            let status = resp.status();
            Ok::<_, anyhow::Error>((status, resp.text().await?))
        }
    };

    let (_, content) = call(
        "<RetrieveServiceContent xmlns=\"urn:vim25\"><_this type=\"ServiceInstance\">ServiceInstance</_this></RetrieveServiceContent>".into(),
    )
    .await?;
    let root = between(&content, "<rootFolder type=\"Folder\">", "<")
        .expect("rootFolder")
        .to_string();
    let session_manager = between(&content, "<sessionManager type=\"SessionManager\">", "<")
        .expect("sessionManager")
        .to_string();

    // A wrong password is refused with a SOAP fault.
    let (status, fault) = call(format!(
        "<Login xmlns=\"urn:vim25\"><_this type=\"SessionManager\">{session_manager}</_this><userName>{}</userName><password>wrong</password></Login>",
        vcsim.username()
    ))
    .await?;
    assert_eq!(status.as_u16(), 500);
    assert!(fault.contains("InvalidLogin"), "{fault}");

    let (status, login) = call(format!(
        "<Login xmlns=\"urn:vim25\"><_this type=\"SessionManager\">{session_manager}</_this><userName>{}</userName><password>{}</password></Login>",
        vcsim.username(),
        vcsim.password()
    ))
    .await?;
    assert!(status.is_success(), "{login}");
    assert!(login.contains(vcsim.username()), "{login}");

    let (_, view) = call(format!(
        "<CreateContainerView xmlns=\"urn:vim25\"><_this type=\"ViewManager\">ViewManager</_this><container type=\"Folder\">{root}</container><type>VirtualMachine</type><recursive>true</recursive></CreateContainerView>"
    ))
    .await?;
    let view_id = between(&view, "<returnval type=\"ContainerView\">", "<")
        .expect("view")
        .to_string();
    let (_, props) = call(format!(
        "<RetrievePropertiesEx xmlns=\"urn:vim25\"><_this type=\"PropertyCollector\">propertyCollector</_this><specSet>\
         <propSet><type>VirtualMachine</type><pathSet>name</pathSet></propSet>\
         <objectSet><obj type=\"ContainerView\">{view_id}</obj><skip>true</skip>\
         <selectSet xsi:type=\"TraversalSpec\"><type>ContainerView</type><path>view</path><skip>false</skip></selectSet></objectSet>\
         </specSet><options></options></RetrievePropertiesEx>"
    ))
    .await?;
    let vm_count = props.matches("<name>name</name>").count();
    // Default model: 1 cluster × 3 hosts × 2 VMs… vcsim puts -vm VMs per host-or-cluster
    // resource pool; with 1 cluster it creates 2 VMs.
    assert!(vm_count >= 2, "expected VMs, got:\n{props}");
    assert!(props.contains("DC0_C0_RP0_VM0"), "{props}");
    Ok(())
}
