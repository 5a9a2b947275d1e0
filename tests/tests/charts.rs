//! The Helm charts under `charts/`: rendered from the kustomize bases (`hack/render-charts.sh
//! --check` fails when a chart drifted from `deploy/`), `helm lint` clean, and what
//! `helm template` renders — with the defaults and with every option set — is accepted by a
//! real API server (`--dry-run=server`) and is the base's objects with the values applied.
//! `tests/tests/real_cluster.rs` installs, upgrades and uninstalls them on real kubelets.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use rcp_e2e::{TestCluster, paths};
use serde_json::{Value, json};

const PROVIDERS: [&str; 3] = ["aws", "vsphere", "openstack"];

fn chart(provider: &str) -> String {
    paths::workspace_root()
        .join("charts")
        .join(format!("{provider}-cloud-controller-manager"))
        .display()
        .to_string()
}

/// `helm <args>` with its home directories under `dir` (no cluster).
fn helm(dir: &std::path::Path, args: &[&str]) -> Result<String> {
    rcp_e2e::cluster::helm(dir, None, args)
}

/// `helm template` of the provider's chart with `values` (written as a values file).
fn template(dir: &std::path::Path, provider: &str, values: &Value) -> Result<String> {
    let file = dir.join(format!("{provider}-values.yaml"));
    std::fs::write(&file, serde_json::to_string_pretty(values)?)?;
    helm(
        dir,
        &[
            "template",
            "ccm",
            &chart(provider),
            "--namespace",
            "kube-system",
            "--values",
            &file.display().to_string(),
        ],
    )
}

/// The objects of a multi-document YAML stream, as JSON.
fn objects(yaml: &str) -> Result<Vec<Value>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml)?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

fn kind_and_name(o: &Value) -> String {
    format!(
        "{}/{}",
        o["kind"].as_str().unwrap_or_default(),
        o["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// The values a chart needs at the least (the config object it makes).
fn minimal(provider: &str) -> Value {
    match provider {
        "aws" => json!({}),
        _ => json!({"cloudConfig": {"contents": "[Global]\n"}}),
    }
}

#[test]
fn the_charts_are_rendered_from_the_kustomize_bases_and_lint_clean() -> Result<()> {
    let out = std::process::Command::new("bash")
        .arg(paths::workspace_root().join("hack/render-charts.sh"))
        .arg("--check")
        .env(
            "PATH",
            format!(
                "{}:{}",
                paths::test_bin_dir().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()?;
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir()?;
    let version = env!("CARGO_PKG_VERSION");
    for provider in PROVIDERS {
        let set = match provider {
            "aws" => vec![],
            _ => vec!["--set", "cloudConfig.contents=[Global]"],
        };
        let mut args = vec!["lint", "--strict"];
        let path = chart(provider);
        args.push(&path);
        args.extend(set);
        let lint = helm(dir.path(), &args)?;
        assert!(lint.contains("0 chart(s) failed"), "{provider}: {lint}");
        // The chart's version is the crates' (hack/release.sh bump changes both).
        let meta = std::fs::read_to_string(format!("{path}/Chart.yaml"))?;
        assert!(
            meta.contains(&format!("\nversion: {version}\n")),
            "{provider}: {meta}"
        );
        assert!(
            meta.contains(&format!("\nappVersion: \"{version}\"\n")),
            "{provider}: {meta}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn every_chart_renders_the_base_objects_and_the_api_server_accepts_them() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let dir = tempfile::tempdir()?;
    for provider in PROVIDERS {
        // The defaults: the base's objects, labelled, nothing else but the config object.
        let base = objects(
            &cluster.kubectl(&[
                "kustomize",
                &paths::workspace_root()
                    .join("deploy")
                    .join(provider)
                    .join("base")
                    .display()
                    .to_string(),
            ])?,
        )?;
        let rendered = objects(&template(dir.path(), provider, &minimal(provider))?)?;
        let names = |objs: &[Value]| objs.iter().map(kind_and_name).collect::<BTreeSet<_>>();
        let extra: BTreeSet<String> = names(&rendered).difference(&names(&base)).cloned().collect();
        let expected_extra: BTreeSet<String> = match provider {
            "aws" => BTreeSet::new(),
            "vsphere" => BTreeSet::from(["ConfigMap/vsphere-cloud-config".to_string()]),
            _ => BTreeSet::from(["Secret/cloud-config".to_string()]),
        };
        assert_eq!(extra, expected_extra, "{provider}");
        assert!(names(&base).is_subset(&names(&rendered)), "{provider}");
        for b in &base {
            let r = rendered
                .iter()
                .find(|r| kind_and_name(r) == kind_and_name(b))
                .context("rendered")?;
            assert_eq!(r["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm");
            match b["kind"].as_str() {
                // The DaemonSet: the image is the chart's, the Pod template carries the release
                // label and the config's checksum; everything else is the base's.
                Some("DaemonSet") => {
                    let (mut b, mut r) = (b.clone(), r.clone());
                    for o in [&mut b, &mut r] {
                        o["metadata"]["labels"] = Value::Null;
                        o["spec"]["template"]["metadata"] = Value::Null;
                        o["spec"]["template"]["spec"]["containers"][0]["image"] = Value::Null;
                        o["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = Value::Null;
                    }
                    assert_eq!(b, r, "{provider}: the chart's DaemonSet is the base's");
                }
                _ => {
                    let (mut b, mut r) = (b.clone(), r.clone());
                    b["metadata"]["labels"] = Value::Null;
                    r["metadata"]["labels"] = Value::Null;
                    assert_eq!(b, r, "{provider}: {}", kind_and_name(&b));
                }
            }
        }
        let ds = rendered
            .iter()
            .find(|o| o["kind"] == "DaemonSet")
            .context("DaemonSet")?;
        assert_eq!(
            ds["spec"]["template"]["spec"]["containers"][0]["image"],
            format!(
                "rust-cloud-provider/cloud-controller-manager-{provider}:{}",
                env!("CARGO_PKG_VERSION")
            )
        );

        // Every option at once.
        let mut values = minimal(provider);
        let all = json!({
            "image": {"repository": "registry.example.com/ccm", "digest": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
            "imagePullSecrets": [{"name": "pull"}],
            "args": ["--cluster-name=prod", "--v=4"],
            "useServiceAccountCredentials": true,
            "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "priorityClassName": "system-cluster-critical",
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
            "podAnnotations": {"example.com/team": "platform"},
            "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/ccm"}},
            "extraVolumes": [{"name": "ca", "hostPath": {"path": "/etc/pki", "type": "Directory"}}],
            "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/pki", "readOnly": true}],
            "serviceMonitor": {"enabled": true},
            "podMonitor": {"enabled": true, "tokenSecret": {"name": "prometheus-token"}},
        });
        for (k, v) in all.as_object().context("object")? {
            values[k] = v.clone();
        }
        if provider == "aws" {
            values["cloudConfig"] = json!({"contents": "[Global]\nKubernetesClusterID = prod\n"});
        }
        let rendered = objects(&template(dir.path(), provider, &values)?)?;
        let kinds: Vec<&str> = rendered.iter().filter_map(|o| o["kind"].as_str()).collect();
        for kind in ["ServiceMonitor", "PodMonitor", "Service"] {
            assert!(kinds.contains(&kind), "{provider}: {kinds:?}");
        }
        let ds = rendered
            .iter()
            .find(|o| o["kind"] == "DaemonSet")
            .context("DaemonSet")?;
        let pod = &ds["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(
            c["image"],
            "registry.example.com/ccm@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        );
        let args: Vec<&str> = c["args"]
            .as_array()
            .context("args")?
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert_eq!(
            args.last(),
            Some(&"--v=4"),
            "{provider}: the user's flags come last: {args:?}"
        );
        assert!(
            args.contains(&"--use-service-account-credentials=true"),
            "{args:?}"
        );
        assert!(
            args.iter().any(|a| a.starts_with("--cloud-config=")),
            "{provider}: {args:?}"
        );
        assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
        assert_eq!(pod["priorityClassName"], "system-cluster-critical");
        assert_eq!(c["resources"]["requests"]["cpu"], "50m");
        assert!(
            pod["tolerations"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["key"] == "dedicated")
                    && t.iter().any(|t| t["key"] == "CriticalAddonsOnly"))
        );
        assert!(
            c["volumeMounts"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["mountPath"] == "/etc/pki"))
        );
        let sa = rendered
            .iter()
            .find(|o| o["kind"] == "ServiceAccount")
            .context("ServiceAccount")?;
        assert_eq!(
            sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
            "arn:aws:iam::1:role/ccm"
        );
        assert!(rendered.iter().any(|o| o["kind"] == "Role"
            && o["metadata"]["name"] == "cloud-controller-manager:service-account-credentials"));

        // The API server takes all of it (the Prometheus Operator's kinds aside: no CRDs here).
        let core: Vec<Value> = rendered
            .into_iter()
            .filter(|o| o["apiVersion"] != "monitoring.coreos.com/v1")
            .collect();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": core});
        let answer = cluster
            .kubectl_stdin(
                &["apply", "--dry-run=server", "-o", "name", "-f", "-"],
                &list.to_string(),
            )
            .with_context(|| format!("kubectl apply --dry-run=server of the {provider} chart"))?;
        println!("{provider} chart, every option: accepted:\n{answer}");
    }

    // A chart that needs its config says so.
    let err = template(dir.path(), "openstack", &json!({}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cloudConfig.contents"), "{err}");
    Ok(())
}
