//! The AWS cloud-config corpus (`tests/testdata/aws-cloud-config/`): real-world shaped files
//! from the 1.20 in-tree provider, kops, kubeadm, EKS-style private clusters and the newest
//! provider. Each one parses, and `cloud-controller-manager-aws` starts with it against moto
//! and initialises a Node; warnings name what was ignored, nothing stops the start.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use k8s_legacy_cloud_provider_aws::config::{AwsService, CloudConfig, IpFamily};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    imds::{ImdsStub, SelfInstance},
    k8s::{initialised, tainted_node, wait_for},
    moto::{REGION, World, ZONES},
};

const T: Duration = Duration::from_secs(60);

fn corpus_dir() -> PathBuf {
    rcp_e2e::paths::workspace_root().join("tests/testdata/aws-cloud-config")
}

/// The corpus files, sorted.
fn corpus() -> Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(corpus_dir())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "conf") {
            let name = path
                .file_name()
                .context("file name")?
                .to_string_lossy()
                .to_string();
            files.push((name, std::fs::read_to_string(&path)?));
        }
    }
    files.sort();
    Ok(files)
}

struct Ids<'a> {
    moto_url: &'a str,
    vpc: &'a str,
    subnet: &'a str,
    route_table: &'a str,
    node_sg: &'a str,
    cluster: &'a str,
}

fn render(template: &str, ids: &Ids<'_>) -> String {
    template
        .replace("@MOTO_URL@", ids.moto_url)
        .replace("@ZONE@", ZONES[0])
        .replace("@VPC@", ids.vpc)
        .replace("@SUBNET@", ids.subnet)
        .replace("@ROUTE_TABLE@", ids.route_table)
        .replace("@NODE_SG@", ids.node_sg)
        .replace("@CLUSTER@", ids.cluster)
}

/// What each file must parse to: (file, cluster ID, region from the file, families, the ids of
/// the unused overrides, the override id EC2 goes to).
type Expectation = (
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    &'static [IpFamily],
    &'static [&'static str],
    Option<&'static str>,
);

const EXPECTED: &[Expectation] = &[
    (
        "both-spellings.conf",
        Some("c1"),
        Some("us-east-1"),
        &[IpFamily::Ipv4],
        &["asg-v1", "asg-v2"],
        Some("ec2-v2"),
    ),
    (
        "eks-private-endpoints.conf",
        Some("c1"),
        Some("us-east-1"),
        &[IpFamily::Ipv4],
        &["autoscaling", "ecr-api", "s3", "kms"],
        Some("ec2"),
    ),
    (
        "in-tree-1.20.conf",
        Some("c1"),
        Some("us-east-1"),
        &[IpFamily::Ipv4],
        &["3", "4"],
        Some("1"),
    ),
    (
        "kops.conf",
        None,
        None,
        &[IpFamily::Ipv4, IpFamily::Ipv6],
        &[],
        None,
    ),
    (
        "kubeadm.conf",
        Some("c1"),
        Some("us-east-1"),
        &[IpFamily::Ipv4],
        &[],
        Some("ec2"),
    ),
    (
        "newest-all-keys.conf",
        Some("c1"),
        Some("us-east-1"),
        &[IpFamily::Ipv4],
        &["KMS"],
        Some("EC2"),
    ),
];

#[test]
fn every_corpus_file_parses_as_written_with_crlf_and_with_a_bom() -> Result<()> {
    let ids = Ids {
        moto_url: "http://127.0.0.1:5000",
        vpc: "vpc-0123456789abcdef0",
        subnet: "subnet-0123456789abcdef0",
        route_table: "rtb-0123456789abcdef0",
        node_sg: "sg-0123456789abcdef0",
        cluster: "c1",
    };
    let files = corpus()?;
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let expected_names: Vec<&str> = EXPECTED.iter().map(|e| e.0).collect();
    assert_eq!(names, expected_names, "every corpus file has an expectation");
    for ((name, template), (_, cluster, region, families, unused, ec2)) in files.iter().zip(EXPECTED) {
        let text = render(template, &ids);
        let config =
            CloudConfig::parse(Some(text.as_bytes())).with_context(|| format!("{name} must parse"))?;
        assert_eq!(config.cluster_id(), *cluster, "{name}: cluster ID");
        assert_eq!(config.configured_region().as_deref(), *region, "{name}: region");
        assert_eq!(config.node_ip_families, *families, "{name}: NodeIPFamilies");
        let unused_ids: Vec<&str> = config.unused_overrides().iter().map(|o| o.id.as_str()).collect();
        assert_eq!(unused_ids, *unused, "{name}: unused overrides");
        assert_eq!(
            config
                .override_for(AwsService::Ec2, REGION)
                .map(|o| o.id.as_str()),
            *ec2,
            "{name}: the EC2 override"
        );
        // The same file saved on Windows (CRLF, byte-order mark) reads the same.
        let windows = format!("\u{feff}{}", text.replace('\n', "\r\n"));
        assert_eq!(
            CloudConfig::parse(Some(windows.as_bytes()))
                .with_context(|| format!("{name} with CRLF + BOM"))?,
            config,
            "{name}: CRLF + BOM"
        );
    }
    Ok(())
}

/// The log lines the CCM must print for each file (what it ignored, and why).
fn expected_log(name: &str) -> &'static [&'static str] {
    match name {
        "both-spellings.conf" => &[
            "two [ServiceOverride] sections override Ec2",
            "two [ServiceOverride] sections override Elb",
            "the override is kept and unused",
        ],
        "eks-private-endpoints.conf" => &["the override is kept and unused"],
        "in-tree-1.20.conf" => &[
            "DisableStrictZoneCheck was removed upstream and is ignored",
            "the override is kept and unused",
        ],
        "kops.conf" => &["NodeIPFamilies lists this family twice"],
        "newest-all-keys.conf" => &[
            "ignoring unknown key in [Global]",
            "ignoring unknown section",
            "the override is kept and unused",
        ],
        _ => &[],
    }
}

#[tokio::test]
async fn the_ccm_starts_with_every_corpus_file_against_moto() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world: World = moto.build_world("corpus", 2).await?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    // The kops file names neither the region nor the cluster: the CCM asks the instance
    // metadata (this stub, as the first instance) and reads the cluster from its tags.
    let imds = ImdsStub::start(SelfInstance::of(&world, &world.instances[0])).await?;
    let moto_url = moto.endpoint().to_string();
    let ids = Ids {
        moto_url: &moto_url,
        vpc: &world.vpc_id,
        subnet: &world.subnets[0].1,
        route_table: &world.route_table_id,
        node_sg: &world.security_group_id,
        cluster: &world.cluster_id,
    };
    let imds_url = imds.url();
    let mut env = moto.sdk_env();
    // Files without a [ServiceOverride] use the SDK's own endpoint settings.
    env.push(("AWS_ENDPOINT_URL", moto_url.as_str()));
    env.push(("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds_url.as_str()));

    for (i, (name, template)) in corpus()?.iter().enumerate() {
        let config = cluster.dir().join(name);
        std::fs::write(&config, render(template, &ids))?;
        let ccm_name = format!("ccm-{}", name.trim_end_matches(".conf"));
        let mut ccm = CcmProcess::start_with_env(
            "cloud-controller-manager-aws",
            &ccm_name,
            &cluster.ccm_kubeconfig("aws/base")?,
            cluster.dir(),
            &[
                format!("--cloud-config={}", config.display()),
                "--leader-elect=false".to_string(),
            ],
            &env,
        )?;
        let instance = &world.instances[i % world.instances.len()];
        let node_name = instance.private_dns_name.clone();
        nodes
            .create(&PostParams::default(), &tainted_node(&node_name))
            .await?;
        let node = wait_for(&format!("{name}: {node_name} initialised"), T, || {
            initialised(&nodes, &node_name)
        })
        .await?;
        assert_eq!(
            node.spec.and_then(|s| s.provider_id).as_deref(),
            Some(format!("aws:///{}/{}", instance.zone, instance.id).as_str()),
            "{name}"
        );
        ccm.check_running()?;
        let log = ccm.log();
        for line in expected_log(name) {
            assert!(log.contains(line), "{name}: the CCM log says {line:?}:\n{log}");
        }
        assert!(!log.contains(" ERROR "), "{name}: no error in the log:\n{log}");
        drop(ccm);
        nodes.delete(&node_name, &DeleteParams::default()).await?;
        wait_for(&format!("{node_name} deleted"), T, || async {
            nodes.get_opt(&node_name).await.ok()?.is_none().then_some(())
        })
        .await?;
    }
    let asked = imds.requests();
    for path in [
        "/latest/api/token",
        "/latest/dynamic/instance-identity/document",
        "/latest/meta-data/instance-id",
    ] {
        assert!(
            asked.contains_key(path),
            "the kops file's start asked IMDS for {path}: {asked:?}"
        );
    }
    Ok(())
}
