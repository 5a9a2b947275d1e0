//! The `orphans` command of a provider, written once: what every provider's `orphans` does the
//! same way (list the cluster's Services, find what the cloud holds for the cluster that no
//! Service wants, print it, and with `--delete` ask, then delete each after reading everything
//! again), around what only the provider knows ([`OrphanFinder`]).
//!
//! The rules every provider gets from here:
//! - nothing is listed without the Services: when they cannot be read, the command fails;
//! - the Services are listed before **and after** the cloud's resources, and the search is
//!   repeated while they changed meanwhile (a load balancer made for a Service created during
//!   the listing is then wanted); after 5 changes in a row nothing is listed;
//! - the whole listing has a deadline (`--list-timeout`): past it nothing is listed or deleted;
//! - `--delete` first has the provider check that the kubeconfig's cluster is the cloud
//!   config's ([`OrphanFinder::verify_cluster`]); otherwise nothing is deleted;
//! - the confirmation prompt waits `--prompt-timeout` at most (nothing is deleted then), unless
//!   `--yes`;
//! - right before each deletion the Services are listed again; when any changed the orphans
//!   are found again, and one that is no longer an orphan is kept.
//!
//! Exit status (of [`run`]'s `Ok(true)` / `Ok(false)` / `Err`): 0 when the listing (and every
//! deletion) succeeded, 1 otherwise.

use std::{io::Write, time::Duration};

use clap::{ArgAction, Args, ValueEnum};
use k8s_openapi::api::core::v1::Service;
use kube::{Api, api::ListParams};

/// One orphan as the command prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrphanRow {
    /// Its kind (`load-balancer`, `security-group`, …).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// The cloud's ID of it.
    pub id: String,
    /// The Service (or Node) it was made for, as its tags or name say.
    pub owner: String,
    /// Why it is an orphan.
    pub reason: String,
}

impl OrphanRow {
    /// A row.
    pub fn new(
        kind: impl Into<String>,
        name: impl Into<String>,
        id: impl Into<String>,
        owner: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            kind: kind.into(),
            name: name.into(),
            id: id.into(),
            owner: owner.into(),
            reason: reason.into(),
        }
    }
}

/// How the orphans are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OrphansOutput {
    /// Aligned columns with a header.
    Table,
    /// One tab-separated line per orphan, no header (kind, name, ID, owner, reason).
    Tsv,
}

/// The flags every provider's `orphans` command takes (flatten them into the provider's own).
#[derive(Debug, Clone, Args)]
pub struct OrphansRunFlags {
    /// Delete the orphans (asks for confirmation on the terminal unless --yes).
    #[arg(long = "delete", action = ArgAction::SetTrue)]
    pub delete: bool,
    /// Do not ask before deleting.
    #[arg(long = "yes", short = 'y', action = ArgAction::SetTrue)]
    pub yes: bool,
    /// How long the confirmation prompt of --delete waits for an answer (a Go duration); with
    /// no answer by then nothing is deleted. What is listed ages while the prompt waits.
    #[arg(long = "prompt-timeout", default_value = "2m", value_parser = parse_duration)]
    pub prompt_timeout: Duration,
    /// How long the listing (the cluster's Services and the cloud's resources) may take at most
    /// (a Go duration); past it nothing is listed or deleted.
    #[arg(long = "list-timeout", default_value = "5m", value_parser = parse_duration)]
    pub list_timeout: Duration,
    /// How the orphans are printed: table, or tsv (tab-separated, for scripts).
    #[arg(long = "output", short = 'o', value_enum, default_value = "table")]
    pub output: OrphansOutput,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    k8s_controller_manager::duration::parse_go_duration(s)
}

/// What only the provider knows: its cluster check, its orphans, how to delete one. Errors are
/// the text printed to the user.
#[crate::async_trait]
pub trait OrphanFinder: Send + Sync {
    /// The provider's orphan.
    type Orphan: Clone + Send + Sync;

    /// How the orphan is printed; `kind` and `id` also identify it when it is found again.
    fn row(&self, orphan: &Self::Orphan) -> OrphanRow;

    /// What deleting the orphan does, for the plan printed before the prompt.
    fn plan_step(&self, orphan: &Self::Orphan) -> String;

    /// What is printed when there is no orphan.
    fn nothing_found(&self) -> String {
        "No orphans: everything this cluster made in the cloud is in use or wanted by a Service.".into()
    }

    /// Before `--delete` lists anything: that the kubeconfig's cluster is the cloud config's
    /// (what was checked, printed after "Same cluster: "), or why not (nothing is deleted).
    async fn verify_cluster(&self) -> Result<String, String>;

    /// The orphans, given every Service of the cluster, in the order they are to be deleted.
    async fn find(&self, services: &[Service]) -> Result<Vec<Self::Orphan>, String>;

    /// Deletes one orphan (read again by the provider first), given the Services as they are
    /// right now.
    async fn delete(&self, orphan: &Self::Orphan, services: &[Service]) -> Result<(), String>;
}

/// What a listing of Services was: each Service's UID and resource version.
type ServicesSeen = std::collections::BTreeSet<(String, String)>;

fn services_seen(services: &[Service]) -> ServicesSeen {
    services
        .iter()
        .map(|s| {
            (
                s.metadata.uid.clone().unwrap_or_default(),
                s.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Every Service of the cluster.
pub async fn list_services(client: &kube::Client) -> Result<Vec<Service>, String> {
    Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| {
            format!("listing the cluster's Services (nothing is listed or deleted without them): {e}")
        })
}

/// The orphans with the Services they were found against, found while the Services held still
/// (see the module docs).
async fn find_stable<F: OrphanFinder>(
    finder: &F,
    client: &kube::Client,
) -> Result<(Vec<F::Orphan>, Vec<Service>), String> {
    let mut services = list_services(client).await?;
    for _ in 0..5 {
        let found = finder.find(&services).await?;
        let again = list_services(client).await?;
        if services_seen(&again) == services_seen(&services) {
            return Ok((found, again));
        }
        services = again;
    }
    Err("the cluster's Services kept changing while the cloud's resources were listed (5 times); nothing is listed or deleted, try again".into())
}

/// [`find_stable`] within `deadline`.
async fn find_within<F: OrphanFinder>(
    finder: &F,
    client: &kube::Client,
    deadline: Duration,
) -> Result<(Vec<F::Orphan>, Vec<Service>), String> {
    tokio::time::timeout(deadline, find_stable(finder, client))
        .await
        .map_err(|_| {
            format!(
                "the listing took longer than --list-timeout={}; nothing is listed or deleted",
                k8s_controller_manager::duration::format_go_duration(deadline)
            )
        })?
}

/// The orphans as a table (a header, aligned columns, the reason last) or tab-separated lines.
pub fn render(rows: &[OrphanRow], output: OrphansOutput) -> String {
    let cells = |r: &OrphanRow| {
        [
            r.kind.clone(),
            r.name.clone(),
            r.id.clone(),
            r.owner.clone(),
            r.reason.clone(),
        ]
    };
    if output == OrphansOutput::Tsv {
        return rows
            .iter()
            .map(|r| format!("{}\n", cells(r).join("\t")))
            .collect();
    }
    let rows: Vec<[String; 5]> = rows.iter().map(cells).collect();
    let header = ["KIND", "NAME", "ID", "OWNER", "REASON"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| if i == 4 { c.clone() } else { format!("{c:<w$}") })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Asks for confirmation on the terminal, waiting `timeout` at most: `Ok(true)` for yes.
async fn confirm(count: usize, timeout: Duration) -> Result<bool, String> {
    print!("Delete these {count} resources? [y/N] ");
    let _ = std::io::stdout().flush();
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A thread of its own: a blocking read of the terminal, abandoned when the time is up.
    std::thread::spawn(move || {
        let mut answer = String::new();
        let _ = tx.send(std::io::stdin().read_line(&mut answer).map(|_| answer));
    });
    match tokio::time::timeout(timeout, rx).await {
        Err(_) => Err(format!(
            "no answer within --prompt-timeout={}; nothing is deleted",
            k8s_controller_manager::duration::format_go_duration(timeout)
        )),
        Ok(Err(_)) => Err("reading the confirmation failed; nothing is deleted".into()),
        Ok(Ok(Err(e))) => Err(format!("reading the confirmation: {e}; nothing is deleted")),
        Ok(Ok(Ok(answer))) => Ok(matches!(answer.trim(), "y" | "Y" | "yes")),
    }
}

/// Runs the command (see the module docs): `Ok(true)` when the listing (and every deletion)
/// succeeded, `Ok(false)` when a deletion failed, `Err` with the reason when nothing could be
/// done.
pub async fn run<F: OrphanFinder>(
    finder: &F,
    client: &kube::Client,
    flags: &OrphansRunFlags,
) -> Result<bool, String> {
    if flags.delete {
        let checked = finder.verify_cluster().await?;
        println!("Same cluster: {checked}.");
    }
    let (mut found, mut services) = find_within(finder, client, flags.list_timeout).await?;
    if found.is_empty() {
        println!("{}", finder.nothing_found());
        return Ok(true);
    }
    let listed = found.clone();
    let rows: Vec<OrphanRow> = listed.iter().map(|o| finder.row(o)).collect();
    print!("{}", render(&rows, flags.output));
    if !flags.delete {
        println!(
            "{} orphan(s). Run again with --delete to delete them.",
            listed.len()
        );
        return Ok(true);
    }
    let mut plan = String::from("Deletion plan (each is read again just before it is deleted):\n");
    for (n, (o, r)) in listed.iter().zip(&rows).enumerate() {
        plan.push_str(&format!(
            "{:>3}. {} {} ({}): {}\n",
            n + 1,
            r.kind,
            r.name,
            r.id,
            finder.plan_step(o)
        ));
    }
    print!("{plan}");
    if !flags.yes && !confirm(listed.len(), flags.prompt_timeout).await? {
        println!("Nothing deleted.");
        return Ok(true);
    }
    let mut ok = true;
    for (o, row) in listed.iter().zip(&rows) {
        // The Services again: when any changed since the orphans were found, they are found
        // again, and one that is no longer an orphan is kept.
        let now = list_services(client).await?;
        if services_seen(&now) != services_seen(&services) {
            (found, services) = find_within(finder, client, flags.list_timeout).await?;
        } else {
            services = now;
        }
        if !found.iter().any(|f| {
            let f = finder.row(f);
            f.kind == row.kind && f.id == row.id
        }) {
            println!(
                "not deleted {} {} ({}): not found as an orphan again after the cluster's Services changed (gone already, or wanted again)",
                row.kind, row.name, row.id
            );
            continue;
        }
        match finder.delete(o, &services).await {
            Ok(()) => println!("deleted {} {} ({})", row.kind, row.name, row.id),
            Err(e) => {
                ok = false;
                println!("FAILED to delete {} {} ({}): {e}", row.kind, row.name, row.id);
            }
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_render_as_a_table_or_tab_separated() {
        let rows = [
            OrphanRow::new(
                "load-balancer",
                "lb-1",
                "id-1",
                "default/a",
                "no Service wants it",
            ),
            OrphanRow::new(
                "security-group",
                "sg",
                "sg-2",
                "default/bb",
                "its load balancer is gone",
            ),
        ];
        assert_eq!(
            render(&rows, OrphansOutput::Table),
            "KIND            NAME  ID    OWNER       REASON\n\
             load-balancer   lb-1  id-1  default/a   no Service wants it\n\
             security-group  sg    sg-2  default/bb  its load balancer is gone\n"
        );
        assert_eq!(
            render(&rows[..1], OrphansOutput::Tsv),
            "load-balancer\tlb-1\tid-1\tdefault/a\tno Service wants it\n"
        );
    }
}
