//! An image registry standing in for a private ECR registry: Debian's `docker-registry` (the
//! Distribution registry) on 127.0.0.1 with TLS (a CA made here, a certificate for the ECR host
//! name) and htpasswd authentication for the user and password moto's ECR hands out
//! (`GetAuthorizationToken`: `AWS` / `<account>-auth-token`). A pull succeeds only with the
//! credentials `ecr-credential-provider` returns.

use std::path::Path;

use anyhow::{Context, Result, bail};
use nix::sys::signal::Signal;
use serde_json::Value;
use tempfile::TempDir;

use crate::{
    certs::ClientCa,
    paths,
    process::{ManagedProcess, free_port},
};

/// The running registry.
pub struct Registry {
    process: ManagedProcess,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The host name its certificate is for.
    pub host: String,
    /// The CA that signed its certificate (PEM).
    pub ca_pem: String,
    dir: TempDir,
}

impl Registry {
    /// Starts the registry for `host`, letting in `user` with `password` only.
    pub async fn start(host: &str, user: &str, password: &str) -> Result<Self> {
        crate::init();
        let dir = tempfile::Builder::new().prefix("rcp-registry-").tempdir()?;
        let d = dir.path();
        let ca = ClientCa::new("rcp-registry-ca")?;
        let (cert, key) = ca.server_cert_pem(host)?;
        std::fs::write(d.join("tls.crt"), &cert)?;
        std::fs::write(d.join("tls.key"), &key)?;
        // htpasswd wants bcrypt: the system's crypt(3) (libxcrypt) makes it.
        let hash = std::process::Command::new("python3")
            .args([
                "-W",
                "ignore",
                "-c",
                "import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)).replace('$2b$', '$2a$', 1))",
                password,
            ])
            .output()?;
        anyhow::ensure!(hash.status.success(), "bcrypt of the registry password failed");
        std::fs::write(
            d.join("htpasswd"),
            format!("{user}:{}\n", String::from_utf8_lossy(&hash.stdout).trim()),
        )?;
        let port = free_port();
        std::fs::write(
            d.join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {}\n    key: {}\n\
                 auth:\n  htpasswd:\n    realm: ecr\n    path: {}\n",
                d.join("data").display(),
                d.join("tls.crt").display(),
                d.join("tls.key").display(),
                d.join("htpasswd").display()
            ),
        )?;
        let process = ManagedProcess::spawn(
            "docker-registry",
            &paths::test_bin("docker-registry")?,
            &["serve".into(), d.join("config.yml").display().to_string()],
            &[],
            &d.join("registry.log"),
            Signal::SIGTERM,
        )?;
        let registry = Self {
            process,
            port,
            host: host.to_string(),
            ca_pem: ca.pem.clone(),
            dir,
        };
        let http = registry.http()?;
        for _ in 0..100 {
            if http.get(registry.url("/v2/")).send().await.is_ok() {
                return Ok(registry);
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        bail!("docker-registry did not answer; log:\n{}", registry.log())
    }

    /// A client that trusts the registry's CA and reaches its host name on 127.0.0.1.
    fn http(&self) -> Result<reqwest::Client> {
        Ok(reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca_pem.as_bytes())?)
            .resolve(&self.host, ([127, 0, 0, 1], self.port).into())
            .build()?)
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}:{}{path}", self.host, self.port)
    }

    /// Pushes the image of an OCI archive (its first manifest) as `repo:tag`. An image index
    /// (a multi-arch image) is pushed with every image it lists (each by digest), then the
    /// index as `tag`.
    pub async fn push_oci_archive(
        &self,
        archive: &Path,
        repo: &str,
        tag: &str,
        user: &str,
        password: &str,
    ) -> Result<()> {
        let layout = tempfile::tempdir()?;
        let out = std::process::Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(layout.path())
            .output()?;
        anyhow::ensure!(out.status.success(), "unpacking {}", archive.display());
        let index: Value = serde_json::from_slice(&std::fs::read(layout.path().join("index.json"))?)?;
        let entry = &index["manifests"][0];
        let digest = entry["digest"].as_str().context("index without a manifest")?;
        let media_type = entry["mediaType"]
            .as_str()
            .unwrap_or("application/vnd.oci.image.manifest.v1+json");
        let push = Push {
            registry: self,
            http: self.http()?,
            layout: layout.path(),
            repo,
            user,
            password,
        };
        if media_type == "application/vnd.oci.image.index.v1+json" {
            let bytes = push.blob(digest)?;
            let images: Value = serde_json::from_slice(&bytes)?;
            for image in images["manifests"].as_array().cloned().unwrap_or_default() {
                let d = image["digest"]
                    .as_str()
                    .context("an index entry without a digest")?;
                let t = image["mediaType"]
                    .as_str()
                    .unwrap_or("application/vnd.oci.image.manifest.v1+json");
                push.image(d, t, d).await?;
            }
            push.manifest(tag, media_type, bytes).await
        } else {
            push.image(digest, media_type, tag).await
        }
    }

    /// The registry's log (one JSON-ish line per request, with the authenticated user).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// The CA file, for a containerd that pulls from it.
    pub fn write_ca(&self, path: &Path) -> Result<()> {
        Ok(std::fs::write(path, &self.ca_pem)?)
    }

    /// Whether it still runs.
    pub fn check_running(&mut self) -> Result<()> {
        self.process.check_running()
    }
}

/// One push to a [`Registry`]: an OCI layout's blobs and manifests.
struct Push<'a> {
    registry: &'a Registry,
    http: reqwest::Client,
    layout: &'a Path,
    repo: &'a str,
    user: &'a str,
    password: &'a str,
}

impl Push<'_> {
    fn blob(&self, digest: &str) -> Result<Vec<u8>> {
        let hex = digest.strip_prefix("sha256:").context("a sha256 digest")?;
        Ok(std::fs::read(self.layout.join("blobs/sha256").join(hex))?)
    }

    /// The image manifest `digest` (its config and layers first) as `reference`.
    async fn image(&self, digest: &str, media_type: &str, reference: &str) -> Result<()> {
        let bytes = self.blob(digest)?;
        let manifest: Value = serde_json::from_slice(&bytes)?;
        let mut digests = vec![
            manifest["config"]["digest"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ];
        for layer in manifest["layers"].as_array().cloned().unwrap_or_default() {
            digests.push(layer["digest"].as_str().unwrap_or_default().to_string());
        }
        for d in digests {
            self.upload(&d).await?;
        }
        self.manifest(reference, media_type, bytes).await
    }

    async fn upload(&self, digest: &str) -> Result<()> {
        let (r, http) = (self.registry, &self.http);
        let start = http
            .post(r.url(&format!("/v2/{}/blobs/uploads/", self.repo)))
            .basic_auth(self.user, Some(self.password))
            .send()
            .await?;
        anyhow::ensure!(
            start.status().as_u16() == 202,
            "starting a blob upload: {}",
            start.status()
        );
        let location = start
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .context("upload without a location")?
            .to_string();
        let location = if location.starts_with("http") {
            location
        } else {
            r.url(&location)
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let put = http
            .put(format!("{location}{sep}digest={digest}"))
            .basic_auth(self.user, Some(self.password))
            .header("content-type", "application/octet-stream")
            .body(self.blob(digest)?)
            .send()
            .await?;
        anyhow::ensure!(
            put.status().as_u16() == 201,
            "uploading {digest}: {}",
            put.status()
        );
        Ok(())
    }

    async fn manifest(&self, reference: &str, media_type: &str, bytes: Vec<u8>) -> Result<()> {
        let put = self
            .http
            .put(
                self.registry
                    .url(&format!("/v2/{}/manifests/{reference}", self.repo)),
            )
            .basic_auth(self.user, Some(self.password))
            .header("content-type", media_type)
            .body(bytes)
            .send()
            .await?;
        anyhow::ensure!(
            put.status().as_u16() == 201,
            "putting the manifest {reference}: {}",
            put.status()
        );
        Ok(())
    }
}
