//! `OpenStack`: the real OpenStack of `hack/openstack.sh` (keystone, nova with the fake driver,
//! neutron, octavia with no-op drivers, on 127.0.0.1), shared by every test of a run and started
//! on first use (the script serialises concurrent starts). Each test gets its own
//! [`Project`]: a keystone project and user (roles `member` and `load-balancer_member`), and its
//! own catalog region whose compute endpoint goes through a [`FaultProxy`], so a test can take
//! "the OpenStack API" down for its own controller manager without disturbing the others.
//!
//! The harness talks to the APIs with plain `reqwest`, not with the provider's client: the tests
//! check the provider against what OpenStack itself says.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::fault_proxy::FaultProxy;

/// keystone.
pub const KEYSTONE: &str = "http://127.0.0.1:15000/v3";
/// nova.
pub const NOVA: &str = "http://127.0.0.1:18774/v2.1";
/// neutron.
pub const NEUTRON: &str = "http://127.0.0.1:19696/v2.0";
/// glance.
pub const GLANCE: &str = "http://127.0.0.1:19292/v2";
/// octavia.
pub const OCTAVIA: &str = "http://127.0.0.1:19876/v2";
/// barbican.
pub const BARBICAN: &str = "http://127.0.0.1:19311/v1";
/// The flavor every test server uses.
pub const FLAVOR: &str = "rcp.small";
/// A flavor whose name is no valid label value (its ID is).
pub const SPACED_FLAVOR: (&str, &str) = ("rcp.spaced", "rcp small (spaced)");

/// A token and the HTTP client that sends it.
#[derive(Clone)]
pub struct Session {
    http: reqwest::Client,
    token: String,
    /// The token's project.
    pub project_id: String,
}

impl Session {
    /// Authenticates `user` (domain Default) in `project`.
    pub async fn login(user: &str, password: &str, project: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        let body = json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": user, "domain": {"id": "default"}, "password": password}}},
            "scope": {"project": {"name": project, "domain": {"id": "default"}}}}});
        let resp = http
            .post(format!("{KEYSTONE}/auth/tokens"))
            .json(&body)
            .send()
            .await?;
        let status = resp.status();
        let token = resp
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        let Some(token) = token.filter(|_| status.is_success()) else {
            bail!("keystone login of {user} in {project}: HTTP {status}: {v}");
        };
        Ok(Self {
            http,
            token,
            project_id: v["token"]["project"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        })
    }

    /// One request; non-2xx is an error with the body.
    pub async fn call(&self, method: reqwest::Method, url: &str, body: Option<Value>) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), url)
            .header("X-Auth-Token", &self.token)
            .header("X-OpenStack-Nova-API-Version", "2.47");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.with_context(|| format!("{method} {url}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("{method} {url}: HTTP {status}: {text}");
        }
        Ok(if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)?
        })
    }

    /// GET; sent again (3 attempts) when no answer came: one API worker serves every test of a
    /// run, and beside the real-node cluster tests octavia's has not answered within 60 s.
    pub async fn get(&self, url: &str) -> Result<Value> {
        let mut attempt = 1;
        loop {
            match self.call(reqwest::Method::GET, url, None).await {
                Err(e)
                    if attempt < 3
                        && e.downcast_ref::<reqwest::Error>()
                            .is_some_and(|r| r.is_timeout() || r.is_connect()) =>
                {
                    eprintln!("GET {url}: {e:#}; sending it again");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// POST.
    pub async fn post(&self, url: &str, body: Value) -> Result<Value> {
        self.call(reqwest::Method::POST, url, Some(body)).await
    }

    /// PUT.
    pub async fn put(&self, url: &str, body: Value) -> Result<Value> {
        self.call(reqwest::Method::PUT, url, Some(body)).await
    }

    /// DELETE (404 counts as done).
    pub async fn delete(&self, url: &str) -> Result<()> {
        match self.call(reqwest::Method::DELETE, url, None).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("HTTP 404") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The raw bytes upload of a glance image.
    async fn upload(&self, url: &str, data: &'static [u8]) -> Result<()> {
        let resp = self
            .http
            .put(url)
            .header("X-Auth-Token", &self.token)
            .header("Content-Type", "application/octet-stream")
            .body(data)
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("PUT {url}: HTTP {}", resp.status());
        }
        Ok(())
    }
}

/// The shared cloud (admin side).
pub struct OpenStack {
    /// The admin session.
    pub admin: Session,
    /// The admin password (the script's fixed test password).
    password: String,
    /// The run directory (logs).
    pub run_dir: PathBuf,
}

fn script() -> PathBuf {
    crate::paths::workspace_root().join("hack/openstack.sh")
}

impl OpenStack {
    /// Starts the cloud (or finds it running) and logs in as admin.
    pub async fn shared() -> Result<Self> {
        crate::init();
        let out = tokio::process::Command::new(script())
            .arg("start")
            .output()
            .await
            .context("running hack/openstack.sh start")?;
        if !out.status.success() {
            bail!(
                "hack/openstack.sh start failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let env_file = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        let env = std::fs::read_to_string(&env_file).with_context(|| format!("reading {env_file}"))?;
        let get = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
                .unwrap_or_default()
        };
        let password = get("OS_PASSWORD");
        crate::secrets::register(&password);
        let admin = Session::login("admin", &password, "admin").await?;
        let os = Self {
            admin,
            password,
            run_dir: PathBuf::from(get("RCP_OPENSTACK_RUN")),
        };
        os.ensure_flavor_and_image().await?;
        Ok(os)
    }

    /// For a failing test's output: the last `max` lines of Octavia's log (API and worker) that
    /// are warnings or errors or name one of `ids`. A wait that times out on the shared cloud is
    /// otherwise undiagnosable once the cloud is stopped.
    pub fn octavia_log_excerpt(&self, ids: &[String], max: usize) -> String {
        let path = self.run_dir.join("logs/octavia.log");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return format!("(no Octavia log at {})", path.display());
        };
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.contains(" WARNING ")
                    || l.contains(" ERROR ")
                    || l.contains(" CRITICAL ")
                    || ids.iter().any(|id| l.contains(id.as_str()))
            })
            .collect();
        let from = lines.len().saturating_sub(max);
        format!(
            "Octavia's log ({}), last {} lines of warnings, errors and {ids:?}:\n{}",
            path.display(),
            lines.len() - from,
            lines[from..].join("\n")
        )
    }

    async fn ensure_flavor_and_image(&self) -> Result<()> {
        let a = &self.admin;
        let flavors = a.get(&format!("{NOVA}/flavors")).await?;
        for (id, name) in [(FLAVOR, FLAVOR), SPACED_FLAVOR] {
            let has = flavors["flavors"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["id"] == id));
            if !has {
                // A concurrent test may win the race: a conflict is fine.
                let _ = a
                    .post(
                        &format!("{NOVA}/flavors"),
                        json!({"flavor": {"name": name, "id": id, "ram": 512, "vcpus": 1, "disk": 1}}),
                    )
                    .await;
            }
        }
        Ok(())
    }

    /// The shared image (created once; glance needs bytes for nova to boot it).
    pub async fn image_id(&self) -> Result<String> {
        let a = &self.admin;
        let list = a.get(&format!("{GLANCE}/images?name=rcp-image")).await?;
        if let Some(id) = list["images"]
            .as_array()
            .and_then(|i| i.iter().find(|i| i["status"] == "active"))
            .and_then(|i| i["id"].as_str())
        {
            return Ok(id.to_string());
        }
        let img = a
            .post(
                &format!("{GLANCE}/images"),
                json!({"name": "rcp-image", "disk_format": "raw", "container_format": "bare", "visibility": "public"}),
            )
            .await?;
        let id = img["id"].as_str().unwrap_or_default().to_string();
        a.upload(&format!("{GLANCE}/images/{id}/file"), b"not really a disk")
            .await?;
        Ok(id)
    }

    /// A fresh project, user and catalog region for one test.
    pub async fn project(&self, test: &str) -> Result<Project> {
        let a = &self.admin;
        let suffix: u32 = rand::random();
        let name = format!("{test}-{suffix:08x}");
        let project = a
            .post(
                &format!("{KEYSTONE}/projects"),
                json!({"project": {"name": name, "domain_id": "default"}}),
            )
            .await?["project"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let password = format!("pw-{suffix:08x}-{}", rand::random::<u32>());
        // The CCM's own OpenStack password: a sentinel that no log or Event may hold.
        crate::secrets::register(&password);
        let user = a
            .post(
                &format!("{KEYSTONE}/users"),
                json!({"user": {"name": name, "domain_id": "default", "password": password}}),
            )
            .await?["user"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for role in ["member", "load-balancer_member"] {
            let roles = a.get(&format!("{KEYSTONE}/roles?name={role}")).await?;
            let role_id = roles["roles"][0]["id"].as_str().unwrap_or_default().to_string();
            a.put(
                &format!("{KEYSTONE}/projects/{project}/users/{user}/roles/{role_id}"),
                json!({}),
            )
            .await?;
        }
        // The test's own region: compute, network and load-balancer each through a fault proxy.
        let nova_proxy = FaultProxy::start("http://127.0.0.1:18774").await?;
        let neutron_proxy = FaultProxy::start("http://127.0.0.1:19696").await?;
        let octavia_proxy = FaultProxy::start("http://127.0.0.1:19876").await?;
        let region = name.clone();
        a.post(&format!("{KEYSTONE}/regions"), json!({"region": {"id": region}}))
            .await?;
        let mut endpoints = Vec::new();
        for (kind, url) in [
            ("compute", format!("http://127.0.0.1:{}/v2.1", nova_proxy.port())),
            ("network", format!("http://127.0.0.1:{}", neutron_proxy.port())),
            (
                "load-balancer",
                format!("http://127.0.0.1:{}", octavia_proxy.port()),
            ),
            // Read only by the CCM (a TLS certificate's existence): no proxy.
            ("key-manager", "http://127.0.0.1:19311".to_string()),
        ] {
            let services = a.get(&format!("{KEYSTONE}/services?type={kind}")).await?;
            let sid = services["services"][0]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let e = a
                .post(
                    &format!("{KEYSTONE}/endpoints"),
                    json!({"endpoint": {"service_id": sid, "interface": "public", "region_id": region, "url": url}}),
                )
                .await?;
            endpoints.push(e["endpoint"]["id"].as_str().unwrap_or_default().to_string());
        }
        let session = Session::login(&name, &password, &name).await?;
        Ok(Project {
            name,
            id: project,
            password,
            region,
            session,
            admin: a.clone(),
            nova_proxy,
            neutron_proxy,
            octavia_proxy,
            endpoints,
            image: self.image_id().await?,
        })
    }

    /// The admin password.
    pub fn admin_password(&self) -> &str {
        &self.password
    }

    /// Runs `sql` in Octavia's database (as the database's root, through the socket
    /// `hack/openstack.sh` starts MariaDB with) and returns what it printed: tests force states
    /// that Octavia's no-op drivers never reach (a load balancer in `ERROR`).
    pub async fn octavia_sql(&self, sql: &str) -> Result<String> {
        let out = tokio::process::Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.run_dir.join("mysql.sock").display()))
            .args(["-uroot", "-N", "-B", "octavia", "-e", sql])
            .output()
            .await
            .context("running mariadb")?;
        if !out.status.success() {
            bail!("mariadb {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `cloud-controller-manager-openstack` with the cloud config `config` (written as
/// `<name>.conf` in the cluster's directory), leader election off, and these extra flags; its
/// ServiceAccount is the one `deploy/openstack/base` grants.
pub fn start_ccm(
    cluster: &crate::TestCluster,
    config: &str,
    name: &str,
    extra: &[&str],
) -> Result<crate::ccm::CcmProcess> {
    start_ccm_with_env(cluster, config, name, extra, &[])
}

/// As [`start_ccm`], with extra environment variables for the CCM.
pub fn start_ccm_with_env(
    cluster: &crate::TestCluster,
    config: &str,
    name: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<crate::ccm::CcmProcess> {
    let path = cluster.dir().join(format!("{name}.conf"));
    std::fs::write(&path, config)?;
    let mut args = vec![
        format!("--cloud-config={}", path.display()),
        "--leader-elect=false".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    crate::ccm::CcmProcess::start_with_env(
        "cloud-controller-manager-openstack",
        name,
        &cluster.ccm_kubeconfig("openstack/base")?,
        cluster.dir(),
        &args,
        env,
    )
}

/// One test's project (and user of the same name) with its own region.
pub struct Project {
    /// Project (and user) name.
    pub name: String,
    /// Project ID.
    pub id: String,
    /// The user's password.
    pub password: String,
    /// The catalog region (compute, network and load-balancer through the proxies below).
    pub region: String,
    /// The user's session.
    pub session: Session,
    /// The admin session.
    pub admin: Session,
    /// The proxy in front of nova for this region.
    pub nova_proxy: FaultProxy,
    /// The proxy in front of neutron for this region.
    pub neutron_proxy: FaultProxy,
    /// The proxy in front of octavia for this region.
    pub octavia_proxy: FaultProxy,
    endpoints: Vec<String>,
    image: String,
}

/// A network with one subnet.
#[derive(Debug, Clone)]
pub struct Network {
    /// Network ID.
    pub id: String,
    /// Network name.
    pub name: String,
    /// Subnet ID.
    pub subnet_id: String,
}

/// A self-signed certificate for `cn` made by openssl: `(certificate PEM, key PEM, PKCS#12
/// bundle without a password)`.
pub fn test_certificate(cn: &str) -> Result<(String, String, Vec<u8>)> {
    let dir = tempfile::tempdir()?;
    let (key, cert, p12) = (
        dir.path().join("k.pem"),
        dir.path().join("c.pem"),
        dir.path().join("b.p12"),
    );
    let run = |args: &[&std::ffi::OsStr]| -> Result<()> {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .context("running openssl")?;
        if !out.status.success() {
            bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    let subject = format!("/CN={cn}");
    run(&[
        "req".as_ref(),
        "-x509".as_ref(),
        "-newkey".as_ref(),
        "rsa:2048".as_ref(),
        "-nodes".as_ref(),
        "-days".as_ref(),
        "30".as_ref(),
        "-subj".as_ref(),
        subject.as_ref(),
        "-keyout".as_ref(),
        key.as_os_str(),
        "-out".as_ref(),
        cert.as_os_str(),
    ])?;
    run(&[
        "pkcs12".as_ref(),
        "-export".as_ref(),
        "-inkey".as_ref(),
        key.as_os_str(),
        "-in".as_ref(),
        cert.as_os_str(),
        "-passout".as_ref(),
        "pass:".as_ref(),
        "-out".as_ref(),
        p12.as_os_str(),
    ])?;
    Ok((
        std::fs::read_to_string(&cert)?,
        std::fs::read_to_string(&key)?,
        std::fs::read(&p12)?,
    ))
}

impl Project {
    /// Stores a PKCS#12 bundle for `cn` in barbican as the project's user (the form Octavia
    /// prefers, as `openstack secret store --payload-content-type application/octet-stream`);
    /// returns its reference.
    pub async fn tls_secret(&self, cn: &str) -> Result<String> {
        use base64::Engine as _;
        let (_, _, p12) = test_certificate(cn)?;
        let v = self
            .session
            .post(
                &format!("{BARBICAN}/secrets"),
                json!({"name": cn, "secret_type": "opaque", "payload_content_type": "application/octet-stream",
                       "payload_content_encoding": "base64",
                       "payload": base64::engine::general_purpose::STANDARD.encode(p12)}),
            )
            .await?;
        v["secret_ref"].as_str().map(str::to_string).context("secret_ref")
    }

    /// Stores a certificate container for `cn` (certificate and private-key secrets) in
    /// barbican as the project's user; returns its reference.
    pub async fn tls_container(&self, cn: &str) -> Result<String> {
        let (cert, key, _) = test_certificate(cn)?;
        let mut refs = Vec::new();
        for (name, kind, payload) in [
            ("certificate", "certificate", cert),
            ("private_key", "private", key),
        ] {
            let v = self
                .session
                .post(
                    &format!("{BARBICAN}/secrets"),
                    json!({"name": format!("{cn}-{name}"), "secret_type": kind,
                           "payload_content_type": "text/plain", "payload": payload}),
                )
                .await?;
            refs.push(json!({"name": name, "secret_ref": v["secret_ref"]}));
        }
        let v = self
            .session
            .post(
                &format!("{BARBICAN}/containers"),
                json!({"name": cn, "type": "certificate", "secret_refs": refs}),
            )
            .await?;
        v["container_ref"]
            .as_str()
            .map(str::to_string)
            .context("container_ref")
    }

    /// The `[Global]` section for this project's user and region.
    pub fn global_section(&self) -> String {
        format!(
            "[Global]\nauth-url = {KEYSTONE}\nusername = {}\npassword = {}\ntenant-name = {}\ndomain-name = Default\nregion = {}\n",
            self.name, self.password, self.name, self.region
        )
    }

    /// Revokes every token of the project's user (keystone does so when a user is disabled):
    /// disables and re-enables the user, then logs this harness in again.
    pub async fn revoke_tokens(&mut self) -> Result<()> {
        let users = self
            .admin
            .get(&format!("{KEYSTONE}/users?name={}", self.name))
            .await?;
        let id = users["users"][0]["id"].as_str().unwrap_or_default().to_string();
        for enabled in [false, true] {
            self.admin
                .call(
                    reqwest::Method::PATCH,
                    &format!("{KEYSTONE}/users/{id}"),
                    Some(json!({"user": {"enabled": enabled}})),
                )
                .await?;
        }
        // Keystone's revocation events have a one-second resolution: a token issued in the same
        // second as the revocation would survive it.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // Keystone may still refuse the re-enabled user for a moment: asked again, up to 10 s.
        // (A refusal for every attempt was keystone's user cache keeping the disabled user,
        // stored by the CCM's concurrent log-in; hack/openstack.sh turns that cache off.)
        let mut attempt = 0;
        self.session = loop {
            match Session::login(&self.name, &self.password, &self.name).await {
                Ok(s) => break s,
                Err(e) if attempt < 20 => {
                    tracing::debug!(error = %e, "keystone refused the re-enabled user; asking again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        };
        Ok(())
    }

    /// A network and a subnet `cidr`, owned by the project.
    pub async fn network(&self, name: &str, cidr: &str) -> Result<Network> {
        let s = &self.session;
        let net = s
            .post(&format!("{NEUTRON}/networks"), json!({"network": {"name": name}}))
            .await?;
        let id = net["network"]["id"].as_str().unwrap_or_default().to_string();
        let sub = s
            .post(
                &format!("{NEUTRON}/subnets"),
                json!({"subnet": {"name": format!("{name}-subnet"), "network_id": id, "ip_version": 4, "cidr": cidr}}),
            )
            .await?;
        Ok(Network {
            id,
            name: name.into(),
            subnet_id: sub["subnet"]["id"].as_str().unwrap_or_default().to_string(),
        })
    }

    /// An external network (admin-made, `router:external`) with subnet `cidr`.
    pub async fn external_network(&self, name: &str, cidr: &str) -> Result<Network> {
        let a = &self.admin;
        let net = a
            .post(
                &format!("{NEUTRON}/networks"),
                json!({"network": {"name": name, "router:external": true, "project_id": self.id}}),
            )
            .await?;
        let id = net["network"]["id"].as_str().unwrap_or_default().to_string();
        let sub = a
            .post(
                &format!("{NEUTRON}/subnets"),
                json!({"subnet": {"name": format!("{name}-subnet"), "network_id": id, "ip_version": 4,
                       "cidr": cidr, "project_id": self.id}}),
            )
            .await?;
        Ok(Network {
            id,
            name: name.into(),
            subnet_id: sub["subnet"]["id"].as_str().unwrap_or_default().to_string(),
        })
    }

    /// A router with a gateway on `external` and an interface on `internal`'s subnet.
    pub async fn router(&self, name: &str, external: &Network, internal: &Network) -> Result<String> {
        let s = &self.session;
        let r = s
            .post(
                &format!("{NEUTRON}/routers"),
                json!({"router": {"name": name, "external_gateway_info": {"network_id": external.id}}}),
            )
            .await?;
        let id = r["router"]["id"].as_str().unwrap_or_default().to_string();
        s.put(
            &format!("{NEUTRON}/routers/{id}/add_router_interface"),
            json!({"subnet_id": internal.subnet_id}),
        )
        .await?;
        Ok(id)
    }

    /// Boots a server on `network` and waits until it is ACTIVE; returns its ID.
    pub async fn server(&self, name: &str, network: &Network) -> Result<String> {
        self.server_with_flavor(name, network, FLAVOR).await
    }

    /// Boots a server of the flavor `flavor` (an ID) on `network` and waits until it is
    /// ACTIVE; returns its ID.
    pub async fn server_with_flavor(&self, name: &str, network: &Network, flavor: &str) -> Result<String> {
        self.server_on(name, &[network], flavor).await
    }

    /// Boots a server of the flavor `flavor` with a port on each of `networks` and waits until
    /// it is ACTIVE; returns its ID.
    pub async fn server_on(&self, name: &str, networks: &[&Network], flavor: &str) -> Result<String> {
        let s = &self.session;
        let nets: Vec<Value> = networks.iter().map(|n| json!({"uuid": n.id})).collect();
        let v = s
            .post(
                &format!("{NOVA}/servers"),
                json!({"server": {"name": name, "imageRef": self.image, "flavorRef": flavor,
                       "networks": nets}}),
            )
            .await?;
        let id = v["server"]["id"].as_str().unwrap_or_default().to_string();
        // nova's fake driver spawns in seconds, but one nova-compute serves every test of a
        // run: beside the real-node cluster tests a spawn has taken more than 90 s.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
        loop {
            let srv = self.server_json(&id).await?;
            match srv["status"].as_str() {
                Some("ACTIVE") => return Ok(id),
                Some("ERROR") => bail!("server {name} went to ERROR: {}", srv["fault"]),
                _ => {}
            }
            if tokio::time::Instant::now() > deadline {
                bail!("server {name} not ACTIVE after 240 s: {srv}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Boots the servers `<prefix>-0` … `<prefix>-<n-1>` on `network` at once and waits until
    /// each is ACTIVE; returns their IDs in that order.
    pub async fn servers(&self, prefix: &str, n: usize, network: &Network) -> Result<Vec<String>> {
        futures::future::try_join_all((0..n).map(|i| {
            let name = format!("{prefix}-{i}");
            async move { self.server(&name, network).await }
        }))
        .await
    }

    /// A server's JSON.
    pub async fn server_json(&self, id: &str) -> Result<Value> {
        Ok(self.session.get(&format!("{NOVA}/servers/{id}")).await?["server"].clone())
    }

    /// A server's first fixed address on `network`.
    pub async fn server_ip(&self, id: &str, network: &str) -> Result<String> {
        let s = self.server_json(id).await?;
        s["addresses"][network]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["OS-EXT-IPS:type"] == "fixed"))
            .and_then(|a| a["addr"].as_str())
            .map(str::to_string)
            .with_context(|| format!("server {id} has no fixed address on {network}: {s}"))
    }

    /// Stops a server (`os-stop`) and waits until nova says SHUTOFF.
    pub async fn stop_server(&self, id: &str) -> Result<()> {
        self.session
            .post(&format!("{NOVA}/servers/{id}/action"), json!({"os-stop": null}))
            .await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let srv = self.server_json(id).await?;
            if srv["status"] == "SHUTOFF" {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("server {id} not SHUTOFF 60 s after os-stop: {}", srv["status"]);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Deletes a server and waits until nova answers 404 for it.
    pub async fn delete_server(&self, id: &str) -> Result<()> {
        self.session.delete(&format!("{NOVA}/servers/{id}")).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.session.get(&format!("{NOVA}/servers/{id}")).await.is_ok() {
            if tokio::time::Instant::now() > deadline {
                bail!("server {id} still there 60 s after DELETE");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(())
    }

    /// A port on `network` (for `loadbalancer.openstack.org/port-id`).
    pub async fn port(&self, name: &str, network: &Network) -> Result<String> {
        let p = self
            .session
            .post(
                &format!("{NEUTRON}/ports"),
                json!({"port": {"name": name, "network_id": network.id}}),
            )
            .await?;
        Ok(p["port"]["id"].as_str().unwrap_or_default().to_string())
    }

    /// Octavia load balancers of this project with this name.
    pub async fn load_balancers(&self, name: &str) -> Result<Vec<Value>> {
        let v = self
            .session
            .get(&format!("{OCTAVIA}/lbaas/loadbalancers?name={name}"))
            .await?;
        Ok(v["loadbalancers"].as_array().cloned().unwrap_or_default())
    }

    /// `GET {OCTAVIA}/lbaas/<path>`'s `key` list.
    pub async fn octavia_list(&self, path: &str, key: &str) -> Result<Vec<Value>> {
        let v = self.session.get(&format!("{OCTAVIA}/lbaas/{path}")).await?;
        Ok(v[key].as_array().cloned().unwrap_or_default())
    }

    /// The project's floating IPs.
    pub async fn floating_ips(&self) -> Result<Vec<Value>> {
        let v = self
            .session
            .get(&format!("{NEUTRON}/floatingips?project_id={}", self.id))
            .await?;
        Ok(v["floatingips"].as_array().cloned().unwrap_or_default())
    }

    /// A router's routes.
    pub async fn router_routes(&self, router: &str) -> Result<Vec<Value>> {
        let v = self.session.get(&format!("{NEUTRON}/routers/{router}")).await?;
        Ok(v["router"]["routes"].as_array().cloned().unwrap_or_default())
    }

    /// The allowed address pairs of the server's ports.
    pub async fn address_pairs(&self, server: &str) -> Result<Vec<String>> {
        let v = self
            .session
            .get(&format!("{NEUTRON}/ports?device_id={server}"))
            .await?;
        Ok(v["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["allowed_address_pairs"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["ip_address"].as_str().map(str::to_string))
            .collect())
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        // The region's endpoints point at this test's proxy, which goes away now: remove them
        // (best effort, on a thread of its own since Drop cannot await).
        let admin = self.admin.clone();
        let endpoints = std::mem::take(&mut self.endpoints);
        let region = self.region.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            rt.block_on(async move {
                for e in endpoints {
                    let _ = admin.delete(&format!("{KEYSTONE}/endpoints/{e}")).await;
                }
                let _ = admin.delete(&format!("{KEYSTONE}/regions/{region}")).await;
            });
        })
        .join();
    }
}
