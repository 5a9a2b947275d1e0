//! `cloud-controller-manager-aws doctor` on the real binary, kube-apiserver and moto (behind the
//! fault proxy): on a good world every check passes (exit 0); refused credentials are named
//! (exit ≠ 0); a zone whose subnet lost the cluster tag, an RBAC rule removed from the CCM's
//! ClusterRole, a Node whose instance does not exist and a denied IAM action are each named on
//! their own line, and the exit code is their number.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use rcp_e2e::{
    Moto, TestCluster,
    fault_proxy::{Action, FaultProxy, Rule, aws_error_body},
    k8s::node_with_provider_id,
    moto::REGION,
    paths,
};

/// Runs `cloud-controller-manager-aws doctor <args>`: `(exit code, stdout)`. Asynchronously:
/// the fault proxy runs on this test's runtime.
async fn doctor(moto: &Moto, args: &[String]) -> Result<(i32, String)> {
    let out = tokio::process::Command::new(paths::workspace_binary("cloud-controller-manager-aws")?)
        .arg("doctor")
        .args(args)
        .envs(moto.sdk_env())
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

#[tokio::test]
async fn doctor_passes_on_a_good_world_and_names_each_problem() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("e2e", 2).await?;
    let proxy = FaultProxy::start(moto.endpoint()).await?;
    let url = format!("http://127.0.0.1:{}", proxy.port());
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(
        &config,
        format!(
            "{}\n[ServiceOverride \"sts\"]\nService = sts\nRegion = {REGION}\nURL = {url}\nSigningRegion = {REGION}\nSigningName = sts\n",
            moto.cloud_config(&world).replace(moto.endpoint(), &url)
        ),
    )?;
    let kubeconfig = cluster.ccm_kubeconfig("aws/base")?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in &world.instances {
        nodes.create(&PostParams::default(), &i.node()).await?;
    }
    let args = vec![
        format!("--cloud-config={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
    ];

    // A good world: no failure.
    let (code, out) = doctor(&moto, &args).await?;
    assert_eq!(failed(&out), Vec::<String>::new(), "{out}");
    assert_eq!(code, 0, "{out}");
    for line in [
        "credentials",
        "rbac: patch services/status",
        "iam: ec2:CreateSecurityGroup",
        "tags: subnets in",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line) && l.contains(" ok ")),
            "{line} passes:\n{out}"
        );
    }

    // Refused credentials.
    proxy.add(Rule::new(
        &["Action=GetCallerIdentity"],
        Action::Respond {
            status: 403,
            body: aws_error_body(
                "",
                "InvalidClientTokenId",
                "The security token included in the request is invalid.",
            ),
        },
    ));
    let (code, out) = doctor(&moto, &args).await?;
    assert_eq!(failed(&out), ["credentials"], "{out}");
    assert_eq!(code, 1);
    proxy.clear();

    // Four problems at once.
    let zone_b = &world.subnets[1];
    moto.ec2()
        .delete_tags()
        .resources(&zone_b.1)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("kubernetes.io/cluster/e2e")
                .build(),
        )
        .send()
        .await?;
    cluster.remove_cluster_role_rule("system:cloud-controller-manager", "services/status")?;
    nodes
        .create(
            &PostParams::default(),
            &node_with_provider_id("ghost", "aws:///us-east-1a/i-0123456789abcdef0"),
        )
        .await?;
    proxy.add(Rule::new(
        &["Action=CreateSecurityGroup"],
        Action::Respond {
            status: 403,
            body: aws_error_body(
                "Version=2016-11-15",
                "UnauthorizedOperation",
                "You are not authorized to perform this operation.",
            ),
        },
    ));
    // RBAC changes take a moment to reach the authorizer.
    let mut last = String::new();
    for _ in 0..20 {
        let (code, out) = doctor(&moto, &args).await?;
        let mut f = failed(&out);
        f.sort();
        let expected = [
            "iam: ec2:CreateSecurityGroup".to_string(),
            "node ghost".to_string(),
            "rbac: patch services/status".to_string(),
            format!("tags: subnets in {}", zone_b.0),
        ];
        if f == expected {
            assert_eq!(code, 4, "{out}");
            return Ok(());
        }
        last = out;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("the four problems were not reported:\n{last}")
}
