//! `cloud-controller-manager-openstack doctor` on the real binary, kube-apiserver and the real
//! OpenStack: on a good project every check passes (exit 0) and nothing is written; a Node
//! without a server, a floating network that is not external and a subnet that does not exist
//! are each named on their own line, and the exit code is their number.

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use rcp_e2e::{
    TestCluster,
    k8s::tainted_node,
    openstack::{BARBICAN, OpenStack, Project},
    paths,
};

/// Runs `cloud-controller-manager-openstack doctor <args>`: `(exit code, stdout)`.
async fn doctor(args: &[String]) -> Result<(i32, String)> {
    let out = tokio::process::Command::new(paths::workspace_binary("cloud-controller-manager-openstack")?)
        .arg("doctor")
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), stdout))
}

fn failed(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.split_whitespace().any(|w| w == "FAIL"))
        .map(|l| l.split("  FAIL").next().unwrap_or_default().trim().to_string())
        .collect()
}

fn writes(project: &Project) -> Vec<String> {
    [
        &project.nova_proxy,
        &project.neutron_proxy,
        &project.octavia_proxy,
    ]
    .iter()
    .flat_map(|p| p.counts_by_method().into_keys())
    .filter(|k| !k.starts_with("GET "))
    .collect()
}

#[tokio::test]
async fn doctor_passes_on_a_good_project_and_names_each_problem() -> Result<()> {
    let os = OpenStack::shared().await?;
    let cluster = TestCluster::start().await?;
    let project = os.project("doctor").await?;
    let private = project.network("private", "10.4.0.0/24").await?;
    let public = project.external_network("public", "172.27.4.0/24").await?;
    let router = project.router("edge", &public, &private).await?;
    project.server("node-0", &private).await?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    nodes
        .create(&PostParams::default(), &tainted_node("node-0"))
        .await?;
    let kubeconfig = cluster.ccm_kubeconfig("openstack/base")?;
    let run = |lb: String| {
        let path = cluster.dir().join("doctor.conf");
        let config = format!("{}{lb}[Route]\nrouter-id = {router}\n", project.global_section());
        std::fs::write(&path, config).map(|()| {
            vec![
                format!("--cloud-config={}", path.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
            ]
        })
    };

    // A good project: no failure, every part named, nothing written.
    let certificate = project.tls_secret("doctor.example").await?;
    let good = format!(
        "[LoadBalancer]\nsubnet-id = {}\nfloating-network-id = {}\ndefault-tls-container-ref = {certificate}\n",
        private.subnet_id, public.id
    );
    let (code, out) = doctor(&run(good)?).await?;
    assert_eq!(failed(&out), Vec::<String>::new(), "{out}");
    assert_eq!(code, 0, "{out}");
    for line in [
        "keystone",
        "nova",
        "neutron",
        "octavia",
        "[LoadBalancer] subnet-id",
        "[LoadBalancer] floating-network-id",
        "[LoadBalancer] default-tls-container-ref",
        "[Route] router-id",
        "quota: floating IPs",
        "node node-0",
        "rbac: patch services/status",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line) && l.contains(" ok ")),
            "{line} passes:\n{out}"
        );
    }
    assert_eq!(writes(&project), Vec::<String>::new(), "doctor writes nothing");

    // Four problems: each on its own line; the exit code is their number.
    nodes
        .create(&PostParams::default(), &tainted_node("no-such-server"))
        .await?;
    let bad = format!(
        "[LoadBalancer]\nsubnet-id = 00000000-0000-0000-0000-000000000000\nfloating-network-id = {}\ndefault-tls-container-ref = {BARBICAN}/secrets/00000000-0000-4000-8000-000000000000\n",
        private.id
    );
    let (code, out) = doctor(&run(bad)?).await?;
    let mut failures = failed(&out);
    failures.sort();
    assert_eq!(
        failures,
        [
            "[LoadBalancer] default-tls-container-ref",
            "[LoadBalancer] floating-network-id",
            "[LoadBalancer] subnet-id",
            "node no-such-server",
        ],
        "{out}"
    );
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("is not external"), "{out}");
    assert!(!out.contains(&project.password), "no secret in the output");
    Ok(())
}
