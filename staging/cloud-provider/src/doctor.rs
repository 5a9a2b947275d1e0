//! Pre-flight checks (`<binary> doctor`): what a provider's `doctor` command reports, one
//! [`Check`] per line with a fix for each failure, and the checks every provider shares — the
//! API server is reachable and the credentials the CCM would use may do everything the
//! controllers do ([`rbac_checks`], SelfSubjectAccessReview per verb).

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Fine.
    Pass,
    /// Wrong; the CCM would fail or misbehave (counted in the exit code).
    Fail,
    /// Worth a look, or could not be told (not counted).
    Warn,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pass => "ok",
            Self::Fail => "FAIL",
            Self::Warn => "warn",
        })
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked (e.g. `credentials`, `rbac: patch nodes`).
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
    /// What was found, and for a failure how to fix it.
    pub detail: String,
}

impl Check {
    /// A passed check.
    pub fn pass(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Pass,
            detail: detail.into(),
        }
    }

    /// A failed check; `detail` says what is wrong and how to fix it.
    pub fn fail(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Fail,
            detail: detail.into(),
        }
    }

    /// A warning.
    pub fn warn(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Warn,
            detail: detail.into(),
        }
    }
}

/// The report as a table (`CHECK  RESULT  DETAIL`), one line per check.
pub fn table(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0).max(5);
    let mut out = format!("{:<width$}  {:<6}  DETAIL\n", "CHECK", "RESULT");
    for c in checks {
        out.push_str(&format!(
            "{:<width$}  {:<6}  {}\n",
            c.name,
            c.outcome.to_string(),
            c.detail
        ));
    }
    out
}

/// The number of failed checks, as an exit code (at most 255).
pub fn exit_code(checks: &[Check]) -> u8 {
    u8::try_from(checks.iter().filter(|c| c.outcome == Outcome::Fail).count()).unwrap_or(u8::MAX)
}

/// The flags of every provider's `doctor` command: the CCM's access flags and the namespace
/// of its leader-election Lease.
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorFlags {
    /// Cluster and cloud access.
    #[command(flatten)]
    pub access: crate::app::ClusterAccessFlags,
    /// The namespace of the leader-election Lease (the CCM's --leader-elect-resource-namespace).
    #[arg(long = "leader-elect-resource-namespace", default_value = "kube-system")]
    pub lease_namespace: String,
}

/// What the cluster half of a `doctor` found: its checks (API server, RBAC), and the Nodes to
/// look up in the cloud (none when the API server could not be reached).
#[derive(Default)]
pub struct ClusterFindings {
    /// The API server and RBAC checks.
    pub checks: Vec<Check>,
    /// A client with the CCM's credentials (for a provider that reads a Secret).
    pub client: Option<Client>,
    /// Every Node of the cluster.
    pub nodes: Vec<k8s_openapi::api::core::v1::Node>,
}

impl std::fmt::Debug for ClusterFindings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterFindings")
            .field("checks", &self.checks)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

/// The cluster half of a provider's `doctor`: a client from `flags` (user agent `user_agent`),
/// the API server and RBAC checks of [`CONTROLLER_MANAGER_ACCESS`], and the Nodes.
pub async fn cluster_findings(flags: &DoctorFlags, user_agent: &str) -> ClusterFindings {
    let mut found = ClusterFindings::default();
    match flags.access.kube_client(user_agent).await {
        Ok(client) => {
            found
                .checks
                .extend(rbac_checks(&client, CONTROLLER_MANAGER_ACCESS, &flags.lease_namespace).await);
            if let Ok(list) = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
                .list(&ListParams::default())
                .await
            {
                found.nodes = list.items;
            }
            found.client = Some(client);
        }
        Err(e) => found.checks.push(Check::fail(
            "api server",
            format!("{e} (fix: --kubeconfig / --master)"),
        )),
    }
    found
}

/// Runs a provider's `doctor` for the command line `matches`: parses [`DoctorFlags`], runs
/// `checks`, prints the table and a summary line; the exit code is the number of failures.
pub async fn run_command<F, Fut>(matches: clap::ArgMatches, checks: F) -> std::process::ExitCode
where
    F: FnOnce(DoctorFlags) -> Fut,
    Fut: std::future::Future<Output = Vec<Check>>,
{
    use clap::FromArgMatches as _;
    let flags = match DoctorFlags::from_arg_matches(&matches) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let checks = checks(flags).await;
    print!("{}", table(&checks));
    let failures = exit_code(&checks);
    println!("{} check(s), {failures} failure(s).", checks.len());
    std::process::ExitCode::from(failures)
}

/// `(API group, resource, verb)` of every request the framework's controllers, leader election
/// and secure port make (`deploy/common/rbac.yaml`).
pub const CONTROLLER_MANAGER_ACCESS: &[(&str, &str, &str)] = &[
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "nodes", "update"),
    ("", "nodes", "patch"),
    ("", "nodes", "delete"),
    ("", "nodes/status", "patch"),
    ("", "services", "get"),
    ("", "services", "list"),
    ("", "services", "watch"),
    ("", "services", "patch"),
    ("", "services/status", "patch"),
    ("", "events", "create"),
    ("", "events", "patch"),
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
];

/// Checks that the API server answers (a Node list) and, with one SelfSubjectAccessReview
/// each, that the client may make every request of `access` (leases in `lease_namespace`).
pub async fn rbac_checks(
    client: &Client,
    access: &[(&str, &str, &str)],
    lease_namespace: &str,
) -> Vec<Check> {
    let mut checks = Vec::new();
    match Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
    {
        Ok(_) => checks.push(Check::pass("api server", "reachable; Nodes can be listed")),
        Err(e) => {
            checks.push(Check::fail(
                "api server",
                format!("listing Nodes failed: {e} (fix: --kubeconfig / --master, network, credentials)"),
            ));
            return checks;
        }
    }
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for (group, resource, verb) in access {
        let (resource_name, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (*resource, None),
        };
        let name = format!("rbac: {verb} {resource}");
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.to_string()),
                    resource: Some(resource_name.to_string()),
                    subresource,
                    verb: Some(verb.to_string()),
                    namespace: (*resource == "leases").then(|| lease_namespace.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let group_text = if group.is_empty() { "\"\"" } else { group };
        match reviews.create(&PostParams::default(), &review).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => checks.push(Check::pass(name, "allowed")),
            Ok(r) => checks.push(Check::fail(
                name,
                format!(
                    "denied{} (fix: grant apiGroups [{group_text}] resources [{resource}] verbs [{verb}], see deploy/common/rbac.yaml)",
                    r.status
                        .and_then(|s| s.reason)
                        .filter(|r| !r.is_empty())
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                ),
            )),
            Err(e) => checks.push(Check::warn(name, format!("could not ask the API server: {e}"))),
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_counts_failures_only() {
        let checks = [
            Check::pass("a", "fine"),
            Check::fail("b", "broken"),
            Check::warn("c", "odd"),
            Check::fail("d", "broken too"),
        ];
        assert_eq!(exit_code(&checks), 2);
        let t = table(&checks);
        assert!(t.starts_with("CHECK  RESULT  DETAIL\n"), "{t}");
        assert!(t.contains("b      FAIL    broken\n"), "{t}");
    }
}
