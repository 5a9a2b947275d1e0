//! vCenter credentials (Secret, directory or file) and the session metrics.

use super::*;

/// Reads the credentials of one vCenter (see [`VsphereCloud::credential_source`]).
pub(crate) async fn read_credentials(
    vc: &VCenterConfig,
    configured_dir: &str,
    kube: Option<kube::Client>,
    previous_rejected: bool,
) -> CloudResult<Credentials> {
    let has_other_source = !vc.secret_name.is_empty()
        || !configured_dir.is_empty()
        || std::path::Path::new(DEFAULT_SECRETS_DIRECTORY).is_dir();
    let configured = !vc.user.is_empty() && !vc.password.is_empty();
    // After vCenter rejected them, the file's credentials give way to the Secret/directory.
    let skip_configured = previous_rejected && has_other_source;
    if configured && !skip_configured {
        return Ok(Credentials {
            username: vc.user.clone(),
            password: vc.password.clone(),
        });
    }
    let pick = |m: BTreeMap<String, (String, Secret)>| m.get(&vc.server).cloned();
    let dir = if !configured_dir.is_empty() {
        Some(configured_dir.to_string())
    } else {
        std::path::Path::new(DEFAULT_SECRETS_DIRECTORY)
            .is_dir()
            .then(|| DEFAULT_SECRETS_DIRECTORY.to_string())
    };
    if let Some(dir) = dir {
        let m = config::credentials_from_directory(std::path::Path::new(&dir))
            .map_err(|e| CloudError::msg(e.to_string()))?;
        if let Some((u, p)) = pick(m) {
            return Ok(Credentials {
                username: u,
                password: p,
            });
        }
    }
    if !vc.secret_name.is_empty() {
        let client =
            kube.ok_or_else(|| CloudError::msg("the credentials Secret can be read only after Initialize"))?;
        let ns = if vc.secret_namespace.is_empty() {
            "kube-system"
        } else {
            vc.secret_namespace.as_str()
        };
        let api: kube::Api<KubeSecret> = kube::Api::namespaced(client, ns);
        let secret = api.get(&vc.secret_name).await.map_err(|e| {
            CloudError::wrap(format!("reading credentials Secret {ns}/{}", vc.secret_name), e)
        })?;
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        let m = config::credentials_from_secret(&data)
            .map_err(|e| CloudError::msg(format!("Secret {ns}/{}: {e}", vc.secret_name)))?;
        if let Some((u, p)) = pick(m) {
            return Ok(Credentials {
                username: u,
                password: p,
            });
        }
        return Err(CloudError::msg(format!(
            "Secret {ns}/{} has no credentials for vCenter {}",
            vc.secret_name, vc.server
        )));
    }
    if !vc.user.is_empty() && !vc.password.is_empty() {
        return Ok(Credentials {
            username: vc.user.clone(),
            password: vc.password.clone(),
        });
    }
    Err(CloudError::msg(format!(
        "no credentials for vCenter {}: set user/password, secretName or secretsDirectory",
        vc.server
    )))
}

/// Inventory paths (`DC0`, `folder/DC1`) of datacenters by managed object ID, from one
/// PropertyCollector traversal; empty when it fails (datacenters are still matched by name or
/// ID).
pub(crate) async fn datacenter_paths(
    soap: &Client,
    datacenters: &[(MoRef, PropertySet)],
) -> HashMap<String, String> {
    let dcs: Vec<MoRef> = datacenters.iter().map(|(m, _)| m.clone()).collect();
    let Ok(ancestry) = soap.ancestry(&dcs).await else {
        return HashMap::new();
    };
    let parents: std::collections::BTreeMap<MoRef, Option<MoRef>> = ancestry
        .iter()
        .map(|(k, (p, _))| (k.clone(), p.clone()))
        .collect();
    let mut out = HashMap::new();
    for dc in &dcs {
        let chain = Client::chain(&parents, dc);
        // chain = [dc, folder, …, root folder]; the root folder is not part of the path.
        let names: Option<Vec<String>> = chain[..chain.len().saturating_sub(1)]
            .iter()
            .rev()
            .map(|o| ancestry.get(o).and_then(|(_, n)| n.clone()))
            .collect();
        if let Some(names) = names {
            out.insert(dc.value.clone(), names.join("/"));
        }
    }
    out
}

/// `cloudprovider_vsphere_sessions_created_total{api}` (SOAP and REST login attempts) and
/// `cloudprovider_vsphere_api_requests_total{api}` (requests other than logins), read from the
/// clients at scrape time.
pub(crate) struct SessionCollector {
    pub(crate) vcenters: Arc<Vec<VCenter>>,
    pub(crate) descs: [prometheus::core::Desc; 2],
}

impl SessionCollector {
    pub(crate) const SESSIONS: (&'static str, &'static str) = (
        "cloudprovider_vsphere_sessions_created_total",
        "vCenter sessions created (login attempts), by API",
    );
    pub(crate) const REQUESTS: (&'static str, &'static str) = (
        "cloudprovider_vsphere_api_requests_total",
        "vCenter API requests (logins excluded), by API",
    );

    pub(crate) fn new(vcenters: Arc<Vec<VCenter>>) -> Self {
        let desc = |(name, help): (&str, &str)| {
            prometheus::core::Desc::new(name.into(), help.into(), vec!["api".into()], HashMap::new())
                .expect("valid metric description")
        };
        Self {
            vcenters,
            descs: [desc(Self::SESSIONS), desc(Self::REQUESTS)],
        }
    }
}

impl prometheus::core::Collector for SessionCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }
    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut out = Vec::new();
        for ((name, help), (soap, rest)) in [
            (Self::SESSIONS, logins(&self.vcenters)),
            (Self::REQUESTS, requests(&self.vcenters)),
        ] {
            let c = prometheus::IntCounterVec::new(prometheus::Opts::new(name, help), &["api"])
                .expect("valid metric");
            c.with_label_values(&["soap"]).inc_by(soap);
            c.with_label_values(&["rest"]).inc_by(rest);
            out.extend(prometheus::core::Collector::collect(&c));
        }
        out
    }
}

pub(crate) fn requests(vcenters: &[VCenter]) -> (u64, u64) {
    vcenters
        .iter()
        .filter_map(|v| v.clients.get())
        .fold((0, 0), |(s, r), (soap, rest)| {
            (s + soap.calls(), r + rest.calls())
        })
}

pub(crate) fn logins(vcenters: &[VCenter]) -> (u64, u64) {
    vcenters
        .iter()
        .filter_map(|v| v.clients.get())
        .fold((0, 0), |(s, r), (soap, rest)| {
            (s + soap.logins(), r + rest.logins())
        })
}
