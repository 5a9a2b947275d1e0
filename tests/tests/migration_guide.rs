//! Runs every `sh` block of docs/migration.md, in order, against a real kube-apiserver with a
//! migration-enabled CCM running, so the guide's commands are known to work.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Result, bail};
use rcp_e2e::{TestCluster, ccm::CcmProcess, k8s::wait_for, paths};

fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap_or_default()),
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[tokio::test]
async fn every_command_of_the_migration_guide_works() -> Result<()> {
    let guide = std::fs::read_to_string(paths::workspace_root().join("docs/migration.md"))?;
    let blocks = sh_blocks(&guide);
    assert!(
        blocks.len() >= 10,
        "the guide has its command blocks ({})",
        blocks.len()
    );

    let cluster = TestCluster::start().await?;
    let work = cluster.dir().join("guide");
    std::fs::create_dir_all(&work)?;
    std::fs::copy(
        paths::workspace_root().join("staging/legacy-cloud-providers/vsphere/testdata/in-tree.conf"),
        work.join("vsphere.conf"),
    )?;
    let vsphere_bin = paths::workspace_binary("cloud-controller-manager-vsphere")?;
    let cloud = cluster.dir().join("fake.json");
    std::fs::write(&cloud, "{}")?;
    let ccm = CcmProcess::start(
        "fake-cloud-controller-manager",
        "ccm",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &[
            format!("--cloud-config={}", cloud.display()),
            "--cluster-cidr=10.244.0.0/16".into(),
            "--enable-leader-migration".into(),
        ],
    )?;
    wait_for("the CCM holds both leases", Duration::from_secs(30), || async {
        (ccm.is_leader("cloud-controller-manager").await.ok()?
            && ccm.is_leader("cloud-provider-extraction-migration").await.ok()?)
        .then_some(())
    })
    .await?;

    let kubectl_dir = std::fs::canonicalize(paths::test_bin("kubectl")?)?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let bin_dir = vsphere_bin.parent().map(Path::to_path_buf).unwrap_or_default();
    let path = format!(
        "{}:{}:{}",
        bin_dir.display(),
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (i, block) in blocks.iter().enumerate() {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", block])
            .env("KUBECONFIG", cluster.kubeconfig_path())
            .env("WORKDIR", &work)
            .env("PATH", &path)
            .output()?;
        println!(
            "--- block {} ---\n{block}--- output ---\n{}{}",
            i + 1,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            bail!(
                "block {} of docs/migration.md failed ({}):\n{block}\n{}",
                i + 1,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // The guide's outputs are what a user would check.
    let yaml = std::fs::read_to_string(work.join("vsphere.yaml"))?;
    assert!(
        yaml.contains("\"10.0.0.10\":") && yaml.contains("[Workspace] folder"),
        "{yaml}"
    );
    assert!(
        std::fs::read_to_string(work.join("leader-migration.yaml"))?
            .contains("leaderName: cloud-provider-extraction-migration")
    );
    Ok(())
}
