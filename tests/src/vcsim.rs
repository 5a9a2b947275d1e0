//! `Vcsim`: govmomi's vCenter simulator on a random port of 127.0.0.1.

use std::{process::Command, time::Duration};

use anyhow::{Context, Result, bail};
use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::{paths, process::ManagedProcess};

/// A running vcsim. SOAP login enforces [`Vcsim::username`]/[`Vcsim::password`]; its TLS
/// certificate is self-signed.
pub struct Vcsim {
    process: ManagedProcess,
    host_port: String,
    username: String,
    password: String,
    _dir: TempDir,
}

impl std::fmt::Debug for Vcsim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vcsim")
            .field("host_port", &self.host_port)
            .finish_non_exhaustive()
    }
}

/// The name of model VM `i` of the first cluster of `DC0` (`DC0_C0_RP0_VM<i>`).
pub fn vm_name(i: usize) -> String {
    format!("DC0_C0_RP0_VM{i}")
}

/// A model with `vms` VMs on one cluster of 2 hosts.
pub fn small_model(vms: usize) -> VcsimModel {
    VcsimModel {
        vms,
        hosts: 2,
        standalone_hosts: 0,
        clusters: 1,
        extra_args: Vec::new(),
    }
}

/// The inventory vcsim builds.
#[derive(Debug, Clone)]
pub struct VcsimModel {
    /// VMs per host/cluster (`-vm`).
    pub vms: usize,
    /// Hosts per cluster (`-host`).
    pub hosts: usize,
    /// Standalone hosts (`-standalone-host`).
    pub standalone_hosts: usize,
    /// Clusters per datacenter (`-cluster`).
    pub clusters: usize,
    /// Extra command-line flags.
    pub extra_args: Vec<String>,
}

impl Default for VcsimModel {
    fn default() -> Self {
        Self {
            vms: 2,
            hosts: 3,
            standalone_hosts: 0,
            clusters: 1,
            extra_args: Vec::new(),
        }
    }
}

impl Vcsim {
    /// Starts vcsim with the default model (1 datacenter, 1 cluster of 3 hosts, 2 VMs).
    pub fn start() -> Result<Self> {
        Self::start_with(VcsimModel::default())
    }

    /// Starts vcsim with `model` and waits until it prints its URL.
    pub fn start_with(model: VcsimModel) -> Result<Self> {
        Self::start_on("127.0.0.1:0", model, None)
    }

    /// Starts vcsim again on this one's address, with the same credentials (a "vCenter
    /// restart": every session is lost).
    pub fn restart(&mut self, model: VcsimModel) -> Result<()> {
        let password = self.password.clone();
        self.restart_with_password(model, &password)
    }

    /// Starts vcsim again on this one's address with a new password (a rotated vCenter
    /// password: every session is lost, the old password is refused).
    pub fn restart_with_password(&mut self, model: VcsimModel, password: &str) -> Result<()> {
        self.process.stop();
        let again = Self::start_on(
            &self.host_port,
            model,
            Some((self.username.clone(), password.to_string())),
        )?;
        *self = again;
        Ok(())
    }

    /// The TLS certificate and key (PEM) vcsim serves, e.g. for a proxy in front of it.
    pub fn tls_files(&self) -> (std::path::PathBuf, std::path::PathBuf) {
        (
            self._dir.path().join("vcsim.crt"),
            self._dir.path().join("vcsim.key"),
        )
    }

    /// SOAP sessions vcsim holds whose user agent is `agent` (`govc session.ls`).
    pub fn sessions_of(&self, agent: &str) -> Result<usize> {
        let out = self.govc(&["session.ls", "-json"])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        Ok(v["SessionList"]
            .as_array()
            .map(|a| a.iter().filter(|s| s["UserAgent"] == agent).count())
            .unwrap_or(0))
    }

    /// The managed object ID of a VM (`vm-54`).
    pub fn vm_moref(&self, vm: &str) -> Result<String> {
        let out = self.govc(&["ls", "-i", &format!("/DC0/vm/{vm}")])?;
        out.trim()
            .rsplit(':')
            .next()
            .map(str::to_string)
            .filter(|s| !s.is_empty())
            .context("govc ls -i printed no reference")
    }

    fn start_on(listen: &str, model: VcsimModel, creds: Option<(String, String)>) -> Result<Self> {
        crate::init();
        let bin = paths::test_bin("vcsim")?;
        let dir = tempfile::Builder::new().prefix("rcp-vcsim-").tempdir()?;
        let (username, password) = creds.unwrap_or_else(|| {
            (
                "k8s-user@vsphere.local".to_string(),
                format!("rcp-sentinel-pw-{}", rand::random::<u32>()),
            )
        });
        crate::secrets::register(&password);
        // vcsim's built-in certificate has a 1024-bit RSA key, which rustls/aws-lc-rs (like
        // every current TLS stack's defaults) refuses; real vCenters use 2048+ bits. Give it a
        // 2048-bit certificate for 127.0.0.1 issued by a throw-away CA.
        let (cert, key) = (dir.path().join("vcsim.crt"), dir.path().join("vcsim.key"));
        let script = format!(
            "set -e; cd {d}; \
             openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=rcp-test-ca -addext basicConstraints=critical,CA:TRUE -keyout ca.key -out ca.crt; \
             openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout vcsim.key -out vcsim.csr; \
             printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nbasicConstraints=CA:FALSE\\n' > ext.cnf; \
             openssl x509 -req -in vcsim.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf -out vcsim.crt",
            d = dir.path().display()
        );
        let out = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .context("running openssl to make vcsim's certificate")?;
        if !out.status.success() {
            bail!(
                "making vcsim's certificate failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut args = vec![
            "-l".to_string(),
            listen.into(),
            "-username".into(),
            username.clone(),
            "-password".into(),
            password.clone(),
            "-vm".into(),
            model.vms.to_string(),
            "-host".into(),
            model.hosts.to_string(),
            "-standalone-host".into(),
            model.standalone_hosts.to_string(),
            "-cluster".into(),
            model.clusters.to_string(),
        ];
        args.extend([
            "-tlscert".to_string(),
            cert.display().to_string(),
            "-tlskey".to_string(),
            key.display().to_string(),
        ]);
        args.extend(model.extra_args);
        let mut process = ManagedProcess::spawn(
            "vcsim",
            &bin,
            &args,
            &[],
            &dir.path().join("vcsim.log"),
            Signal::SIGTERM,
        )?;
        let line = process.wait_for_log_line(Duration::from_secs(60), |l| l.contains("GOVC_URL="))?;
        // export GOVC_URL=https://user:pass@127.0.0.1:PORT/sdk GOVC_SIM_PID=N
        let url = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("GOVC_URL="))
            .context("vcsim printed no GOVC_URL")?;
        let host_port = url
            .rsplit_once('@')
            .map(|(_, rest)| rest)
            .unwrap_or(url)
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches("/sdk")
            .to_string();
        if !host_port.starts_with("127.0.0.1:") {
            bail!("vcsim listens on {host_port}, expected 127.0.0.1");
        }
        Ok(Self {
            process,
            host_port,
            username,
            password,
            _dir: dir,
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn host_port(&self) -> &str {
        &self.host_port
    }

    /// `https://127.0.0.1:<port>/sdk`, the SOAP endpoint.
    pub fn sdk_url(&self) -> String {
        format!("https://{}/sdk", self.host_port)
    }

    /// The user SOAP login accepts.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password SOAP login accepts.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// A vSphere cloud config (YAML) for this vcsim's account, reached on 127.0.0.1:`port` (its
    /// own port, or a proxy's in front of it), certificate not verified; `extra` (whole YAML
    /// sections, e.g. `labels:`) is appended.
    pub fn cloud_config_yaml(&self, port: u16, extra: &str) -> Result<String> {
        Ok(format!(
            "global:\n  user: {}\n  password: {}\n  port: {port}\n  insecureFlag: true\nvcenter:\n  sim:\n    server: 127.0.0.1\n{extra}",
            serde_json::to_string(&self.username)?,
            serde_json::to_string(&self.password)?,
        ))
    }

    /// The vcsim log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Stops vcsim now (SIGTERM), e.g. to test behaviour when vCenter is unreachable.
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Runs `govc` against this simulator and returns its stdout.
    pub fn govc(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(paths::test_bin("govc")?)
            .args(args)
            .env("GOVC_URL", format!("https://{}/sdk", self.host_port))
            .env("GOVC_USERNAME", &self.username)
            .env("GOVC_PASSWORD", &self.password)
            .env("GOVC_INSECURE", "1")
            .output()
            .context("running govc")?;
        if !out.status.success() {
            bail!(
                "govc {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// The BIOS UUID of a VM (vCenter byte order, lower-case).
    pub fn vm_uuid(&self, vm: &str) -> Result<String> {
        Ok(self
            .govc(&["object.collect", "-s", &format!("vm/{vm}"), "summary.config.uuid"])?
            .trim()
            .to_ascii_lowercase())
    }

    /// The CA (PEM) that issued vcsim's TLS certificate.
    pub fn ca_pem(&self) -> Result<Vec<u8>> {
        Ok(std::fs::read(self._dir.path().join("ca.crt"))?)
    }

    /// The SHA-1 thumbprint of vcsim's TLS certificate (`AB:CD:…`), read with openssl.
    pub fn thumbprint(&self) -> Result<String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -connect {} </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha1",
                self.host_port
            ))
            .output()?;
        let text = String::from_utf8(out.stdout)?;
        text.trim()
            .rsplit('=')
            .next()
            .map(str::to_string)
            .filter(|t| t.len() == 59)
            .context("no certificate fingerprint from openssl")
    }

    /// Gives model VM `i` ([`vm_name`]) the guest identity `node-<i>` / `10.20.0.<i+10>`, for
    /// VMs `0..count`.
    pub fn identify(&self, count: usize) -> Result<()> {
        for i in 0..count {
            self.set_guest_identity(&vm_name(i), &format!("10.20.0.{}", i + 10), &format!("node-{i}"))?;
        }
        Ok(())
    }

    /// Tags the first cluster of `DC0` with zone `zone-a` (category `k8s-zone`) and `DC0`
    /// with region `region-1` (category `k8s-region`).
    pub fn tag_zone_and_region(&self) -> Result<()> {
        for (category, tag, object) in [
            ("k8s-zone", "zone-a", "/DC0/host/DC0_C0"),
            ("k8s-region", "region-1", "/DC0"),
        ] {
            self.govc(&["tags.category.create", category])?;
            self.govc(&["tags.create", "-c", category, tag])?;
            self.govc(&["tags.attach", "-c", category, tag, object])?;
        }
        Ok(())
    }

    /// Gives a VM (by inventory path or name) a guest IP and host name, which vcsim's model
    /// VMs lack (only then do FindByIp/FindByDnsName and `guest.net` work).
    pub fn set_guest_identity(&self, vm: &str, ip: &str, host_name: &str) -> Result<()> {
        self.govc(&[
            "vm.change",
            "-vm",
            vm,
            "-e",
            &format!("SET.guest.ipAddress={ip}"),
            "-e",
            &format!("SET.guest.hostName={host_name}"),
        ])?;
        Ok(())
    }
}
