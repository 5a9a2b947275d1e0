//! The dependency rules of the staging layout that cargo-deny cannot express, checked from
//! `cargo metadata` (see `docs/extraction.md`):
//!
//! | rule | checks |
//! |---|---|
//! | `staging-only` | a crate under `staging/` depends (normal, build and dev) only on `staging/` crates and external crates |
//! | `provider-isolation` | `providers/<p>` and `staging/legacy-cloud-providers/<p>` depend on no crate of another provider and on no `cmd/` crate |
//! | `one-provider-per-binary` | the resolved closure of `cmd/cloud-controller-manager-<p>` holds provider `<p>`'s crate and no crate (legacy, provider or SDK) of another provider; every `cmd/` crate is named after a declared provider |
//! | `phase` | the tree matches the phase declared in `[workspace.metadata.providers]` |

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt,
    path::Path,
};

use cargo_metadata::{DependencyKind, Metadata, PackageId};
use serde::Deserialize;

/// Where a workspace member lives, by its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// `staging/legacy-cloud-providers/<provider>`
    Legacy(String),
    /// any other crate under `staging/`
    Staged,
    /// `providers/<provider>`
    Provider(String),
    /// `cmd/<dir>`
    Cmd(String),
    /// `tests/` or `hack/` (never published, depends on whatever it tests)
    Internal,
    /// anywhere else (a layout error)
    Other(String),
}

/// One member of the workspace.
#[derive(Debug, Clone)]
pub struct Member {
    /// Package name.
    pub name: String,
    /// Directory relative to the workspace root.
    pub dir: String,
    /// Classification by directory.
    pub location: Location,
}

/// The `[workspace.metadata.providers.<name>]` entry.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderDecl {
    /// Extraction phase: 1, 2 or 3.
    pub phase: u8,
    /// Globs (`*` only) naming the crates of the provider's cloud SDK.
    #[serde(default)]
    pub sdk: Vec<String>,
}

/// A broken rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// The rule's name (`staging-only`, `provider-isolation`, `one-provider-per-binary`, `phase`).
    pub rule: &'static str,
    /// The crate (or provider) that breaks it.
    pub subject: String,
    /// What is wrong.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "error[{}] {}: {}; fix: {}",
            self.rule, self.subject, self.problem, self.fix
        )
    }
}

/// Errors reading the workspace description.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `cargo metadata` failed.
    #[error("cargo metadata failed: {0}")]
    Metadata(#[from] cargo_metadata::Error),
    /// `[workspace.metadata.providers]` is malformed.
    #[error("[workspace.metadata.providers] is invalid: {0}")]
    Declaration(String),
}

/// The workspace as the rules see it.
#[derive(Debug)]
pub struct Workspace {
    metadata: Metadata,
    /// Members by package name.
    pub members: BTreeMap<String, Member>,
    /// Declared providers.
    pub providers: BTreeMap<String, ProviderDecl>,
}

/// Prefix of every cloud-controller-manager binary crate.
pub const BINARY_PREFIX: &str = "cloud-controller-manager-";

impl Workspace {
    /// Runs `cargo metadata` (offline) on the workspace of `manifest_path`.
    pub fn load(manifest_path: &Path) -> Result<Self, Error> {
        let metadata = cargo_metadata::MetadataCommand::new()
            .manifest_path(manifest_path)
            .other_options(vec!["--offline".to_string()])
            .exec()?;
        Self::from_metadata(metadata)
    }

    /// Classifies the members of already loaded metadata.
    pub fn from_metadata(metadata: Metadata) -> Result<Self, Error> {
        let root = metadata.workspace_root.clone();
        let mut members = BTreeMap::new();
        for pkg in metadata.workspace_packages() {
            let dir = pkg
                .manifest_path
                .parent()
                .and_then(|d| d.strip_prefix(&root).ok())
                .map(|d| d.as_str().to_string())
                .unwrap_or_default();
            let parts: Vec<&str> = dir.split('/').collect();
            let location = match parts.as_slice() {
                ["staging", "legacy-cloud-providers", p] => Location::Legacy((*p).to_string()),
                ["staging", ..] => Location::Staged,
                ["providers", p] => Location::Provider((*p).to_string()),
                ["cmd", d] => Location::Cmd((*d).to_string()),
                ["tests", ..] | ["hack", ..] => Location::Internal,
                _ => Location::Other(dir.clone()),
            };
            members.insert(
                pkg.name.to_string(),
                Member {
                    name: pkg.name.to_string(),
                    dir,
                    location,
                },
            );
        }
        let providers = match metadata.workspace_metadata.get("providers") {
            None => BTreeMap::new(),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| Error::Declaration(e.to_string()))?,
        };
        Ok(Self {
            metadata,
            members,
            providers,
        })
    }

    fn member_of_location(&self, wanted: &Location) -> Option<&Member> {
        self.members.values().find(|m| &m.location == wanted)
    }

    /// The provider a crate (member or external SDK crate) belongs to, if any.
    pub fn provider_of(&self, crate_name: &str) -> Option<String> {
        if let Some(m) = self.members.get(crate_name) {
            match &m.location {
                Location::Legacy(p) | Location::Provider(p) => return Some(p.clone()),
                _ => {}
            }
        }
        self.providers
            .iter()
            .find(|(_, d)| d.sdk.iter().any(|g| glob_match(g, crate_name)))
            .map(|(p, _)| p.clone())
    }

    /// Direct dependencies of a member: `(name, kinds)`, from its manifest.
    fn direct_deps(&self, name: &str) -> Vec<(String, BTreeSet<&'static str>)> {
        let Some(pkg) = self
            .metadata
            .workspace_packages()
            .into_iter()
            .find(|p| p.name.as_str() == name)
        else {
            return Vec::new();
        };
        let mut by_name: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
        for d in &pkg.dependencies {
            let kind = match d.kind {
                DependencyKind::Development => "dev",
                DependencyKind::Build => "build",
                _ => "normal",
            };
            by_name.entry(d.name.clone()).or_default().insert(kind);
        }
        by_name.into_iter().collect()
    }

    /// The resolved closure (normal and build edges) of a member, names only, itself excluded.
    pub fn closure(&self, name: &str) -> BTreeSet<String> {
        let Some(resolve) = &self.metadata.resolve else {
            return BTreeSet::new();
        };
        let Some(pkg) = self
            .metadata
            .workspace_packages()
            .into_iter()
            .find(|p| p.name.as_str() == name)
        else {
            return BTreeSet::new();
        };
        let nodes: BTreeMap<&PackageId, _> = resolve.nodes.iter().map(|n| (&n.id, n)).collect();
        let names: BTreeMap<&PackageId, &str> = self
            .metadata
            .packages
            .iter()
            .map(|p| (&p.id, p.name.as_str()))
            .collect();
        let mut seen: BTreeSet<&PackageId> = BTreeSet::new();
        let mut queue = VecDeque::from([&pkg.id]);
        while let Some(id) = queue.pop_front() {
            if !seen.insert(id) {
                continue;
            }
            if let Some(node) = nodes.get(id) {
                for dep in &node.deps {
                    let shipped = dep
                        .dep_kinds
                        .iter()
                        .any(|k| k.kind != DependencyKind::Development);
                    if shipped {
                        queue.push_back(&dep.pkg);
                    }
                }
            }
        }
        seen.remove(&pkg.id);
        seen.into_iter()
            .filter_map(|id| names.get(id).map(|n| n.to_string()))
            .collect()
    }

    /// Checks every rule and returns the violations, sorted.
    pub fn check(&self) -> Vec<Violation> {
        let mut v = Vec::new();
        self.check_layout(&mut v);
        self.check_staging_only(&mut v);
        self.check_provider_isolation(&mut v);
        self.check_binaries(&mut v);
        self.check_phases(&mut v);
        v.sort();
        v.dedup();
        v
    }

    fn check_layout(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            if let Location::Other(dir) = &m.location {
                v.push(Violation {
                    rule: "layout",
                    subject: m.name.clone(),
                    problem: format!(
                        "lives in `{dir}`, outside staging/, providers/, cmd/, tests/ and hack/"
                    ),
                    fix: "move it into the directory that matches its role".into(),
                });
            }
        }
    }

    fn check_staging_only(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            if !matches!(m.location, Location::Staged | Location::Legacy(_)) {
                continue;
            }
            for (dep, kinds) in self.direct_deps(&m.name) {
                let Some(target) = self.members.get(&dep) else {
                    continue;
                };
                if matches!(target.location, Location::Staged | Location::Legacy(_)) {
                    continue;
                }
                v.push(Violation {
                    rule: "staging-only",
                    subject: m.name.clone(),
                    problem: format!(
                        "staged crate ({}) has a {} dependency on {} ({}), which is not in staging/",
                        m.dir,
                        kinds.into_iter().collect::<Vec<_>>().join("+"),
                        dep,
                        target.dir
                    ),
                    fix: format!(
                        "a staged crate may depend only on staging/ crates and external crates: move what {} needs into staging/, or drop the dependency",
                        m.name
                    ),
                });
            }
        }
    }

    fn check_provider_isolation(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            let own = match &m.location {
                Location::Provider(p) | Location::Legacy(p) => p,
                _ => continue,
            };
            for (dep, _) in self.direct_deps(&m.name) {
                if let Some(target) = self.members.get(&dep)
                    && let Location::Cmd(_) = target.location
                {
                    v.push(Violation {
                        rule: "provider-isolation",
                        subject: m.name.clone(),
                        problem: format!("provider crate ({}) depends on the binary crate {dep} ({})", m.dir, target.dir),
                        fix: "binaries depend on providers, never the other way round: move the shared code into the provider or staging/".into(),
                    });
                }
                if let Some(other) = self.provider_of(&dep)
                    && &other != own
                {
                    v.push(Violation {
                        rule: "provider-isolation",
                        subject: m.name.clone(),
                        problem: format!("crate of provider `{own}` ({}) depends on {dep}, a crate of provider `{other}`", m.dir),
                        fix: format!("providers are independent: move what both need into a provider-neutral staging/ crate and drop the dependency on {dep}"),
                    });
                }
            }
        }
    }

    fn check_binaries(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            let Location::Cmd(dir) = &m.location else { continue };
            let Some(provider) = m.name.strip_prefix(BINARY_PREFIX) else {
                v.push(Violation {
                    rule: "one-provider-per-binary",
                    subject: m.name.clone(),
                    problem: format!("binary crate in cmd/{dir} is not named {BINARY_PREFIX}<provider>"),
                    fix: format!("name it {BINARY_PREFIX}<provider> after the one provider it links"),
                });
                continue;
            };
            if dir != &m.name {
                v.push(Violation {
                    rule: "one-provider-per-binary",
                    subject: m.name.clone(),
                    problem: format!("lives in cmd/{dir}, not cmd/{}", m.name),
                    fix: format!("move it to cmd/{}", m.name),
                });
            }
            if !self.providers.contains_key(provider) {
                v.push(Violation {
                    rule: "one-provider-per-binary",
                    subject: m.name.clone(),
                    problem: format!("is named after provider `{provider}`, which [workspace.metadata.providers] does not declare"),
                    fix: format!("declare `{provider}` with its phase, or rename the binary after its provider"),
                });
                continue;
            }
            let closure = self.closure(&m.name);
            let own_crate = self.member_of_location(&Location::Provider(provider.to_string()));
            match own_crate {
                Some(own) if closure.contains(&own.name) => {}
                Some(own) => v.push(Violation {
                    rule: "one-provider-per-binary",
                    subject: m.name.clone(),
                    problem: format!("does not link its provider crate {} ({})", own.name, own.dir),
                    fix: format!("add {} to its [dependencies]", own.name),
                }),
                None => v.push(Violation {
                    rule: "one-provider-per-binary",
                    subject: m.name.clone(),
                    problem: format!("there is no providers/{provider} crate for it to link"),
                    fix: format!("create providers/{provider} (phase 2) or remove the binary (phase 1)"),
                }),
            }
            let mut foreign: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for c in &closure {
                if let Some(p) = self.provider_of(c)
                    && p != provider
                {
                    foreign.entry(p).or_default().push(c.clone());
                }
            }
            for (p, crates) in foreign {
                v.push(Violation {
                    rule: "one-provider-per-binary",
                    subject: m.name.clone(),
                    problem: format!("links crates of provider `{p}`: {}", crates.join(", ")),
                    fix: format!(
                        "a binary links exactly one provider: remove the dependency path to {} (`cargo tree -p {} -i {}` shows it)",
                        crates[0], m.name, crates[0]
                    ),
                });
            }
        }
    }

    fn check_phases(&self, v: &mut Vec<Violation>) {
        // Every provider that exists in the tree must be declared.
        let mut present: BTreeSet<String> = BTreeSet::new();
        for m in self.members.values() {
            match &m.location {
                Location::Legacy(p) | Location::Provider(p) => {
                    present.insert(p.clone());
                }
                Location::Cmd(_) => {
                    if let Some(p) = m.name.strip_prefix(BINARY_PREFIX) {
                        present.insert(p.to_string());
                    }
                }
                _ => {}
            }
        }
        for p in &present {
            if !self.providers.contains_key(p) {
                v.push(Violation {
                    rule: "phase",
                    subject: format!("provider `{p}`"),
                    problem: "has crates in the tree but no entry in [workspace.metadata.providers]".into(),
                    fix: format!(
                        "add `{p} = {{ phase = N }}` to [workspace.metadata.providers] in the root Cargo.toml"
                    ),
                });
            }
        }
        for (p, decl) in &self.providers {
            let legacy = self.member_of_location(&Location::Legacy(p.clone()));
            let provider = self.member_of_location(&Location::Provider(p.clone()));
            let binary = self.members.get(&format!("{BINARY_PREFIX}{p}"));
            let subject = format!("provider `{p}` (phase {})", decl.phase);
            let mut want = |ok: bool, problem: String, fix: String| {
                if !ok {
                    v.push(Violation {
                        rule: "phase",
                        subject: subject.clone(),
                        problem,
                        fix,
                    });
                }
            };
            match decl.phase {
                1 => {
                    want(
                        legacy.is_some(),
                        format!("phase 1 needs the legacy crate staging/legacy-cloud-providers/{p}"),
                        "create it, or declare the provider's real phase".into(),
                    );
                    want(
                        provider.is_none(),
                        format!("phase 1 has no out-of-tree crate, but providers/{p} exists"),
                        "declare phase 2, or remove providers/".to_string() + p,
                    );
                    want(
                        binary.is_none(),
                        format!("phase 1 has no binary, but cmd/{BINARY_PREFIX}{p} exists"),
                        "declare phase 2, or remove the binary".into(),
                    );
                }
                2 => {
                    want(
                        legacy.is_some(),
                        format!("phase 2 needs the legacy crate staging/legacy-cloud-providers/{p}"),
                        "restore it, or declare phase 3 once the code lives in providers/".to_string() + p,
                    );
                    want(
                        provider.is_some(),
                        format!("phase 2 needs the out-of-tree crate providers/{p}"),
                        "create it (building on the legacy crate)".into(),
                    );
                    want(
                        binary.is_some(),
                        format!("phase 2 needs the binary cmd/{BINARY_PREFIX}{p}"),
                        "create it (linking providers/".to_string() + p + ")",
                    );
                }
                3 => {
                    want(
                        legacy.is_none(),
                        format!(
                            "phase 3 means the legacy crate is gone, but staging/legacy-cloud-providers/{p} still exists"
                        ),
                        format!(
                            "move its code into providers/{p} and delete staging/legacy-cloud-providers/{p}, or declare phase 2"
                        ),
                    );
                    want(
                        provider.is_some(),
                        format!("phase 3 needs the out-of-tree crate providers/{p}"),
                        "create it".into(),
                    );
                    want(
                        binary.is_some(),
                        format!("phase 3 needs the binary cmd/{BINARY_PREFIX}{p}"),
                        "create it".into(),
                    );
                    for m in self.members.values() {
                        if !matches!(m.location, Location::Staged | Location::Legacy(_)) {
                            continue;
                        }
                        for (dep, _) in self.direct_deps(&m.name) {
                            if self.provider_of(&dep).as_deref() == Some(p.as_str()) {
                                want(
                                    false,
                                    format!(
                                        "phase 3 means nothing in staging/ names the provider, but {} ({}) depends on {dep}",
                                        m.name, m.dir
                                    ),
                                    format!("drop {dep} from {}", m.name),
                                );
                            }
                        }
                    }
                }
                other => want(
                    false,
                    format!("unknown phase {other}"),
                    "use phase 1, 2 or 3".into(),
                ),
            }
        }
    }

    /// One line per binary: provider, phase, number of crates linked, and crates of other
    /// providers' SDKs (there must be none).
    pub fn report(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for m in self.members.values() {
            let Location::Cmd(_) = m.location else { continue };
            let provider = m.name.strip_prefix(BINARY_PREFIX).unwrap_or("?");
            let phase = self
                .providers
                .get(provider)
                .map(|d| d.phase.to_string())
                .unwrap_or_else(|| "undeclared".into());
            let closure = self.closure(&m.name);
            let globs = self
                .providers
                .get(provider)
                .map(|d| d.sdk.clone())
                .unwrap_or_default();
            let own_sdk = closure.iter().filter(|c| globs.iter().any(|g| glob_match(g, c)));
            let own_sdk: Vec<_> = own_sdk.cloned().collect();
            let foreign: Vec<_> = closure
                .iter()
                .filter(|c| self.provider_of(c).is_some_and(|p| p != provider))
                .cloned()
                .collect();
            lines.push(format!(
                "{:<34} provider={:<8} phase={} crates-linked={:<4} own-sdk-crates=[{}] other-provider-crates=[{}]",
                m.name,
                provider,
                phase,
                closure.len(),
                own_sdk.join(","),
                foreign.join(",")
            ));
        }
        lines
    }
}

/// `*`-only glob matching.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let mut rest = name;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(part) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            let Some(pos) = rest.find(part) else { return false };
            rest = &rest[pos + part.len()..];
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs() {
        assert!(glob_match("aws-sdk-*", "aws-sdk-ec2"));
        assert!(glob_match("aws-config", "aws-config"));
        assert!(!glob_match("aws-config", "aws-config-x"));
        assert!(!glob_match("aws-sdk-*", "aws-smithy-types"));
        assert!(glob_match("*-api", "vsphere-api"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
    }
}
