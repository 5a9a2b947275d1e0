//! The dependency rules of the staging layout that cargo-deny cannot express, checked from
//! `cargo metadata --all-features` (see `docs/extraction.md`):
//!
//! | rule | checks |
//! |---|---|
//! | `layout` | every member lives in `staging/`, `providers/<p>[/…]`, `cmd/<binary>`, `tests/` or `hack/` |
//! | `publish` | only crates under `staging/` are publishable (`publish = false` everywhere else) |
//! | `external-path` | no path dependency and no `[patch]` resolves to a crate outside the workspace (unless `[workspace.metadata.boundaries] allow-external-paths` lists it) |
//! | `staging-only` | a crate under `staging/` depends (every kind) only on `staging/` crates and external crates |
//! | `neutral-isolation` | a provider-neutral staged crate links (normal/build closure) and depends on (every kind) no crate owned by a provider |
//! | `provider-isolation` | a provider's crates depend (every kind) on no crate owned by another provider, no `cmd/`, `tests/` or `hack/` crate, and link no other provider's crate |
//! | `one-provider-per-binary` | the resolved closure of `cmd/cloud-controller-manager-<p>` holds provider `<p>`'s crate and no crate owned by another provider; its dev-dependencies name no other provider's crate and no `tests/`/`hack/` crate; a provider's other binaries (`binaries = [..]` in its declaration, e.g. `ecr-credential-provider`) follow the same rules except that they need not link `providers/<p>` |
//! | `phase` | the tree matches the phase declared in `[workspace.metadata.providers]` |
//!
//! **Which crates a provider owns.** Its crates in the tree (`staging/legacy-cloud-providers/<p>`
//! and `providers/<p>`, nested crates included), the SDK roots its declaration names (`sdk`
//! globs), and every crate of the SDK's closure (resolved graph) that the SDK's publisher
//! ships: a crate whose `repository` is the repository of one of the external SDK roots. For
//! AWS that covers `aws-smithy-*`, `aws-sigv4`, `aws-types`, `aws-runtime`,
//! `aws-credential-types` and the STS/SSO clients without naming them, while general crates
//! the SDK also uses (`tokio`, `hyper`, `rustls`, `aws-lc-rs`, `sha2`) stay neutral. The
//! criterion is the crates' own metadata, not reachability, so a planted edge cannot make an
//! SDK crate look neutral.
//!
//! Every dependency kind is checked: normal, build and dev, target-specific, optional (the
//! metadata is read with all features), renamed, and path dependencies.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt,
    path::Path,
};

use cargo_metadata::{CargoOpt, DependencyKind, Metadata, Package, PackageId};
use serde::Deserialize;

/// Where a workspace member lives, by its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// `staging/legacy-cloud-providers/<provider>[/…]`
    Legacy(String),
    /// any other crate under `staging/`
    Staged,
    /// `providers/<provider>[/…]`
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
    /// Whether `cargo publish` would publish it (`publish` not `false`).
    pub publishable: bool,
}

/// The `[workspace.metadata.providers.<name>]` entry.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderDecl {
    /// Extraction phase: 1, 2 or 3.
    pub phase: u8,
    /// Globs (`*` only) naming the root crates of the provider's cloud SDK.
    #[serde(default)]
    pub sdk: Vec<String>,
    /// The provider's other binaries (`cmd/<name>`) besides its cloud-controller-manager, e.g.
    /// AWS's kubelet credential provider `ecr-credential-provider`: they link this provider's
    /// crates (or none) and no other provider's.
    #[serde(default)]
    pub binaries: Vec<String>,
}

/// `[workspace.metadata.boundaries]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BoundariesDecl {
    /// Globs (relative to the workspace root) of directories that path dependencies outside
    /// the workspace may point to.
    #[serde(default)]
    pub allow_external_paths: Vec<String>,
}

/// A broken rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// The rule's name (see the module documentation).
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
    /// `[workspace.metadata.providers]` or `[workspace.metadata.boundaries]` is malformed.
    #[error("[workspace.metadata] is invalid: {0}")]
    Declaration(String),
}

/// One declared dependency of a member, as its manifest writes it.
#[derive(Debug, Clone)]
pub struct DepEdge {
    /// The package name of the dependency.
    pub name: String,
    /// `normal`, `build` or `dev`.
    pub kind: &'static str,
    /// `Some(cfg)` for a target-specific dependency.
    pub target: Option<String>,
    /// Whether it is optional (behind a feature).
    pub optional: bool,
    /// The name it is renamed to, if any.
    pub rename: Option<String>,
}

impl DepEdge {
    /// `dev`, `optional normal`, `build (cfg(unix))`, … plus ` renamed as x`.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        if self.optional {
            s.push_str("optional ");
        }
        s.push_str(self.kind);
        if let Some(t) = &self.target {
            s.push_str(&format!(" ({t})"));
        }
        s.push_str(" dependency on ");
        s.push_str(&self.name);
        if let Some(r) = &self.rename {
            s.push_str(&format!(" (renamed as {r})"));
        }
        s
    }
}

/// The workspace as the rules see it.
#[derive(Debug)]
pub struct Workspace {
    metadata: Metadata,
    /// Members by package name.
    pub members: BTreeMap<String, Member>,
    /// Declared providers.
    pub providers: BTreeMap<String, ProviderDecl>,
    /// Declared exceptions.
    pub boundaries: BoundariesDecl,
    /// The provider owning each owned crate (by package name), see the module docs.
    pub owned: BTreeMap<String, String>,
    /// Crates claimed by two providers' declarations: `(crate, [providers])`.
    pub contested: BTreeMap<String, BTreeSet<String>>,
}

/// Prefix of every cloud-controller-manager binary crate.
pub const BINARY_PREFIX: &str = "cloud-controller-manager-";

fn normalize_repository(url: &str) -> String {
    url.trim()
        .trim_end_matches('/')
        .trim_end_matches(".git")
        .to_ascii_lowercase()
}

fn classify(dir: &str) -> Location {
    let parts: Vec<&str> = dir.split('/').collect();
    match parts.as_slice() {
        ["staging", "legacy-cloud-providers", p, ..] => Location::Legacy((*p).to_string()),
        ["staging", ..] => Location::Staged,
        ["providers", p, ..] => Location::Provider((*p).to_string()),
        ["cmd", d] => Location::Cmd((*d).to_string()),
        ["tests", ..] | ["hack", ..] => Location::Internal,
        _ => Location::Other(dir.to_string()),
    }
}

impl Workspace {
    /// Runs `cargo metadata --all-features` (offline) on the workspace of `manifest_path`.
    pub fn load(manifest_path: &Path) -> Result<Self, Error> {
        let metadata = cargo_metadata::MetadataCommand::new()
            .manifest_path(manifest_path)
            .features(CargoOpt::AllFeatures)
            .other_options(vec!["--offline".to_string()])
            .exec()?;
        Self::from_metadata(metadata)
    }

    /// Classifies the members of already loaded metadata and works out provider ownership.
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
            members.insert(
                pkg.name.to_string(),
                Member {
                    name: pkg.name.to_string(),
                    location: classify(&dir),
                    dir,
                    publishable: pkg
                        .publish
                        .as_ref()
                        .is_none_or(|registries| !registries.is_empty()),
                },
            );
        }
        let providers: BTreeMap<String, ProviderDecl> = match metadata.workspace_metadata.get("providers") {
            None => BTreeMap::new(),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| Error::Declaration(format!("providers: {e}")))?,
        };
        let boundaries = match metadata.workspace_metadata.get("boundaries") {
            None => BoundariesDecl::default(),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| Error::Declaration(format!("boundaries: {e}")))?,
        };
        let mut ws = Self {
            metadata,
            members,
            providers,
            boundaries,
            owned: BTreeMap::new(),
            contested: BTreeMap::new(),
        };
        ws.compute_ownership();
        Ok(ws)
    }

    fn compute_ownership(&mut self) {
        let mut claims: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (p, decl) in &self.providers {
            let mut mine: BTreeSet<String> = BTreeSet::new();
            for m in self.members.values() {
                if matches!(&m.location, Location::Legacy(q) | Location::Provider(q) if q == p) {
                    mine.insert(m.name.clone());
                }
            }
            let roots: Vec<&Package> = self
                .metadata
                .packages
                .iter()
                .filter(|pkg| decl.sdk.iter().any(|g| glob_match(g, &pkg.name)))
                .collect();
            let family: BTreeSet<String> = roots
                .iter()
                .filter(|pkg| !self.members.contains_key(pkg.name.as_str()))
                .filter_map(|pkg| pkg.repository.as_deref().map(normalize_repository))
                .collect();
            for r in &roots {
                mine.insert(r.name.to_string());
            }
            let root_ids: Vec<&PackageId> = roots.iter().map(|r| &r.id).collect();
            for id in self.closure_of(&root_ids) {
                let Some(pkg) = self.metadata.packages.iter().find(|x| &x.id == id) else {
                    continue;
                };
                if self.members.contains_key(pkg.name.as_str()) {
                    continue;
                }
                if pkg
                    .repository
                    .as_deref()
                    .is_some_and(|r| family.contains(&normalize_repository(r)))
                {
                    mine.insert(pkg.name.to_string());
                }
            }
            for c in mine {
                claims.entry(c).or_default().insert(p.clone());
            }
        }
        for (c, ps) in claims {
            if ps.len() > 1 {
                self.contested.insert(c.clone(), ps.clone());
            }
            if let Some(p) = ps.into_iter().next() {
                self.owned.insert(c, p);
            }
        }
    }

    fn member_of_location(&self, wanted: &Location) -> Option<&Member> {
        self.members.values().find(|m| &m.location == wanted)
    }

    /// The provider that owns a crate (member, SDK root or SDK support crate), if any.
    pub fn provider_of(&self, crate_name: &str) -> Option<String> {
        self.owned.get(crate_name).cloned()
    }

    /// Whether a member is a provider-neutral staged crate (the framework).
    fn is_neutral_staged(&self, m: &Member) -> bool {
        m.location == Location::Staged && self.provider_of(&m.name).is_none()
    }

    fn member_package(&self, name: &str) -> Option<&Package> {
        self.metadata
            .workspace_packages()
            .into_iter()
            .find(|p| p.name.as_str() == name)
    }

    /// Direct dependencies of a member, every kind, from its manifest.
    pub fn direct_deps(&self, name: &str) -> Vec<DepEdge> {
        let Some(pkg) = self.member_package(name) else {
            return Vec::new();
        };
        pkg.dependencies
            .iter()
            .map(|d| DepEdge {
                name: d.name.clone(),
                kind: match d.kind {
                    DependencyKind::Development => "dev",
                    DependencyKind::Build => "build",
                    _ => "normal",
                },
                target: d.target.as_ref().map(|t| t.to_string()),
                optional: d.optional,
                rename: d.rename.clone(),
            })
            .collect()
    }

    /// Package ids reachable from `start` over shipped (normal and build) edges, `start`
    /// included.
    fn closure_of<'a>(&'a self, start: &[&'a PackageId]) -> BTreeSet<&'a PackageId> {
        let Some(resolve) = &self.metadata.resolve else {
            return BTreeSet::new();
        };
        let nodes: BTreeMap<&PackageId, _> = resolve.nodes.iter().map(|n| (&n.id, n)).collect();
        let mut seen: BTreeSet<&PackageId> = BTreeSet::new();
        let mut queue: VecDeque<&PackageId> = start.iter().copied().collect();
        while let Some(id) = queue.pop_front() {
            if !seen.insert(id) {
                continue;
            }
            if let Some(node) = nodes.get(id) {
                for dep in &node.deps {
                    if dep
                        .dep_kinds
                        .iter()
                        .any(|k| k.kind != DependencyKind::Development)
                    {
                        queue.push_back(&dep.pkg);
                    }
                }
            }
        }
        seen
    }

    /// The resolved closure (normal and build edges, all features) of a member, names only,
    /// itself excluded.
    pub fn closure(&self, name: &str) -> BTreeSet<String> {
        let Some(pkg) = self.member_package(name) else {
            return BTreeSet::new();
        };
        let names: BTreeMap<&PackageId, &str> = self
            .metadata
            .packages
            .iter()
            .map(|p| (&p.id, p.name.as_str()))
            .collect();
        self.closure_of(&[&pkg.id])
            .into_iter()
            .filter(|id| **id != pkg.id)
            .filter_map(|id| names.get(id).map(|n| n.to_string()))
            .collect()
    }

    /// Checks every rule and returns the violations, sorted.
    pub fn check(&self) -> Vec<Violation> {
        let mut v = Vec::new();
        self.check_layout(&mut v);
        self.check_publish(&mut v);
        self.check_external_paths(&mut v);
        self.check_staging_only(&mut v);
        self.check_neutral_isolation(&mut v);
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
                let problem = if dir.starts_with("cmd/") {
                    format!("lives in `{dir}`: a binary crate lives directly in cmd/<its name>")
                } else {
                    format!("lives in `{dir}`, outside staging/, providers/, cmd/, tests/ and hack/")
                };
                v.push(Violation {
                    rule: "layout",
                    subject: m.name.clone(),
                    problem,
                    fix: "move it into the directory that matches its role".into(),
                });
            }
        }
        for (c, ps) in &self.contested {
            v.push(Violation {
                rule: "layout",
                subject: c.clone(),
                problem: format!(
                    "is claimed by the SDKs of several providers: {}",
                    ps.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
                fix: "each cloud SDK belongs to one provider: fix the `sdk` globs in [workspace.metadata.providers]".into(),
            });
        }
    }

    fn check_publish(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            if m.publishable && !matches!(m.location, Location::Staged | Location::Legacy(_)) {
                v.push(Violation {
                    rule: "publish",
                    subject: m.name.clone(),
                    problem: format!("is publishable but lives in {}, not under staging/", m.dir),
                    fix: "only staged crates are published from this repository: set `publish = false` in its [package], or move it into staging/".into(),
                });
            }
        }
    }

    fn check_external_paths(&self, v: &mut Vec<Violation>) {
        let root = self.metadata.workspace_root.as_std_path();
        for pkg in &self.metadata.packages {
            if pkg.source.is_some() || self.members.contains_key(pkg.name.as_str()) {
                continue;
            }
            // A path crate outside the workspace: a path dependency or a [patch].
            let dir = pkg
                .manifest_path
                .parent()
                .map(|d| d.as_std_path().to_path_buf())
                .unwrap_or_default();
            let rel = pathdiff(&dir, root);
            if self
                .boundaries
                .allow_external_paths
                .iter()
                .any(|g| glob_match(g, &rel))
            {
                continue;
            }
            let users: Vec<String> = self
                .metadata
                .workspace_packages()
                .iter()
                .filter(|m| m.dependencies.iter().any(|d| d.name == pkg.name.as_str()))
                .map(|m| m.name.to_string())
                .collect();
            v.push(Violation {
                rule: "external-path",
                subject: pkg.name.to_string(),
                problem: format!(
                    "resolves to a path crate outside the workspace ({rel}) through a path dependency or a [patch]{}",
                    if users.is_empty() { String::new() } else { format!(", used by {}", users.join(", ")) }
                ),
                fix: "depend on a published version or make it a workspace member, so that the boundary rules see it (or list its directory in [workspace.metadata.boundaries] allow-external-paths)".into(),
            });
        }
    }

    fn check_staging_only(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            if !matches!(m.location, Location::Staged | Location::Legacy(_)) {
                continue;
            }
            for d in self.direct_deps(&m.name) {
                let Some(target) = self.members.get(&d.name) else {
                    continue;
                };
                if matches!(target.location, Location::Staged | Location::Legacy(_)) {
                    continue;
                }
                v.push(Violation {
                    rule: "staging-only",
                    subject: m.name.clone(),
                    problem: format!(
                        "staged crate ({}) has a {} ({}), which is not in staging/",
                        m.dir,
                        d.describe(),
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

    fn check_neutral_isolation(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            if !self.is_neutral_staged(m) {
                continue;
            }
            for d in self.direct_deps(&m.name) {
                if let Some(p) = self.provider_of(&d.name) {
                    v.push(Violation {
                        rule: "neutral-isolation",
                        subject: m.name.clone(),
                        problem: format!(
                            "provider-neutral staged crate ({}) has a {}, a crate of provider `{p}`",
                            m.dir,
                            d.describe()
                        ),
                        fix: format!(
                            "the framework knows no provider: move the code that needs {} into staging/legacy-cloud-providers/{p} or providers/{p}",
                            d.name
                        ),
                    });
                }
            }
            let mut linked: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for c in self.closure(&m.name) {
                if let Some(p) = self.provider_of(&c) {
                    linked.entry(p).or_default().push(c);
                }
            }
            for (p, crates) in linked {
                v.push(Violation {
                    rule: "neutral-isolation",
                    subject: m.name.clone(),
                    problem: format!(
                        "provider-neutral staged crate ({}) links crates of provider `{p}`: {}",
                        m.dir,
                        crates.join(", ")
                    ),
                    fix: format!(
                        "remove the dependency path to {} (`cargo tree -p {} -i {} --all-features` shows it)",
                        crates[0], m.name, crates[0]
                    ),
                });
            }
        }
    }

    fn check_provider_isolation(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            // The provider's tree crates, and SDK crates that are workspace members (vsphere-api).
            let own = match (&m.location, self.provider_of(&m.name)) {
                (Location::Provider(p) | Location::Legacy(p), _) => p.clone(),
                (Location::Staged, Some(p)) => p,
                _ => continue,
            };
            let own = &own;
            for d in self.direct_deps(&m.name) {
                if let Some(target) = self.members.get(&d.name) {
                    match target.location {
                        Location::Cmd(_) => v.push(Violation {
                            rule: "provider-isolation",
                            subject: m.name.clone(),
                            problem: format!("provider crate ({}) has a {} ({}), a binary crate", m.dir, d.describe(), target.dir),
                            fix: "binaries depend on providers, never the other way round: move the shared code into the provider or staging/".into(),
                        }),
                        Location::Internal => v.push(Violation {
                            rule: "provider-isolation",
                            subject: m.name.clone(),
                            problem: format!("provider crate ({}) has a {} ({}), a tests/ or hack/ crate", m.dir, d.describe(), target.dir),
                            fix: "test harnesses and tools depend on providers, never the other way round: move what the provider needs into it or into staging/".into(),
                        }),
                        _ => {}
                    }
                }
                if let Some(other) = self.provider_of(&d.name)
                    && &other != own
                {
                    v.push(Violation {
                        rule: "provider-isolation",
                        subject: m.name.clone(),
                        problem: format!(
                            "crate of provider `{own}` ({}) has a {}, a crate of provider `{other}`",
                            m.dir,
                            d.describe()
                        ),
                        fix: format!("providers are independent: move what both need into a provider-neutral staging/ crate and drop the dependency on {}", d.name),
                    });
                }
            }
            let mut linked: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for c in self.closure(&m.name) {
                if let Some(p) = self.provider_of(&c)
                    && &p != own
                {
                    linked.entry(p).or_default().push(c);
                }
            }
            for (p, crates) in linked {
                v.push(Violation {
                    rule: "provider-isolation",
                    subject: m.name.clone(),
                    problem: format!("crate of provider `{own}` ({}) links crates of provider `{p}`: {}", m.dir, crates.join(", ")),
                    fix: format!(
                        "providers are independent: remove the dependency path to {} (`cargo tree -p {} -i {} --all-features` shows it)",
                        crates[0], m.name, crates[0]
                    ),
                });
            }
        }
    }

    fn check_binaries(&self, v: &mut Vec<Violation>) {
        for m in self.members.values() {
            let Location::Cmd(dir) = &m.location else { continue };
            for d in self.direct_deps(&m.name) {
                if let Some(target) = self.members.get(&d.name)
                    && target.location == Location::Internal
                {
                    v.push(Violation {
                        rule: "one-provider-per-binary",
                        subject: m.name.clone(),
                        problem: format!("binary crate has a {} ({}), a tests/ or hack/ crate", d.describe(), target.dir),
                        fix: "a binary links its provider and staged crates only: move what it needs out of tests/ or hack/".into(),
                    });
                }
            }
            let Some((provider, is_ccm)) = self.provider_of_binary(&m.name) else {
                v.push(Violation {
                    rule: "one-provider-per-binary",
                    subject: m.name.clone(),
                    problem: format!(
                        "binary crate in cmd/{dir} is not named {BINARY_PREFIX}<provider> and no provider lists it in `binaries`"
                    ),
                    fix: format!(
                        "name it {BINARY_PREFIX}<provider> after the one provider it links, or add it to that provider's `binaries` in [workspace.metadata.providers]"
                    ),
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
            if !self.providers.contains_key(&provider) {
                v.push(Violation {
                    rule: "one-provider-per-binary",
                    subject: m.name.clone(),
                    problem: format!("is named after provider `{provider}`, which [workspace.metadata.providers] does not declare"),
                    fix: format!("declare `{provider}` with its phase, or rename the binary after its provider"),
                });
                continue;
            }
            for d in self.direct_deps(&m.name) {
                if d.kind != "dev" {
                    continue; // normal and build edges are in the closure below
                }
                if let Some(p) = self.provider_of(&d.name)
                    && p != provider
                {
                    v.push(Violation {
                        rule: "one-provider-per-binary",
                        subject: m.name.clone(),
                        problem: format!(
                            "binary of provider `{provider}` has a {}, a crate of provider `{p}`",
                            d.describe()
                        ),
                        fix: format!(
                            "its tests use its own provider only: drop the dependency on {}",
                            d.name
                        ),
                    });
                }
            }
            let closure = self.closure(&m.name);
            let own_crate = self.member_of_location(&Location::Provider(provider.to_string()));
            match own_crate {
                // A provider's other binaries need not link its CCM crate.
                _ if !is_ccm => {}
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
                        "a binary links exactly one provider: remove the dependency path to {} (`cargo tree -p {} -i {} --all-features` shows it)",
                        crates[0], m.name, crates[0]
                    ),
                });
            }
        }
    }

    /// The provider of the `cmd/` binary `name` and whether it is that provider's
    /// cloud-controller-manager (`cloud-controller-manager-<p>`) rather than one of the other
    /// binaries its declaration lists in `binaries`. None: neither.
    fn provider_of_binary(&self, name: &str) -> Option<(String, bool)> {
        if let Some(p) = name.strip_prefix(BINARY_PREFIX) {
            return Some((p.to_string(), true));
        }
        self.providers
            .iter()
            .find(|(_, d)| d.binaries.iter().any(|b| b == name))
            .map(|(p, _)| (p.clone(), false))
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
                    for b in &decl.binaries {
                        want(
                            !self.members.contains_key(b),
                            format!("phase 1 has no binary, but cmd/{b} exists"),
                            "declare phase 2, or remove the binary".into(),
                        );
                    }
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
                        for d in self.direct_deps(&m.name) {
                            if self.provider_of(&d.name).as_deref() == Some(p.as_str()) {
                                want(
                                    false,
                                    format!(
                                        "phase 3 means nothing in staging/ names the provider, but {} ({}) depends on {}",
                                        m.name, m.dir, d.name
                                    ),
                                    format!("drop {} from {}", d.name, m.name),
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

    /// One line per binary: provider, phase, number of crates linked, the provider-owned crates
    /// it links (its tree crates and its SDK's closure), crates of other providers (there must
    /// be none), and the crates it shares with another provider's binary that the framework
    /// does not link (neutral by construction: owned by no provider).
    pub fn report(&self) -> Vec<String> {
        let binaries: Vec<&Member> = self
            .members
            .values()
            .filter(|m| matches!(m.location, Location::Cmd(_)))
            .collect();
        let framework: BTreeSet<String> = self
            .members
            .values()
            .filter(|m| self.is_neutral_staged(m))
            .flat_map(|m| {
                let mut c = self.closure(&m.name);
                c.insert(m.name.clone());
                c
            })
            .collect();
        let mut lines = Vec::new();
        for m in &binaries {
            let provider = self.provider_of_binary(&m.name).map(|(p, _)| p);
            let provider = provider.as_deref().unwrap_or("?");
            let phase = self
                .providers
                .get(provider)
                .map(|d| d.phase.to_string())
                .unwrap_or_else(|| "undeclared".into());
            let closure = self.closure(&m.name);
            let own: Vec<String> = closure
                .iter()
                .filter(|c| self.provider_of(c).as_deref() == Some(provider))
                .cloned()
                .collect();
            let foreign: Vec<String> = closure
                .iter()
                .filter(|c| self.provider_of(c).is_some_and(|p| p != provider))
                .cloned()
                .collect();
            let mut shared: BTreeSet<String> = BTreeSet::new();
            for other in &binaries {
                if other.name == m.name {
                    continue;
                }
                let theirs = self.closure(&other.name);
                shared.extend(
                    closure
                        .iter()
                        .filter(|c| theirs.contains(*c) && !framework.contains(*c))
                        .cloned(),
                );
            }
            lines.push(format!(
                "{:<34} provider={:<8} phase={} crates-linked={:<4} provider-owned={}:[{}] other-provider-crates=[{}] shared-with-other-providers-outside-the-framework=[{}]",
                m.name,
                provider,
                phase,
                closure.len(),
                own.len(),
                own.join(","),
                foreign.join(","),
                shared.into_iter().collect::<Vec<_>>().join(",")
            ));
        }
        lines
    }
}

/// `path` relative to `base` when inside it, else `../…` steps (both absolute).
fn pathdiff(path: &Path, base: &Path) -> String {
    let p: Vec<_> = path.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut parts: Vec<String> = std::iter::repeat_n("..".to_string(), b.len() - common).collect();
    parts.extend(
        p[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().to_string()),
    );
    parts.join("/")
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
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("aws-sdk-*", "aws-sdk-ec2"));
        assert!(glob_match("aws-config", "aws-config"));
        assert!(!glob_match("aws-config", "aws-config-x"));
        assert!(!glob_match("aws-sdk-*", "aws-smithy-types"));
        assert!(glob_match("*-api", "vsphere-api"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
        assert!(glob_match("../ext/*", "../ext/aws-sdk-ec2"));
    }

    #[test]
    fn locations_include_nested_provider_crates() {
        assert_eq!(
            classify("staging/legacy-cloud-providers/aws/lb"),
            Location::Legacy("aws".into())
        );
        assert_eq!(
            classify("providers/vsphere/sub/x"),
            Location::Provider("vsphere".into())
        );
        assert_eq!(classify("cmd/a/b"), Location::Other("cmd/a/b".into()));
        assert_eq!(classify("staging/cloud-provider"), Location::Staged);
    }

    #[test]
    fn relative_paths_and_repositories() {
        assert_eq!(
            pathdiff(Path::new("/t/ext/sdk"), Path::new("/t/ws")),
            "../ext/sdk"
        );
        assert_eq!(pathdiff(Path::new("/t/ws/a"), Path::new("/t/ws")), "a");
        assert_eq!(
            normalize_repository("https://github.com/Smithy-Lang/smithy-rs.git/"),
            "https://github.com/smithy-lang/smithy-rs"
        );
    }
}
