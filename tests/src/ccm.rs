//! A cloud-controller-manager binary of this workspace running as a real process against a
//! [`crate::TestCluster`], with helpers to read its HTTPS endpoints.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, bail};
use nix::sys::signal::Signal;

use crate::{
    paths,
    process::{ManagedProcess, free_port},
};

/// A running CCM process.
pub struct CcmProcess {
    process: ManagedProcess,
    port: u16,
    http: reqwest::Client,
    bearer: Option<String>,
    name: String,
}

impl std::fmt::Debug for CcmProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CcmProcess")
            .field("name", &self.name)
            .field("port", &self.port)
            .finish()
    }
}

impl CcmProcess {
    /// Starts `binary` (a workspace binary name) with `--kubeconfig`, a free `--secure-port` on
    /// 127.0.0.1, and `args`. Its log goes to `dir/<name>.log`.
    ///
    /// The secure port's delegated authentication and authorization use the same kubeconfig
    /// (`--authentication-kubeconfig`, `--authorization-kubeconfig`) unless `args` name them,
    /// and [`CcmProcess::get`] sends the cluster's admin token (read from `dir/tokens.csv`, the
    /// [`crate::TestCluster`]'s directory) so that `/metrics` answers.
    pub fn start(binary: &str, name: &str, kubeconfig: &Path, dir: &Path, args: &[String]) -> Result<Self> {
        Self::start_with_env(binary, name, kubeconfig, dir, args, &[])
    }

    /// As [`CcmProcess::start`], with extra environment variables.
    pub fn start_with_env(
        binary: &str,
        name: &str,
        kubeconfig: &Path,
        dir: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let bin = paths::workspace_binary(binary)?;
        Self::start_binary(&bin, name, kubeconfig, dir, args, env)
    }

    /// As [`CcmProcess::start_with_env`], for a cloud-controller-manager binary at `bin` (one
    /// not built from this workspace, e.g. the sample provider built from published crates).
    pub fn start_binary(
        bin: &Path,
        name: &str,
        kubeconfig: &Path,
        dir: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        crate::init();
        // A `--secure-port=N` among `args` is kept (two processes sharing one port); otherwise
        // a free port is chosen.
        let given = args.iter().find_map(|a| a.strip_prefix("--secure-port="));
        let port = match given {
            Some(p) => p.parse().with_context(|| format!("--secure-port={p}"))?,
            None => free_port(),
        };
        let mut all = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".to_string(),
        ];
        if given.is_none() {
            all.push(format!("--secure-port={port}"));
        }
        for flag in ["--authentication-kubeconfig", "--authorization-kubeconfig"] {
            if !args.iter().any(|a| a.starts_with(flag)) {
                all.push(format!("{flag}={}", kubeconfig.display()));
            }
        }
        all.extend(args.iter().cloned());
        let bearer = std::fs::read_to_string(dir.join("tokens.csv"))
            .ok()
            .and_then(|t| t.split(',').next().map(str::to_string));
        let process = ManagedProcess::spawn(
            name,
            bin,
            &all,
            &std::iter::once((
                "RUST_LOG".to_string(),
                "info,k8s_cloud_provider=debug".to_string(),
            ))
            .chain(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect::<Vec<_>>(),
            &dir.join(format!("{name}.log")),
            Signal::SIGTERM,
        )?;
        let http = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            process,
            port,
            http,
            bearer,
            name: name.to_string(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Peak resident memory (`VmHWM` of `/proc/<pid>/status`), in kB.
    pub fn peak_rss_kb(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// The value of a metric as [`CcmProcess::metric_value`], from a `/metrics` that was read:
    /// tried up to 20 times over ~10 s (a fault proxy, a busy API server reviewing the token),
    /// an error when it never answers. For checks where 0 is the finding ("no panic"), which a
    /// failed read must never pass for.
    pub async fn metric_value_read(&self, line_prefix: &str) -> Result<f64> {
        let mut last = None;
        for _ in 0..20 {
            match self.metrics().await {
                Ok(m) => {
                    return Ok(m
                        .lines()
                        .filter(|l| l.starts_with(line_prefix))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no attempt")))
            .with_context(|| format!("reading {line_prefix} from /metrics of {}", self.name))
    }

    /// The value of a counter or histogram `_count` line of `/metrics` (0 when absent).
    pub async fn metric_value(&self, line_prefix: &str) -> f64 {
        let Ok(m) = self.metrics().await else { return 0.0 };
        m.lines()
            .filter(|l| l.starts_with(line_prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The sum of the `/metrics` samples whose line contains every one of `parts` (e.g.
    /// `["controller_reconcile_total{", "controller=\"service-lb-controller\"", "result=\"error\""]`);
    /// 0 when none does.
    pub async fn metric_sum(&self, parts: &[&str]) -> f64 {
        let Ok(m) = self.metrics().await else { return 0.0 };
        m.lines()
            .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until the service-lb controller counts `n` successful reconciles.
    pub async fn wait_service_reconciles(&self, n: f64, timeout: Duration) -> Result<()> {
        crate::k8s::wait_for("the service-lb reconciles", timeout, || async {
            let done = self
                .metric_sum(&[
                    "controller_reconcile_total{",
                    "controller=\"service-lb-controller\"",
                    "result=\"success\"",
                ])
                .await;
            (done >= n).then_some(())
        })
        .await
    }

    /// The `--secure-port`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// GET `https://127.0.0.1:<port><path>` as the cluster admin: `(status, body)`.
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        self.get_with(path, self.bearer.as_deref()).await
    }

    /// GET `https://127.0.0.1:<port><path>` with `bearer` as the token (none: anonymous).
    pub async fn get_with(&self, path: &str, bearer: Option<&str>) -> Result<(u16, String)> {
        let mut request = self.http.get(format!("https://127.0.0.1:{}{path}", self.port));
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let r = request
            .send()
            .await
            .with_context(|| format!("GET {path} on {}", self.name))?;
        Ok((r.status().as_u16(), r.text().await?))
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        let (status, body) = self.get("/metrics").await?;
        if status != 200 {
            bail!("/metrics answered {status}");
        }
        Ok(body)
    }

    /// Whether `/metrics` says this process leads `lease` (`leader_election_master_status`); an
    /// error when `/metrics` cannot be read.
    pub async fn is_leader(&self, lease: &str) -> Result<bool> {
        let m = self.metrics().await?;
        Ok(m.contains(&format!("leader_election_master_status{{name=\"{lease}\"}} 1")))
    }

    /// Whether `/metrics` says the controller (legacy name) runs here; an error when `/metrics`
    /// cannot be read (never a "no" that is only a failed read).
    pub async fn runs_controller(&self, legacy_name: &str) -> Result<bool> {
        let m = self.metrics().await?;
        Ok(m.contains(&format!(
            "running_managed_controllers{{manager=\"cloud-controller-manager\",name=\"{legacy_name}\"}} 1"
        )))
    }

    /// The process log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Sends a signal (e.g. SIGKILL, SIGTERM).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        self.process.signal(signal)
    }

    /// Waits for the process to exit; its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>> {
        self.process.wait_exit(timeout)
    }

    /// Fails if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.process.check_running()
    }
}

impl Drop for CcmProcess {
    /// Searches the process's whole log for the registered secrets (see [`crate::secrets`]).
    fn drop(&mut self) {
        crate::secrets::assert_none_in(&format!("the log of {}", self.name), &self.log());
    }
}

/// Runs `binary` with `args` to completion (no cluster needed for flag errors): `(code, stdout, stderr)`.
pub fn run_to_exit(binary: &str, args: &[&str]) -> Result<(i32, String, String)> {
    run_to_exit_with_env(binary, args, &[])
}

/// [`run_to_exit`] with extra environment variables.
pub fn run_to_exit_with_env(
    binary: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<(i32, String, String)> {
    let bin = paths::workspace_binary(binary)?;
    let out = std::process::Command::new(bin)
        .args(args)
        .env("RUST_LOG", "off")
        .envs(env.iter().copied())
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    ))
}

/// `RUST_LOG` for a CCM whose writes are to be read with [`logged_writes`].
pub const LOG_WRITES: &str = "info,k8s_cloud_provider=debug,k8s_controller_manager::writes=debug";

/// `(controller, action, object, dry run)` of every write line of a JSON log
/// (`--logging-format=json`, with [`LOG_WRITES`]): the writes made (`write`, debug) and the ones
/// a `--dry-run` process announced (`dry run: would write`). Events are `record events` in
/// their namespace (their names are made of a timestamp; a repeat patches or creates).
pub fn logged_writes(log: &str) -> Vec<(String, String, String, bool)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let f = &v["fields"];
            let message = f["message"].as_str()?;
            if message != "write" && message != "dry run: would write" {
                return None;
            }
            let controller = f["controller"].as_str()?.to_string();
            let mut action = f["action"].as_str()?.to_string();
            let mut object = f["object"].as_str()?.to_string();
            if controller == "events" {
                // Event names are made of a timestamp, and whether a repeat patches the first
                // event or creates one depends on timing: compare the namespace recorded into.
                object = object.split('/').next().unwrap_or_default().to_string();
                action = "record events".into();
            }
            Some((controller, action, object, f["dry_run"].as_bool()?))
        })
        .collect()
}
