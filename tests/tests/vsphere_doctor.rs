//! `cloud-controller-manager-vsphere doctor` on the real binary, kube-apiserver and vcsim
//! (behind the fault proxy): on a good world every check passes (exit 0); a wrong password, a
//! Node whose VM does not exist, an RBAC rule removed from the CCM's ClusterRole and an account
//! without the read privileges on the datacenter (vcsim grants everything, so the proxy answers
//! that question) are each named on their own line, the exit code is their number, and the
//! password never appears in the output.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use rcp_e2e::{
    TestCluster, Vcsim,
    fault_proxy::{Action, FaultProxy, Rule},
    k8s::{node_with_provider_id, tainted_node},
    paths,
    vcsim::small_model,
};

/// Runs `cloud-controller-manager-vsphere doctor <args>`: `(exit code, stdout + stderr)`.
async fn doctor(args: &[String]) -> Result<(i32, String)> {
    let out = tokio::process::Command::new(paths::workspace_binary("cloud-controller-manager-vsphere")?)
        .arg("doctor")
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .await?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    Ok((out.status.code().unwrap_or(-1), text))
}

fn failed(out: &str) -> Vec<String> {
    let mut f: Vec<String> = out
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == "FAIL"))
        .map(|l| l.split("  FAIL").next().unwrap_or_default().trim().to_string())
        .collect();
    f.sort();
    f
}

#[tokio::test]
async fn doctor_passes_on_a_good_world_and_names_each_problem() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let vcsim = Vcsim::start_with(small_model(2))?;
    vcsim.identify(2)?;
    let (cert, key) = vcsim.tls_files();
    let proxy = FaultProxy::start_tls(&format!("https://{}", vcsim.host_port()), &cert, &key).await?;
    let config = cluster.dir().join("vsphere.yaml");
    std::fs::write(&config, vcsim.cloud_config_yaml(proxy.port(), "")?)?;
    let kubeconfig = cluster.ccm_kubeconfig("vsphere/base")?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    // node-0 is initialised (providerID), node-1 waits for the cloud-node controller.
    let uuid = vcsim.vm_uuid(&rcp_e2e::vcsim::vm_name(0))?;
    nodes
        .create(
            &PostParams::default(),
            &node_with_provider_id("node-0", &format!("vsphere://{uuid}")),
        )
        .await?;
    nodes
        .create(&PostParams::default(), &tainted_node("node-1"))
        .await?;
    let args = vec![
        format!("--cloud-config={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
    ];

    // A good world: no failure.
    let (code, out) = doctor(&args).await?;
    assert_eq!(failed(&out), Vec::<String>::new(), "{out}");
    assert_eq!(code, 0, "{out}");
    for line in [
        "cloud config",
        "vcenter sim: login",
        "vcenter sim: datacenters",
        "vcenter sim: privileges",
        "node node-0",
        "node node-1",
        "rbac: patch nodes",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line) && l.contains(" ok ")),
            "{line} passes:\n{out}"
        );
    }
    let datacenter = out
        .lines()
        .find(|l| l.starts_with("vcenter sim: datacenters"))
        .and_then(|l| l.rsplit(": ").next())
        .map(|d| d.trim().to_string())
        .unwrap_or_default();
    assert!(datacenter.starts_with("datacenter-"), "{out}");

    // A wrong password: named, and never printed.
    let wrong = "rcp-doctor-wrong-password-4471";
    let bad = cluster.dir().join("vsphere-bad.yaml");
    std::fs::write(
        &bad,
        vcsim.cloud_config_yaml(proxy.port(), "")?.replace(
            &serde_json::to_string(vcsim.password())?,
            &serde_json::to_string(wrong)?,
        ),
    )?;
    let (code, out) = doctor(&[
        format!("--cloud-config={}", bad.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
    ])
    .await?;
    assert_eq!(failed(&out), ["vcenter sim: login"], "{out}");
    assert_eq!(code, 1, "{out}");
    assert!(!out.contains(wrong) && !out.contains(vcsim.password()), "{out}");

    // Three problems at once: a Node whose VM does not exist, an RBAC rule removed, and an
    // account without System.Read on the datacenter.
    nodes
        .create(
            &PostParams::default(),
            &node_with_provider_id("ghost", "vsphere://42000000-0000-0000-0000-000000000000"),
        )
        .await?;
    cluster.remove_cluster_role_rule("system:cloud-controller-manager", "services/status")?;
    proxy.add(Rule::new(
        &["FetchUserPrivilegeOnEntities"],
        Action::Respond {
            status: 200,
            body: format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\"><soapenv:Body><FetchUserPrivilegeOnEntitiesResponse xmlns=\"urn:vim25\"><returnval><entity type=\"Datacenter\">{datacenter}</entity><privileges>System.Anonymous</privileges><privileges>System.View</privileges></returnval></FetchUserPrivilegeOnEntitiesResponse></soapenv:Body></soapenv:Envelope>"
            ),
        },
    ));
    // RBAC changes take a moment to reach the authorizer.
    let expected = [
        "node ghost".to_string(),
        "rbac: patch services/status".to_string(),
        "vcenter sim: privileges".to_string(),
    ];
    let mut last = String::new();
    for _ in 0..20 {
        let (code, out) = doctor(&args).await?;
        if failed(&out) == expected {
            assert_eq!(code, 3, "{out}");
            assert!(out.contains(&format!("System.Read on {datacenter}")), "{out}");
            return Ok(());
        }
        last = out;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("the three problems were not reported:\n{last}")
}
