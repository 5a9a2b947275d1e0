//! Each rule, violated on purpose, must fail with its own message; the clean trees must pass.
//!
//! Synthetic workspaces mirror our layout with empty crates (path dependencies only, so
//! `cargo metadata --offline` needs no registry); a fake "AWS SDK" crate lives outside the
//! workspace. The cargo-deny tests plant edges into a copy of the real workspace.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use verify_boundaries::{Violation, Workspace};

struct Crate {
    dir: &'static str,
    name: &'static str,
    deps: Vec<(&'static str, &'static str, &'static str)>, // (name, dir, section)
}

fn clean_tree() -> Vec<Crate> {
    vec![
        Crate {
            dir: "staging/cloud-provider",
            name: "k8s-cloud-provider",
            deps: vec![],
        },
        Crate {
            dir: "staging/vsphere-api",
            name: "vsphere-api",
            deps: vec![],
        },
        Crate {
            dir: "staging/legacy-cloud-providers/aws",
            name: "k8s-legacy-cloud-provider-aws",
            deps: vec![
                ("k8s-cloud-provider", "staging/cloud-provider", "dependencies"),
                ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies"),
            ],
        },
        Crate {
            dir: "staging/legacy-cloud-providers/vsphere",
            name: "k8s-legacy-cloud-provider-vsphere",
            deps: vec![("k8s-cloud-provider", "staging/cloud-provider", "dependencies")],
        },
        Crate {
            dir: "providers/aws",
            name: "cloud-provider-aws",
            deps: vec![(
                "k8s-legacy-cloud-provider-aws",
                "staging/legacy-cloud-providers/aws",
                "dependencies",
            )],
        },
        Crate {
            dir: "providers/vsphere",
            name: "cloud-provider-vsphere",
            deps: vec![(
                "k8s-legacy-cloud-provider-vsphere",
                "staging/legacy-cloud-providers/vsphere",
                "dependencies",
            )],
        },
        Crate {
            dir: "cmd/cloud-controller-manager-aws",
            name: "cloud-controller-manager-aws",
            deps: vec![("cloud-provider-aws", "providers/aws", "dependencies")],
        },
        Crate {
            dir: "cmd/cloud-controller-manager-vsphere",
            name: "cloud-controller-manager-vsphere",
            deps: vec![("cloud-provider-vsphere", "providers/vsphere", "dependencies")],
        },
        Crate {
            dir: "tests",
            name: "e2e",
            deps: vec![
                ("cloud-provider-aws", "providers/aws", "dependencies"),
                ("cloud-provider-vsphere", "providers/vsphere", "dependencies"),
            ],
        },
    ]
}

const PHASES: &str = "aws = { phase = 2, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2 }\n";

fn write_tree(crates: &[Crate], phases: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let sdk = tmp.path().join("ext/aws-sdk-ec2");
    fs::create_dir_all(sdk.join("src")).unwrap();
    fs::write(
        sdk.join("Cargo.toml"),
        "[package]\nname = \"aws-sdk-ec2\"\nversion = \"1.0.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    fs::write(sdk.join("src/lib.rs"), "").unwrap();
    let members: Vec<String> = crates.iter().map(|c| format!("\"{}\"", c.dir)).collect();
    fs::create_dir_all(&ws).unwrap();
    fs::write(
        ws.join("Cargo.toml"),
        format!(
            "[workspace]\nresolver = \"2\"\nmembers = [{}]\n\n[workspace.metadata.providers]\n{phases}",
            members.join(", ")
        ),
    )
    .unwrap();
    for c in crates {
        let dir = ws.join(c.dir);
        fs::create_dir_all(dir.join("src")).unwrap();
        let mut manifest = format!(
            "[package]\nname = \"{}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
            c.name
        );
        for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let deps: Vec<_> = c.deps.iter().filter(|d| d.2 == section).collect();
            if deps.is_empty() {
                continue;
            }
            manifest.push_str(&format!("\n[{section}]\n"));
            for (name, target, _) in deps {
                let depth = c.dir.split('/').count();
                let rel = format!("{}{}", "../".repeat(depth), target);
                manifest.push_str(&format!("{name} = {{ path = \"{rel}\" }}\n"));
            }
        }
        fs::write(dir.join("Cargo.toml"), manifest).unwrap();
        // Every crate gets a lib target so that any planted edge resolves.
        fs::write(dir.join("src/lib.rs"), "").unwrap();
    }
    (tmp, ws.join("Cargo.toml"))
}

fn check(crates: &[Crate], phases: &str) -> Vec<Violation> {
    let (_tmp, manifest) = write_tree(crates, phases);
    Workspace::load(&manifest)
        .expect("cargo metadata of the synthetic workspace")
        .check()
}

fn with_dep(mut tree: Vec<Crate>, from: &str, dep: (&'static str, &'static str, &'static str)) -> Vec<Crate> {
    tree.iter_mut()
        .find(|c| c.name == from)
        .expect("crate")
        .deps
        .push(dep);
    tree
}

fn assert_single(violations: &[Violation], rule: &str, subject: &str, needle: &str) {
    assert!(
        violations
            .iter()
            .any(|v| v.rule == rule && v.subject == subject && v.to_string().contains(needle)),
        "expected a `{rule}` violation of {subject} mentioning {needle:?}, got:\n{}",
        violations
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    for v in violations {
        assert!(
            v.to_string().contains("fix: "),
            "every violation says how to fix it: {v}"
        );
    }
}

#[test]
fn clean_synthetic_tree_passes() {
    let v = check(&clean_tree(), PHASES);
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn staged_crate_depending_on_a_binary_fails() {
    // (A staged crate inside the binary's own closure would be a cycle, which cargo rejects.)
    let tree = with_dep(
        clean_tree(),
        "vsphere-api",
        (
            "cloud-controller-manager-aws",
            "cmd/cloud-controller-manager-aws",
            "dependencies",
        ),
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "staging-only",
        "vsphere-api",
        "dependency on cloud-controller-manager-aws (cmd/cloud-controller-manager-aws), which is not in staging/",
    );
}

#[test]
fn staged_crate_with_a_dev_dependency_on_a_provider_fails() {
    let tree = with_dep(
        clean_tree(),
        "k8s-cloud-provider",
        ("cloud-provider-vsphere", "providers/vsphere", "dev-dependencies"),
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "staging-only",
        "k8s-cloud-provider",
        "has a dev dependency on cloud-provider-vsphere",
    );
}

#[test]
fn binary_linking_two_providers_fails() {
    let tree = with_dep(
        clean_tree(),
        "cloud-controller-manager-vsphere",
        ("cloud-provider-aws", "providers/aws", "dependencies"),
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "one-provider-per-binary",
        "cloud-controller-manager-vsphere",
        "links crates of provider `aws`: aws-sdk-ec2, cloud-provider-aws, k8s-legacy-cloud-provider-aws",
    );
}

#[test]
fn binary_linking_another_providers_sdk_fails() {
    let tree = with_dep(
        clean_tree(),
        "cloud-controller-manager-vsphere",
        ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies"),
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "one-provider-per-binary",
        "cloud-controller-manager-vsphere",
        "links crates of provider `aws`: aws-sdk-ec2",
    );
}

#[test]
fn binary_without_its_provider_fails() {
    let mut tree = clean_tree();
    tree.iter_mut()
        .find(|c| c.name == "cloud-controller-manager-aws")
        .unwrap()
        .deps
        .clear();
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "one-provider-per-binary",
        "cloud-controller-manager-aws",
        "does not link its provider crate cloud-provider-aws",
    );
}

#[test]
fn provider_depending_on_another_provider_fails() {
    let tree = with_dep(
        clean_tree(),
        "cloud-provider-aws",
        ("cloud-provider-vsphere", "providers/vsphere", "dependencies"),
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "provider-isolation",
        "cloud-provider-aws",
        "crate of provider `aws` (providers/aws) depends on cloud-provider-vsphere, a crate of provider `vsphere`",
    );
}

#[test]
fn legacy_provider_depending_on_another_legacy_provider_fails() {
    let tree = with_dep(
        clean_tree(),
        "k8s-legacy-cloud-provider-vsphere",
        (
            "k8s-legacy-cloud-provider-aws",
            "staging/legacy-cloud-providers/aws",
            "dependencies",
        ),
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "provider-isolation",
        "k8s-legacy-cloud-provider-vsphere",
        "a crate of provider `aws`",
    );
}

#[test]
fn provider_depending_on_a_binary_fails() {
    let tree = with_dep(
        clean_tree(),
        "cloud-provider-vsphere",
        (
            "cloud-controller-manager-aws",
            "cmd/cloud-controller-manager-aws",
            "dependencies",
        ),
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "provider-isolation",
        "cloud-provider-vsphere",
        "depends on the binary crate cloud-controller-manager-aws",
    );
}

#[test]
fn phase_3_while_the_legacy_crate_exists_fails() {
    let v = check(
        &clean_tree(),
        "aws = { phase = 3, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2 }\n",
    );
    assert_single(
        &v,
        "phase",
        "provider `aws` (phase 3)",
        "the legacy crate is gone, but staging/legacy-cloud-providers/aws still exists",
    );
}

#[test]
fn phase_3_with_staging_still_naming_the_provider_fails() {
    // The legacy crate is gone, but a staged crate still depends on the provider's SDK.
    let mut tree: Vec<Crate> = clean_tree()
        .into_iter()
        .filter(|c| c.name != "k8s-legacy-cloud-provider-aws")
        .collect();
    tree.iter_mut()
        .find(|c| c.name == "cloud-provider-aws")
        .unwrap()
        .deps = vec![("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies")];
    let clean = check(
        &tree,
        "aws = { phase = 3, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2 }\n",
    );
    assert!(clean.is_empty(), "a correct phase-3 tree passes: {clean:?}");
    let tree = with_dep(
        tree,
        "k8s-cloud-provider",
        ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies"),
    );
    let v = check(
        &tree,
        "aws = { phase = 3, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2 }\n",
    );
    assert_single(
        &v,
        "phase",
        "provider `aws` (phase 3)",
        "nothing in staging/ names the provider, but k8s-cloud-provider (staging/cloud-provider) depends on aws-sdk-ec2",
    );
}

#[test]
fn phase_1_with_a_binary_fails() {
    let v = check(
        &clean_tree(),
        "aws = { phase = 2, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 1 }\n",
    );
    assert_single(
        &v,
        "phase",
        "provider `vsphere` (phase 1)",
        "phase 1 has no out-of-tree crate, but providers/vsphere exists",
    );
    assert_single(
        &v,
        "phase",
        "provider `vsphere` (phase 1)",
        "phase 1 has no binary",
    );
}

#[test]
fn phase_2_without_the_provider_crate_fails() {
    let tree: Vec<Crate> = clean_tree()
        .into_iter()
        .filter(|c| {
            !matches!(
                c.name,
                "cloud-provider-vsphere" | "cloud-controller-manager-vsphere" | "e2e"
            )
        })
        .collect();
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "phase",
        "provider `vsphere` (phase 2)",
        "phase 2 needs the out-of-tree crate providers/vsphere",
    );
}

#[test]
fn undeclared_provider_fails() {
    let v = check(&clean_tree(), "aws = { phase = 2, sdk = [\"aws-sdk-*\"] }\n");
    assert_single(
        &v,
        "phase",
        "provider `vsphere`",
        "no entry in [workspace.metadata.providers]",
    );
}

#[test]
fn binary_named_after_no_provider_fails() {
    let mut tree = clean_tree();
    tree.push(Crate {
        dir: "cmd/ccm",
        name: "ccm",
        deps: vec![],
    });
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "one-provider-per-binary",
        "ccm",
        "is not named cloud-controller-manager-<provider>",
    );
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
fn the_real_tree_passes_and_reports_each_binary() {
    let ws = Workspace::load(&repo_root().join("Cargo.toml")).unwrap();
    let v = ws.check();
    assert!(
        v.is_empty(),
        "{}",
        v.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n")
    );
    let report = ws.report();
    assert_eq!(report.len(), 2, "{report:?}");
    for line in &report {
        assert!(line.contains("other-provider-crates=[]"), "{line}");
    }
    assert!(report[0].starts_with("cloud-controller-manager-aws") && report[0].contains("phase=2"));
}

// ---------------------------------------------------------------------------------------------
// cargo-deny: the bans of deny.toml / hack/deny-staging.toml on a copy of the real workspace.

fn cargo_deny() -> PathBuf {
    let cache = std::env::var_os("RCP_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"))
                .join("rust-cloud-provider")
        });
    let p = cache.join("bin/cargo-deny");
    assert!(
        p.exists(),
        "cargo-deny missing at {}: run hack/install-test-deps.sh",
        p.display()
    );
    p
}

fn copy_workspace() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let root = repo_root();
    let status = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["--exclude=./target", "--exclude=./.git", "-cf", "-", "."])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|tar| {
            Command::new("tar")
                .arg("-C")
                .arg(tmp.path())
                .arg("-xf")
                .arg("-")
                .stdin(tar.stdout.unwrap())
                .status()
        })
        .unwrap();
    assert!(status.success());
    tmp
}

fn plant(ws: &Path, manifest: &str, dep_line: &str) {
    let path = ws.join(manifest);
    let text = fs::read_to_string(&path).unwrap();
    let text = text.replacen("[dependencies]\n", &format!("[dependencies]\n{dep_line}\n"), 1);
    fs::write(path, text).unwrap();
}

fn deny(ws: &Path, config: &str) -> (bool, String) {
    let out = Command::new(cargo_deny())
        .current_dir(ws)
        .args([
            "--offline",
            "--color",
            "never",
            "--config",
            config,
            "check",
            "bans",
        ])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cargo_deny_bans_pass_on_the_clean_tree() {
    let ws = copy_workspace();
    let (ok, out) = deny(ws.path(), "deny.toml");
    assert!(ok, "{out}");
    let (ok, out) = deny(ws.path(), "hack/deny-staging.toml");
    assert!(ok, "{out}");
}

#[test]
fn cargo_deny_bans_a_binary_linking_a_second_provider() {
    let ws = copy_workspace();
    plant(
        ws.path(),
        "cmd/cloud-controller-manager-vsphere/Cargo.toml",
        "cloud-provider-aws.workspace = true",
    );
    let (ok, out) = deny(ws.path(), "deny.toml");
    assert!(!ok, "expected bans to fail:\n{out}");
    assert!(
        out.contains("error[banned]") && out.contains("cloud-provider-aws"),
        "{out}"
    );
}

#[test]
fn cargo_deny_bans_the_aws_sdk_outside_the_aws_provider() {
    let ws = copy_workspace();
    plant(
        ws.path(),
        "providers/vsphere/Cargo.toml",
        "aws-sdk-ec2.workspace = true",
    );
    let (ok, out) = deny(ws.path(), "deny.toml");
    assert!(!ok, "expected bans to fail:\n{out}");
    assert!(
        out.contains("error[banned]") && out.contains("aws-sdk-ec2"),
        "{out}"
    );
}

#[test]
fn cargo_deny_bans_a_staged_crate_depending_on_a_provider() {
    let ws = copy_workspace();
    plant(
        ws.path(),
        "staging/vsphere-api/Cargo.toml",
        "cloud-provider-aws.workspace = true",
    );
    let (ok, out) = deny(ws.path(), "hack/deny-staging.toml");
    assert!(!ok, "expected bans to fail:\n{out}");
    assert!(
        out.contains("error[banned]") && out.contains("cloud-provider-aws"),
        "{out}"
    );
}
