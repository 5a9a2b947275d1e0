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
    /// Raw TOML appended to the manifest (optional, target-specific, renamed, … edges).
    raw: String,
    /// `publish = false` is written for every crate outside staging/ unless this is set.
    publishable: bool,
}

fn krate(
    dir: &'static str,
    name: &'static str,
    deps: Vec<(&'static str, &'static str, &'static str)>,
) -> Crate {
    Crate {
        dir,
        name,
        deps,
        raw: String::new(),
        publishable: dir.starts_with("staging/"),
    }
}

fn clean_tree() -> Vec<Crate> {
    vec![
        krate(
            "staging/cloud-provider",
            "k8s-cloud-provider",
            vec![("neutral-rt", "../ext/neutral-rt", "dependencies")],
        ),
        krate(
            "staging/vsphere-api",
            "vsphere-api",
            vec![("shared-hash", "../ext/shared-hash", "dependencies")],
        ),
        krate(
            "staging/legacy-cloud-providers/aws",
            "k8s-legacy-cloud-provider-aws",
            vec![
                ("k8s-cloud-provider", "staging/cloud-provider", "dependencies"),
                ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies"),
                // The staged provider also uses an SDK support crate directly (as ours does).
                ("aws-smithy-types", "../ext/aws-smithy-types", "dependencies"),
            ],
        ),
        krate(
            "staging/legacy-cloud-providers/vsphere",
            "k8s-legacy-cloud-provider-vsphere",
            vec![
                ("k8s-cloud-provider", "staging/cloud-provider", "dependencies"),
                ("vsphere-api", "staging/vsphere-api", "dependencies"),
            ],
        ),
        krate(
            "providers/aws",
            "cloud-provider-aws",
            vec![(
                "k8s-legacy-cloud-provider-aws",
                "staging/legacy-cloud-providers/aws",
                "dependencies",
            )],
        ),
        krate(
            "providers/vsphere",
            "cloud-provider-vsphere",
            vec![(
                "k8s-legacy-cloud-provider-vsphere",
                "staging/legacy-cloud-providers/vsphere",
                "dependencies",
            )],
        ),
        krate(
            "cmd/cloud-controller-manager-aws",
            "cloud-controller-manager-aws",
            vec![("cloud-provider-aws", "providers/aws", "dependencies")],
        ),
        krate(
            "cmd/cloud-controller-manager-vsphere",
            "cloud-controller-manager-vsphere",
            vec![("cloud-provider-vsphere", "providers/vsphere", "dependencies")],
        ),
        krate(
            "tests",
            "e2e",
            vec![
                ("cloud-provider-aws", "providers/aws", "dependencies"),
                ("cloud-provider-vsphere", "providers/vsphere", "dependencies"),
            ],
        ),
        krate("hack/tool", "hack-tool", vec![]),
    ]
}

const PHASES: &str =
    "aws = { phase = 2, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2, sdk = [\"vsphere-api\"] }\n";

/// Crates outside the workspace, standing in for registry crates: `(name, repository, deps)`.
/// `aws-sdk-ec2` and `aws-smithy-types` come from the SDK's publisher; `shared-hash` (like
/// `sha2`) is used by both SDKs; `neutral-rt` (like `tokio`) by the framework and the SDK.
const EXTERNAL: &[(&str, &str, &[&str])] = &[
    (
        "aws-sdk-ec2",
        "https://example.invalid/fake-aws-sdk",
        &["aws-smithy-types", "shared-hash"],
    ),
    (
        "aws-smithy-types",
        "https://example.invalid/fake-aws-sdk.git",
        &["neutral-rt"],
    ),
    ("shared-hash", "https://example.invalid/hashes", &[]),
    ("neutral-rt", "https://example.invalid/runtime", &[]),
];

fn write_tree(crates: &[Crate], phases: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    for (name, repo, deps) in EXTERNAL {
        let dir = tmp.path().join("ext").join(name);
        fs::create_dir_all(dir.join("src")).unwrap();
        let mut manifest = format!(
            "[package]\nname = \"{name}\"\nversion = \"1.0.0\"\nedition = \"2021\"\nrepository = \"{repo}\"\n\n[dependencies]\n"
        );
        for d in *deps {
            manifest.push_str(&format!("{d} = {{ path = \"../{d}\" }}\n"));
        }
        fs::write(dir.join("Cargo.toml"), manifest).unwrap();
        fs::write(dir.join("src/lib.rs"), "").unwrap();
    }
    let outside = tmp.path().join("outside/copy");
    fs::create_dir_all(outside.join("src")).unwrap();
    fs::write(
        outside.join("Cargo.toml"),
        "[package]\nname = \"copy\"\nversion = \"1.0.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    fs::write(outside.join("src/lib.rs"), "").unwrap();
    let members: Vec<String> = crates.iter().map(|c| format!("\"{}\"", c.dir)).collect();
    fs::create_dir_all(&ws).unwrap();
    fs::write(
        ws.join("Cargo.toml"),
        format!(
            "[workspace]\nresolver = \"2\"\nmembers = [{}]\n\n[workspace.metadata.boundaries]\nallow-external-paths = [\"../ext/*\"]\n\n[workspace.metadata.providers]\n{phases}",
            members.join(", ")
        ),
    )
    .unwrap();
    for c in crates {
        let dir = ws.join(c.dir);
        fs::create_dir_all(dir.join("src")).unwrap();
        let mut manifest = format!(
            "[package]\nname = \"{}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n{}",
            c.name,
            if c.publishable { "" } else { "publish = false\n" }
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
        manifest.push_str(&c.raw);
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

fn with_raw(mut tree: Vec<Crate>, from: &str, raw: &str) -> Vec<Crate> {
    tree.iter_mut()
        .find(|c| c.name == from)
        .expect("crate")
        .raw
        .push_str(raw);
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
        "links crates of provider `aws`: aws-sdk-ec2, aws-smithy-types, cloud-provider-aws, k8s-legacy-cloud-provider-aws",
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
        "links crates of provider `aws`: aws-sdk-ec2, aws-smithy-types",
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
        "crate of provider `aws` (providers/aws) has a normal dependency on cloud-provider-vsphere, a crate of provider `vsphere`",
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
        "has a normal dependency on cloud-controller-manager-aws (cmd/cloud-controller-manager-aws), a binary crate",
    );
}

#[test]
fn phase_3_while_the_legacy_crate_exists_fails() {
    let v = check(
        &clean_tree(),
        "aws = { phase = 3, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2, sdk = [\"vsphere-api\"] }\n",
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
        .deps = vec![
        ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies"),
        ("k8s-cloud-provider", "staging/cloud-provider", "dependencies"),
    ];
    let clean = check(
        &tree,
        "aws = { phase = 3, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2, sdk = [\"vsphere-api\"] }\n",
    );
    assert!(clean.is_empty(), "a correct phase-3 tree passes: {clean:?}");
    let tree = with_dep(
        tree,
        "k8s-cloud-provider",
        ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies"),
    );
    let v = check(
        &tree,
        "aws = { phase = 3, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2, sdk = [\"vsphere-api\"] }\n",
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
        "aws = { phase = 2, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 1, sdk = [\"vsphere-api\"] }\n",
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
    tree.push(krate("cmd/ccm", "ccm", vec![]));
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "one-provider-per-binary",
        "ccm",
        "is not named cloud-controller-manager-<provider>",
    );
}

const PHASES_WITH_ECR: &str = "aws = { phase = 2, sdk = [\"aws-sdk-*\"], binaries = [\"ecr-credential-provider\"] }\nvsphere = { phase = 2, sdk = [\"vsphere-api\"] }\n";

#[test]
fn a_providers_declared_other_binary_passes_with_its_sdk_only() {
    let mut tree = clean_tree();
    tree.push(krate(
        "cmd/ecr-credential-provider",
        "ecr-credential-provider",
        vec![("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies")],
    ));
    let v = check(&tree, PHASES_WITH_ECR);
    assert!(v.is_empty(), "{v:?}");
    // Undeclared, the same binary is refused.
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "one-provider-per-binary",
        "ecr-credential-provider",
        "no provider lists it in `binaries`",
    );
}

#[test]
fn a_providers_other_binary_linking_another_provider_fails() {
    let mut tree = clean_tree();
    tree.push(krate(
        "cmd/ecr-credential-provider",
        "ecr-credential-provider",
        vec![
            ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dependencies"),
            ("vsphere-api", "staging/vsphere-api", "dependencies"),
        ],
    ));
    let v = check(&tree, PHASES_WITH_ECR);
    assert_single(
        &v,
        "one-provider-per-binary",
        "ecr-credential-provider",
        "links crates of provider `vsphere`: vsphere-api",
    );
}

// --- the holes of the first version (issue 16) ------------------------------------------------

#[test]
fn the_sdk_support_crates_are_the_providers_own() {
    // aws-smithy-types is no `aws-sdk-*` name: it is AWS's because the SDK's publisher ships it.
    let ws = {
        let (_tmp, manifest) = write_tree(&clean_tree(), PHASES);
        Workspace::load(&manifest).unwrap()
    };
    assert_eq!(ws.provider_of("aws-smithy-types").as_deref(), Some("aws"));
    assert_eq!(ws.provider_of("aws-sdk-ec2").as_deref(), Some("aws"));
    assert_eq!(ws.provider_of("vsphere-api").as_deref(), Some("vsphere"));
    assert_eq!(
        ws.provider_of("shared-hash"),
        None,
        "a crate both SDKs use is neutral"
    );
    assert_eq!(
        ws.provider_of("neutral-rt"),
        None,
        "a runtime the framework uses is neutral"
    );
    let report = ws.report();
    assert!(
        report[0].contains(
            "provider-owned=4:[aws-sdk-ec2,aws-smithy-types,cloud-provider-aws,k8s-legacy-cloud-provider-aws]"
        ),
        "{report:?}"
    );
    assert!(
        report[1].contains("shared-with-other-providers-outside-the-framework=[shared-hash]"),
        "{report:?}"
    );
}

#[test]
fn a_binary_linking_an_sdk_support_crate_of_another_provider_fails() {
    let tree = with_dep(
        clean_tree(),
        "cloud-controller-manager-vsphere",
        ("aws-smithy-types", "../ext/aws-smithy-types", "dependencies"),
    );
    assert_single(
        &check(&tree, PHASES),
        "one-provider-per-binary",
        "cloud-controller-manager-vsphere",
        "links crates of provider `aws`: aws-smithy-types",
    );
}

#[test]
fn a_provider_reaching_an_sdk_support_crate_of_another_provider_fails() {
    let tree = with_dep(
        clean_tree(),
        "k8s-legacy-cloud-provider-vsphere",
        ("aws-smithy-types", "../ext/aws-smithy-types", "dependencies"),
    );
    assert_single(
        &check(&tree, PHASES),
        "provider-isolation",
        "k8s-legacy-cloud-provider-vsphere",
        "has a normal dependency on aws-smithy-types, a crate of provider `aws`",
    );
}

#[test]
fn a_neutral_staged_crate_linking_a_provider_sdk_fails() {
    let tree = with_dep(
        clean_tree(),
        "k8s-cloud-provider",
        ("aws-smithy-types", "../ext/aws-smithy-types", "dependencies"),
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "neutral-isolation",
        "k8s-cloud-provider",
        "provider-neutral staged crate (staging/cloud-provider) has a normal dependency on aws-smithy-types, a crate of provider `aws`",
    );
    assert_single(
        &v,
        "neutral-isolation",
        "k8s-cloud-provider",
        "links crates of provider `aws`: aws-smithy-types",
    );
}

#[test]
fn a_neutral_staged_crate_with_a_dev_dependency_on_an_sdk_fails() {
    let tree = with_dep(
        clean_tree(),
        "k8s-cloud-provider",
        ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dev-dependencies"),
    );
    assert_single(
        &check(&tree, PHASES),
        "neutral-isolation",
        "k8s-cloud-provider",
        "has a dev dependency on aws-sdk-ec2, a crate of provider `aws`",
    );
}

#[test]
fn a_neutral_staged_crate_depending_on_a_legacy_provider_fails() {
    let tree = with_dep(
        clean_tree(),
        "k8s-cloud-provider",
        (
            "k8s-legacy-cloud-provider-vsphere",
            "staging/legacy-cloud-providers/vsphere",
            "dev-dependencies",
        ),
    );
    assert_single(
        &check(&tree, PHASES),
        "neutral-isolation",
        "k8s-cloud-provider",
        "has a dev dependency on k8s-legacy-cloud-provider-vsphere, a crate of provider `vsphere`",
    );
}

#[test]
fn a_binary_with_a_dev_dependency_on_another_provider_fails() {
    let tree = with_dep(
        clean_tree(),
        "cloud-controller-manager-vsphere",
        ("aws-sdk-ec2", "../ext/aws-sdk-ec2", "dev-dependencies"),
    );
    assert_single(
        &check(&tree, PHASES),
        "one-provider-per-binary",
        "cloud-controller-manager-vsphere",
        "binary of provider `vsphere` has a dev dependency on aws-sdk-ec2, a crate of provider `aws`",
    );
}

#[test]
fn an_optional_dependency_behind_a_non_default_feature_fails() {
    let tree = with_raw(
        clean_tree(),
        "cloud-controller-manager-vsphere",
        "cloud-provider-aws = { path = \"../../providers/aws\", optional = true }\n\n[features]\nextra = [\"dep:cloud-provider-aws\"]\n",
    );
    let v = check(&tree, PHASES);
    assert_single(
        &v,
        "one-provider-per-binary",
        "cloud-controller-manager-vsphere",
        "links crates of provider `aws`: aws-sdk-ec2, aws-smithy-types, cloud-provider-aws",
    );
}

#[test]
fn a_target_specific_dependency_fails() {
    let tree = with_raw(
        clean_tree(),
        "cloud-provider-vsphere",
        "\n[target.'cfg(unix)'.dependencies]\ncloud-provider-aws = { path = \"../aws\" }\n",
    );
    assert_single(
        &check(&tree, PHASES),
        "provider-isolation",
        "cloud-provider-vsphere",
        "has a normal (cfg(unix)) dependency on cloud-provider-aws, a crate of provider `aws`",
    );
}

#[test]
fn a_renamed_dependency_fails() {
    let tree = with_raw(
        clean_tree(),
        "cloud-provider-vsphere",
        "aws = { package = \"k8s-legacy-cloud-provider-aws\", path = \"../../staging/legacy-cloud-providers/aws\" }\n",
    );
    assert_single(
        &check(&tree, PHASES),
        "provider-isolation",
        "cloud-provider-vsphere",
        "has a normal dependency on k8s-legacy-cloud-provider-aws (renamed as aws), a crate of provider `aws`",
    );
}

#[test]
fn a_path_dependency_outside_the_workspace_fails() {
    let tree = with_raw(
        clean_tree(),
        "cloud-provider-vsphere",
        "copy = { path = \"../../../outside/copy\" }\n",
    );
    assert_single(
        &check(&tree, PHASES),
        "external-path",
        "copy",
        "resolves to a path crate outside the workspace (../outside/copy) through a path dependency or a [patch], used by cloud-provider-vsphere",
    );
}

#[test]
fn a_patch_to_a_crate_outside_the_workspace_fails() {
    // `[patch]` swaps what a registry dependency resolves to: the framework takes a crate from
    // crates.io by version, and the root manifest patches it to a local copy.
    let tree = with_raw(clean_tree(), "k8s-cloud-provider", "patched-util = \"1\"\n");
    let (tmp, manifest) = write_tree(&tree, PHASES);
    let patched = tmp.path().join("outside/patched-util");
    fs::create_dir_all(patched.join("src")).unwrap();
    fs::write(
        patched.join("Cargo.toml"),
        "[package]\nname = \"patched-util\"\nversion = \"1.0.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    fs::write(patched.join("src/lib.rs"), "").unwrap();
    let root = fs::read_to_string(&manifest).unwrap();
    fs::write(
        &manifest,
        format!("{root}\n[patch.crates-io]\npatched-util = {{ path = \"../outside/patched-util\" }}\n"),
    )
    .unwrap();
    let v = Workspace::load(&manifest)
        .expect("offline metadata with a patched registry crate")
        .check();
    assert_single(
        &v,
        "external-path",
        "patched-util",
        "resolves to a path crate outside the workspace (../outside/patched-util) through a path dependency or a [patch], used by k8s-cloud-provider",
    );
}

#[test]
fn providers_and_binaries_depending_on_tests_or_hack_fail() {
    let tree = with_dep(
        clean_tree(),
        "cloud-provider-vsphere",
        ("hack-tool", "hack/tool", "dev-dependencies"),
    );
    assert_single(
        &check(&tree, PHASES),
        "provider-isolation",
        "cloud-provider-vsphere",
        "has a dev dependency on hack-tool (hack/tool), a tests/ or hack/ crate",
    );
    let tree = with_dep(
        clean_tree(),
        "cloud-controller-manager-aws",
        ("hack-tool", "hack/tool", "dependencies"),
    );
    assert_single(
        &check(&tree, PHASES),
        "one-provider-per-binary",
        "cloud-controller-manager-aws",
        "binary crate has a normal dependency on hack-tool (hack/tool), a tests/ or hack/ crate",
    );
}

#[test]
fn a_crate_nested_under_a_legacy_provider_is_that_providers() {
    let mut tree = clean_tree();
    tree.push(krate(
        "staging/legacy-cloud-providers/aws/extra",
        "aws-extra",
        vec![],
    ));
    let tree = with_dep(
        tree,
        "cloud-controller-manager-vsphere",
        (
            "aws-extra",
            "staging/legacy-cloud-providers/aws/extra",
            "dependencies",
        ),
    );
    assert_single(
        &check(&tree, PHASES),
        "one-provider-per-binary",
        "cloud-controller-manager-vsphere",
        "links crates of provider `aws`: aws-extra",
    );
}

#[test]
fn a_publishable_crate_outside_staging_fails() {
    let mut tree = clean_tree();
    tree.iter_mut()
        .find(|c| c.name == "cloud-provider-vsphere")
        .unwrap()
        .publishable = true;
    assert_single(
        &check(&tree, PHASES),
        "publish",
        "cloud-provider-vsphere",
        "is publishable but lives in providers/vsphere, not under staging/",
    );
}

#[test]
fn a_binary_crate_nested_in_cmd_fails() {
    let mut tree = clean_tree();
    tree.push(krate("cmd/tools/x", "x", vec![]));
    assert_single(
        &check(&tree, PHASES),
        "layout",
        "x",
        "lives in `cmd/tools/x`: a binary crate lives directly in cmd/<its name>",
    );
}

#[test]
fn an_sdk_claimed_by_two_providers_fails() {
    let v = check(
        &clean_tree(),
        "aws = { phase = 2, sdk = [\"aws-sdk-*\"] }\nvsphere = { phase = 2, sdk = [\"vsphere-api\", \"aws-sdk-ec2\"] }\n",
    );
    assert_single(
        &v,
        "layout",
        "aws-sdk-ec2",
        "is claimed by the SDKs of several providers: aws, vsphere",
    );
}

/// The repository root. `CARGO_MANIFEST_DIR` is read when the test runs (cargo and nextest set
/// it) before the compile-time value: a build cache shared by checkouts at other paths can
/// hold a test binary, still fresh by its sources' times, compiled in another checkout.
fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
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
    assert_eq!(report.len(), 4, "{report:?}");
    for line in &report {
        assert!(line.contains("other-provider-crates=[]"), "{line}");
    }
    let line = |binary: &str| {
        report
            .iter()
            .find(|l| l.starts_with(&format!("{binary} ")))
            .unwrap_or_else(|| panic!("{binary} in {report:?}"))
            .clone()
    };
    let aws = line("cloud-controller-manager-aws");
    let vsphere = line("cloud-controller-manager-vsphere");
    let openstack = line("cloud-controller-manager-openstack");
    let ecr = line("ecr-credential-provider");
    assert!(aws.contains("phase=2"));
    // AWS's kubelet credential provider is AWS's binary, linking ECR and no CCM crate.
    assert!(
        ecr.contains("provider=aws") && ecr.contains("aws-sdk-ecr,") && !ecr.contains("cloud-provider-aws"),
        "{ecr}"
    );
    // The third provider: its two crates, and not one crate of the others (nor they of it).
    assert!(
        openstack.contains("provider=openstack")
            && openstack
                .contains("provider-owned=2:[cloud-provider-openstack,k8s-legacy-cloud-provider-openstack]"),
        "{openstack}"
    );
    for needle in ["aws-sdk", "aws-config", "aws-smithy", "vsphere"] {
        assert!(!openstack.contains(needle), "{needle} in {openstack}");
    }
    for other in [&aws, &vsphere, &ecr] {
        assert!(!other.contains("openstack"), "{other}");
    }
    let report = [aws, vsphere];
    // The SDK's support crates count as AWS's without being listed anywhere.
    for c in [
        "aws-smithy-types",
        "aws-smithy-runtime",
        "aws-sigv4",
        "aws-types",
        "aws-credential-types",
        "aws-sdk-sts",
    ] {
        assert_eq!(ws.provider_of(c).as_deref(), Some("aws"), "{c}");
        assert!(report[0].contains(c), "{c} in {}", report[0]);
    }
    for c in ["tokio", "hyper", "rustls", "aws-lc-rs"] {
        assert_eq!(ws.provider_of(c), None, "{c} is neutral");
    }
    assert!(
        report[1].contains(
            "provider-owned=3:[cloud-provider-vsphere,k8s-legacy-cloud-provider-vsphere,vsphere-api]"
        ),
        "{}",
        report[1]
    );
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

#[test]
fn cargo_deny_bans_the_openstack_provider_in_another_binary_and_the_aws_sdk_in_it() {
    let ws = copy_workspace();
    plant(
        ws.path(),
        "cmd/cloud-controller-manager-aws/Cargo.toml",
        "cloud-provider-openstack.workspace = true",
    );
    let (ok, out) = deny(ws.path(), "deny.toml");
    assert!(!ok, "expected bans to fail:\n{out}");
    assert!(
        out.contains("error[banned]") && out.contains("cloud-provider-openstack"),
        "{out}"
    );

    let ws = copy_workspace();
    plant(
        ws.path(),
        "providers/openstack/Cargo.toml",
        "aws-sdk-ec2.workspace = true",
    );
    let (ok, out) = deny(ws.path(), "deny.toml");
    assert!(!ok, "expected bans to fail:\n{out}");
    assert!(
        out.contains("error[banned]") && out.contains("aws-sdk-ec2"),
        "{out}"
    );
}
