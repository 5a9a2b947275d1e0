//! The manifests under `deploy/`: every base and overlay renders with kubectl's kustomize and
//! is accepted by a real API server (`--dry-run=server`: schema, admission, the
//! `system-node-critical` PriorityClass), and the DaemonSet keeps the properties a CCM
//! deployment needs.

use std::path::PathBuf;

use anyhow::{Context, Result};
use rcp_e2e::{TestCluster, paths};
use serde_json::Value;

/// Every kustomization directory under `deploy/`.
fn kustomizations() -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut stack = vec![paths::workspace_root().join("deploy")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
                found.push(dir.clone());
            }
        }
    }
    found.sort();
    Ok(found)
}

fn daemonset(items: &[Value]) -> Result<&Value> {
    items
        .iter()
        .find(|i| i["kind"] == "DaemonSet")
        .context("no DaemonSet rendered")
}

#[tokio::test]
async fn every_overlay_renders_and_the_api_server_accepts_it() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let dirs = kustomizations()?;
    let names: Vec<String> = dirs
        .iter()
        .map(|d| {
            d.strip_prefix(paths::workspace_root().join("deploy"))
                .unwrap_or(d)
                .display()
                .to_string()
        })
        .collect();
    for expected in [
        "aws/base",
        "aws/overlays/example",
        "aws/overlays/local",
        "vsphere/base",
        "vsphere/overlays/example",
        "openstack/base",
        "openstack/overlays/local",
        "common",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected} in {names:?}");
    }
    for (dir, name) in dirs.iter().zip(&names) {
        let rendered = cluster
            .kubectl(&["kustomize", &dir.display().to_string()])
            .with_context(|| format!("kubectl kustomize {name}"))?;
        let answer = cluster
            .kubectl_stdin(&["apply", "--dry-run=server", "-o", "json", "-f", "-"], &rendered)
            .with_context(|| format!("kubectl apply --dry-run=server for {name}"))?;
        let answer: Value = serde_json::from_str(&answer)?;
        let items = answer["items"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![answer.clone()]);
        let kinds: Vec<&str> = items.iter().filter_map(|i| i["kind"].as_str()).collect();
        println!("deploy/{name}: {} objects accepted: {kinds:?}", items.len());
        for kind in [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "DaemonSet",
        ] {
            assert!(kinds.contains(&kind), "deploy/{name} has a {kind}");
        }

        let ds = daemonset(&items)?;
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["priorityClassName"], "system-node-critical", "{name}");
        assert_eq!(pod["hostNetwork"], true, "{name}");
        assert_eq!(pod["serviceAccountName"], "cloud-controller-manager", "{name}");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        let tolerated: Vec<&str> = pod["tolerations"]
            .as_array()
            .context("tolerations")?
            .iter()
            .filter_map(|t| t["key"].as_str())
            .collect();
        for key in [
            "node.cloudprovider.kubernetes.io/uninitialized",
            "node-role.kubernetes.io/control-plane",
            "node.kubernetes.io/not-ready",
        ] {
            assert!(tolerated.contains(&key), "deploy/{name} tolerates {key}");
        }
        let c = &pod["containers"][0];
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        assert_eq!(c["livenessProbe"]["httpGet"]["scheme"], "HTTPS", "{name}");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{name}");
        assert!(c["resources"]["requests"]["cpu"].is_string(), "{name}");
        assert!(c["resources"]["requests"]["memory"].is_string(), "{name}");
        let args: Vec<&str> = c["args"]
            .as_array()
            .context("args")?
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert!(args.contains(&"--leader-elect=true"), "{name}: {args:?}");
        if let Some(provider) = ["aws", "vsphere", "openstack"]
            .into_iter()
            .find(|p| name.starts_with(p))
        {
            assert!(
                args.contains(&format!("--cloud-provider={provider}").as_str()),
                "{name}: {args:?}"
            );
            let image = c["image"].as_str().unwrap_or_default();
            assert!(
                image.contains(&format!("cloud-controller-manager-{provider}")),
                "{name}: {image}"
            );
        }
        if name.contains("overlays") {
            // The cloud-config comes from a generated ConfigMap mounted read-only.
            assert!(kinds.contains(&"ConfigMap"), "{name}");
            let config = args
                .iter()
                .find(|a| a.starts_with("--cloud-config="))
                .with_context(|| format!("{name}: --cloud-config in {args:?}"))?;
            let mount = c["volumeMounts"][0]["mountPath"].as_str().unwrap_or_default();
            assert!(config.contains(mount), "{name}: {config} under {mount}");
        }
    }
    Ok(())
}
