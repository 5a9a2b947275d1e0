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
            } else if path.file_name().is_some_and(|n| n == "kustomization.yaml")
                // A component (common/service-account-credentials) is built only inside the
                // overlays that include it.
                && !std::fs::read_to_string(&path)?.contains("\nkind: Component")
            {
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
            "CriticalAddonsOnly",
        ] {
            assert!(tolerated.contains(&key), "deploy/{name} tolerates {key}");
        }
        // Control-plane Nodes whatever the label's value (kubeadm "", k3s and RKE2 "true").
        let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert!(
            terms.as_array().is_some_and(|t| t.iter().any(|t| {
                t["matchExpressions"][0]["key"] == "node-role.kubernetes.io/control-plane"
                    && t["matchExpressions"][0]["operator"] == "Exists"
            })),
            "deploy/{name}: {terms}"
        );
        assert!(
            pod["nodeSelector"].is_null(),
            "deploy/{name}: {}",
            pod["nodeSelector"]
        );
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
        // The overlays with the service-account-credentials component: the flag and the right
        // to mint the controllers' tokens come together.
        let own_tokens = args.contains(&"--use-service-account-credentials=true");
        let mints = items.iter().any(|i| {
            i["kind"] == "Role"
                && i["rules"]
                    .as_array()
                    .is_some_and(|rules| rules.iter().any(|r| r["resources"][0] == "serviceaccounts/token"))
        });
        assert_eq!(own_tokens, mints, "deploy/{name}: {args:?}");
        // OpenStack: the host's CA directories, read-only at the same paths, as OCCM mounts
        // them (a migrated `ca-file=/etc/kubernetes/pki/…` works unchanged).
        if name.starts_with("openstack") {
            for path in ["/etc/kubernetes/pki", "/etc/ssl/certs"] {
                let mount = c["volumeMounts"]
                    .as_array()
                    .and_then(|m| m.iter().find(|m| m["mountPath"] == path))
                    .with_context(|| format!("deploy/{name} mounts {path}"))?;
                assert_eq!(mount["readOnly"], true, "deploy/{name}: {mount}");
                let volume = pod["volumes"]
                    .as_array()
                    .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
                    .with_context(|| format!("deploy/{name}: the volume of {path}"))?;
                assert_eq!(volume["hostPath"]["path"], path, "deploy/{name}: {volume}");
            }
        }
        if [
            "aws/overlays/example",
            "aws/overlays/local",
            "vsphere/overlays/local",
        ]
        .contains(&name.as_str())
        {
            assert!(own_tokens, "deploy/{name}: {args:?}");
        }
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

/// Every AWS API call in the AWS provider's sources (`<client>.<operation>()` with `client`
/// one of `ec2`, `elb`, `elbv2`, `ecr`, `sts`, across line breaks), as the IAM action it needs.
/// STS calls need none of the caller's own: `GetCallerIdentity` is always allowed,
/// `AssumeRoleWithWebIdentity` and `AssumeRole` are granted by the assumed role's trust policy
/// (docs/prerequisites.md says so for `[Global] RoleARN`).
fn aws_actions_in_code() -> Result<std::collections::BTreeSet<String>> {
    let call = regex::Regex::new(r"\b(ec2|elb|elbv2|ecr|sts)\b(?:\(\))?\s*\.\s*([a-z_]+)\(\)")?;
    let root = paths::workspace_root();
    let mut actions = std::collections::BTreeSet::new();
    let mut stack = vec![
        root.join("staging/legacy-cloud-providers/aws/src"),
        root.join("providers/aws/src"),
        root.join("cmd/ecr-credential-provider/src"),
    ];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            for c in call.captures_iter(&text) {
                let operation: String = c[2].split('_').map(|w| w[..1].to_uppercase() + &w[1..]).collect();
                let service = match &c[1] {
                    "ec2" => "ec2",
                    "elb" | "elbv2" => "elasticloadbalancing",
                    "ecr" => "ecr",
                    _ => continue,
                };
                if operation == "Clone" {
                    continue;
                }
                actions.insert(format!("{service}:{operation}"));
            }
        }
    }
    Ok(actions)
}

fn policy_actions(file: &str) -> Result<std::collections::BTreeSet<String>> {
    let path = paths::workspace_root().join("deploy/aws/iam").join(file);
    let policy: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut actions = std::collections::BTreeSet::new();
    for statement in policy["Statement"].as_array().context("Statement")? {
        for a in statement["Action"].as_array().context("Action")? {
            actions.insert(a.as_str().context("an action")?.to_string());
        }
    }
    Ok(actions)
}

/// The IAM policies shipped in `deploy/aws/iam/` allow exactly the AWS calls the code makes:
/// the CCM's every EC2 and Elastic Load Balancing call (plus the service-linked role ELB needs
/// once per account), the credential provider's ECR call. A call added to the code without
/// its permission, or a permission the code no longer needs, fails here.
#[test]
fn the_aws_iam_policies_allow_exactly_the_calls_the_code_makes() -> Result<()> {
    let code = aws_actions_in_code()?;
    assert!(code.len() > 40, "{code:?}");
    let (node, ccm): (
        std::collections::BTreeSet<String>,
        std::collections::BTreeSet<String>,
    ) = code.into_iter().partition(|a| a.starts_with("ecr:"));
    let mut shipped = policy_actions("cloud-controller-manager-policy.json")?;
    assert!(
        shipped.remove("iam:CreateServiceLinkedRole"),
        "the ELB service-linked role"
    );
    let missing: Vec<_> = ccm.difference(&shipped).collect();
    let unneeded: Vec<_> = shipped.difference(&ccm).collect();
    assert!(
        missing.is_empty() && unneeded.is_empty(),
        "cloud-controller-manager-policy.json lacks {missing:?} and allows {unneeded:?} that no code calls"
    );
    assert_eq!(policy_actions("ecr-credential-provider-policy.json")?, node);
    Ok(())
}
