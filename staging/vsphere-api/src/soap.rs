//! The vim25 SOAP client: one long-lived session per vCenter (cookie `vmware_soap_session`),
//! logged in on first use and again — once per failing call — when vCenter answers
//! `NotAuthenticated` (an expired or revoked session).
//!
//! Operations: `RetrieveServiceContent`, `SessionManager.Login`/`Logout`/`SessionIsActive`,
//! `SearchIndex.FindByUuid`/`FindAllByDnsName`/`FindByIp`,
//! `PropertyCollector.RetrievePropertiesEx`/`ContinueRetrievePropertiesEx`,
//! `ViewManager.CreateContainerView`/`DestroyView`, and ancestor walking over `parent`.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use tokio::sync::{Mutex, OnceCell};
use tracing::{debug, info, warn};

/// Kept at this path for earlier users; defined with the logins.
pub use crate::login::Credentials;
use crate::{
    Error, SoapFault,
    login::{CredentialSource, LoginGate},
    tls::{TlsOptions, http_client},
    xml::{self, Element, escape},
};

/// A managed object reference (`type`, `value`), e.g. `VirtualMachine:vm-42`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MoRef {
    /// Type, e.g. `VirtualMachine`.
    pub kind: String,
    /// ID, e.g. `vm-42`.
    pub value: String,
}

impl MoRef {
    /// A reference.
    pub fn new(kind: &str, value: &str) -> Self {
        Self {
            kind: kind.into(),
            value: value.into(),
        }
    }

    fn from_element(e: &Element) -> Option<Self> {
        let kind = e.attr("type")?;
        (!e.text.is_empty()).then(|| Self::new(kind, e.text.trim()))
    }

    fn to_xml(&self, tag: &str) -> String {
        format!(
            "<{tag} type=\"{}\">{}</{tag}>",
            escape(&self.kind),
            escape(&self.value)
        )
    }
}

impl std::fmt::Display for MoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.value)
    }
}

/// The parts of `ServiceContent` the client uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceContent {
    /// Root folder.
    pub root_folder: MoRef,
    /// Property collector.
    pub property_collector: MoRef,
    /// View manager.
    pub view_manager: MoRef,
    /// Search index.
    pub search_index: MoRef,
    /// Session manager.
    pub session_manager: MoRef,
    /// Authorization manager (privilege queries), when the server names one.
    pub authorization_manager: Option<MoRef>,
    /// `about.apiVersion`.
    pub api_version: String,
}

impl ServiceContent {
    /// Reads the answer to `RetrieveServiceContent` (its `returnval`).
    pub fn from_answer(r: &Element) -> Result<Self, Error> {
        let rv = r
            .child("returnval")
            .ok_or_else(|| Error::Response("RetrieveServiceContent: no returnval".into()))?;
        let mo = |name: &str| {
            rv.child(name)
                .and_then(MoRef::from_element)
                .ok_or_else(|| Error::Response(format!("ServiceContent without {name}")))
        };
        Ok(ServiceContent {
            root_folder: mo("rootFolder")?,
            property_collector: mo("propertyCollector")?,
            view_manager: mo("viewManager")?,
            search_index: mo("searchIndex")?,
            session_manager: mo("sessionManager")?,
            authorization_manager: rv.child("authorizationManager").and_then(MoRef::from_element),
            api_version: rv
                .path(&["about", "apiVersion"])
                .map(|e| e.text.clone())
                .unwrap_or_default(),
        })
    }
}

/// One vNIC as the guest reports it (`guest.net[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestNicInfo {
    /// Port group name.
    pub network: String,
    /// IP addresses.
    pub ip_addresses: Vec<String>,
    /// MAC address.
    pub mac_address: String,
    /// Device key of the virtual NIC; -1 for interfaces without one (veths, bridges, …).
    pub device_config_id: i32,
}

/// Named properties of one object.
#[derive(Debug, Clone, Default)]
pub struct PropertySet {
    props: BTreeMap<String, Element>,
}

impl PropertySet {
    /// Whether the property was returned.
    pub fn has(&self, path: &str) -> bool {
        self.props.contains_key(path)
    }

    /// A string property.
    pub fn string(&self, path: &str) -> Option<String> {
        self.props.get(path).map(|e| e.text.trim().to_string())
    }

    /// An integer property.
    pub fn int(&self, path: &str) -> Option<i64> {
        self.string(path)?.parse().ok()
    }

    /// A managed-object-reference property.
    pub fn moref(&self, path: &str) -> Option<MoRef> {
        self.props.get(path).and_then(MoRef::from_element)
    }

    /// An `OptionValue[]` property (e.g. `config.extraConfig`) as `(key, value)` pairs.
    pub fn option_values(&self, path: &str) -> Vec<(String, String)> {
        let Some(val) = self.props.get(path) else {
            return Vec::new();
        };
        val.children_named("OptionValue")
            .filter_map(|o| {
                Some((
                    o.child_text("key")?.to_string(),
                    o.child_text("value").unwrap_or_default().to_string(),
                ))
            })
            .collect()
    }

    /// `guest.net`.
    pub fn guest_nics(&self, path: &str) -> Vec<GuestNicInfo> {
        let Some(val) = self.props.get(path) else {
            return Vec::new();
        };
        val.children_named("GuestNicInfo")
            .map(|n| GuestNicInfo {
                network: n.child_text("network").unwrap_or_default().to_string(),
                ip_addresses: n
                    .children_named("ipAddress")
                    .map(|i| i.text.trim().to_string())
                    .collect(),
                mac_address: n.child_text("macAddress").unwrap_or_default().to_string(),
                device_config_id: n
                    .child_text("deviceConfigId")
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(-1),
            })
            .collect()
    }
}

/// A vim25 SOAP client for one vCenter.
pub struct Client {
    sdk_url: String,
    http: reqwest::Client,
    credentials: CredentialSource,
    content: OnceCell<ServiceContent>,
    session: Mutex<LoginGate>,
    logins: AtomicU64,
    calls: AtomicU64,
    retries: u32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("sdk_url", &self.sdk_url)
            .finish_non_exhaustive()
    }
}

/// Whether a request failed in certificate verification (never worth retrying).
fn is_tls_error(e: &reqwest::Error) -> bool {
    let chain = crate::error_chain(e).to_ascii_lowercase();
    chain.contains("certificate") || chain.contains("thumbprint")
}

/// The SOAPAction header value (vim25 6.5: what every vCenter since 6.5 and vcsim accept).
const SOAP_ACTION: &str = "\"urn:vim25/6.5\"";

impl Client {
    /// A client for `https://<server>:<port>/sdk`.
    pub fn new(
        server: &str,
        port: u16,
        tls: &TlsOptions,
        credentials: impl Into<CredentialSource>,
    ) -> Result<Self, Error> {
        let host = crate::url_host(server);
        Ok(Self {
            sdk_url: format!("https://{host}:{port}/sdk"),
            http: http_client(tls, Duration::from_secs(60))?,
            credentials: credentials.into(),
            content: OnceCell::new(),
            session: Mutex::new(LoginGate::default()),
            logins: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            retries: 2,
        })
    }

    /// Sets how often a call is retried after a transport error (a closed keep-alive
    /// connection, a reset): `soap-roundtrip-count` − 1, default 2. Every bound call is
    /// idempotent, so a retry is always safe.
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The SOAP endpoint.
    pub fn url(&self) -> &str {
        &self.sdk_url
    }

    /// How many `Login` calls this client has made.
    pub fn logins(&self) -> u64 {
        self.logins.load(Ordering::SeqCst)
    }

    /// How many SOAP requests this client has sent.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Sends one SOAP request. Retried (up to [`Client::with_retries`] times, 200 ms × attempt
    /// apart) when it did not reach vCenter or vCenter did not process it: a transport error (a
    /// closed keep-alive connection, a reset, except TLS verification failures), an answer cut
    /// off, or `502`/`503`/`504` without a SOAP fault (an overloaded vCenter or its proxy). SOAP
    /// faults are answers and are never retried here.
    async fn post(&self, body: &str) -> Result<Element, Error> {
        let envelope = xml::envelope(body);
        let mut attempt = 0;
        loop {
            let (result, retryable) = self.post_once(&envelope).await;
            match result {
                Err(e) if retryable && attempt < self.retries => {
                    attempt += 1;
                    debug!(url = %self.sdk_url, attempt, error = %e, "retrying vCenter request");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
                other => return other,
            }
        }
    }

    /// One attempt of [`Client::post`]: the result, and whether a failure is worth a retry.
    async fn post_once(&self, envelope: &str) -> (Result<Element, Error>, bool) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let sent = self
            .http
            .post(&self.sdk_url)
            .header("Content-Type", "text/xml; charset=\"utf-8\"")
            .header("SOAPAction", SOAP_ACTION)
            .body(envelope.to_string())
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                let retryable = (e.is_request() || e.is_connect()) && !is_tls_error(&e);
                let error = Error::Connect {
                    url: self.sdk_url.clone(),
                    reason: crate::error_chain(&e),
                };
                return (Err(error), retryable);
            }
        };
        let status = resp.status();
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) => {
                let error = Error::Connect {
                    url: self.sdk_url.clone(),
                    reason: crate::error_chain(&e),
                };
                return (Err(error), true);
            }
        };
        let result = read_answer(&self.sdk_url, status.as_u16(), &text);
        let retryable = matches!(
            &result,
            Err(Error::Status {
                status: 502..=504,
                ..
            })
        );
        (result, retryable)
    }

    /// `RetrieveServiceContent` (cached; needs no session).
    pub async fn service_content(&self) -> Result<&ServiceContent, Error> {
        self.content
            .get_or_try_init(|| async {
                let r = self
                    .post("<RetrieveServiceContent xmlns=\"urn:vim25\"><_this type=\"ServiceInstance\">ServiceInstance</_this></RetrieveServiceContent>")
                    .await?;
                ServiceContent::from_answer(&r)
            })
            .await
    }

    /// `SessionManager.Login` with the source's current credentials (a new session even if
    /// one exists; the login back-off applies).
    pub async fn login(&self) -> Result<(), Error> {
        self.session.lock().await.logged_out();
        self.ensure_session(None).await.map(|_| ())
    }

    /// `SessionManager.Logout` (errors ignored).
    pub async fn logout(&self) {
        let mut g = self.session.lock().await;
        if !g.active {
            return;
        }
        if let Ok(sc) = self.service_content().await {
            let _ = self
                .post(&format!(
                    "<Logout xmlns=\"urn:vim25\">{}</Logout>",
                    sc.session_manager.to_xml("_this")
                ))
                .await;
        }
        g.logged_out();
    }

    /// `SessionManager.SessionIsActive`-equivalent: whether a cheap authenticated call works.
    pub async fn session_is_active(&self) -> bool {
        let Ok(sc) = self.service_content().await else {
            return false;
        };
        let body = format!(
            "<RetrievePropertiesEx xmlns=\"urn:vim25\">{}<specSet><propSet><type>SessionManager</type><pathSet>currentSession</pathSet></propSet><objectSet>{}</objectSet></specSet><options></options></RetrievePropertiesEx>",
            sc.property_collector.to_xml("_this"),
            sc.session_manager.to_xml("obj")
        );
        self.post(&body).await.is_ok_and(|r| r.find("userName").is_some())
    }

    /// The user name of this client's session (`SessionManager.currentSession.userName`;
    /// logs in first if needed).
    pub async fn current_user(&self) -> Result<String, Error> {
        let sc = self.service_content().await?;
        let body = format!(
            "<RetrievePropertiesEx xmlns=\"urn:vim25\">{}<specSet><propSet><type>SessionManager</type><pathSet>currentSession</pathSet></propSet><objectSet>{}</objectSet></specSet><options></options></RetrievePropertiesEx>",
            sc.property_collector.to_xml("_this"),
            sc.session_manager.to_xml("obj")
        );
        let answer = self.call(&body).await?;
        answer
            .find("userName")
            .map(|e| e.text.trim().to_string())
            .filter(|u| !u.is_empty())
            .ok_or_else(|| Error::Response("SessionManager.currentSession has no userName".into()))
    }

    /// `AuthorizationManager.FetchUserPrivilegeOnEntities`: the privileges `user` holds on each
    /// of `entities` (in the order vCenter answers).
    pub async fn user_privileges(
        &self,
        entities: &[MoRef],
        user: &str,
    ) -> Result<Vec<(MoRef, Vec<String>)>, Error> {
        let sc = self.service_content().await?;
        let authz = sc
            .authorization_manager
            .as_ref()
            .ok_or_else(|| Error::Response("ServiceContent without authorizationManager".into()))?;
        let body = format!(
            "<FetchUserPrivilegeOnEntities xmlns=\"urn:vim25\">{}{}<userName>{}</userName></FetchUserPrivilegeOnEntities>",
            authz.to_xml("_this"),
            entities.iter().map(|e| e.to_xml("entities")).collect::<String>(),
            escape(user)
        );
        let answer = self.call(&body).await?;
        Ok(answer
            .children_named("returnval")
            .filter_map(|r| {
                let entity = r.child("entity").and_then(MoRef::from_element)?;
                let privileges = r
                    .children_named("privileges")
                    .map(|p| p.text.trim().to_string())
                    .collect();
                Some((entity, privileges))
            })
            .collect())
    }

    /// Sends a call that needs a session, logging in first if needed and once more when the
    /// session has expired (`NotAuthenticated`); concurrent callers share that re-login.
    async fn call(&self, body: &str) -> Result<Element, Error> {
        let generation = self.ensure_session(None).await?;
        match self.post(body).await {
            Err(Error::Fault(f)) if f.kind == "NotAuthenticated" => {
                debug!(url = %self.sdk_url, "vCenter session expired; logging in again");
                self.ensure_session(Some(generation)).await?;
                self.post(body).await
            }
            other => other,
        }
    }

    /// Logs in unless a session is active that is not the `stale` one (another task logged in
    /// meanwhile); returns the session generation. Rejected credentials are not sent again
    /// before their back-off ends ([`LoginGate`]).
    async fn ensure_session(&self, stale: Option<u64>) -> Result<u64, Error> {
        let sc = self.service_content().await?;
        let mut g = self.session.lock().await;
        if !g.needs_login(stale) {
            return Ok(g.generation);
        }
        g.logged_out();
        let credentials = self.credentials.get(g.last_rejected()).await?;
        g.check(&self.sdk_url, &credentials, Instant::now())?;
        let body = format!(
            "<Login xmlns=\"urn:vim25\">{}<userName>{}</userName><password>{}</password></Login>",
            sc.session_manager.to_xml("_this"),
            escape(&credentials.username),
            escape(credentials.password.expose())
        );
        self.logins.fetch_add(1, Ordering::SeqCst);
        match self.post(&body).await {
            Ok(_) => {
                g.succeeded();
                info!(url = %self.sdk_url, user = %credentials.username, "logged in to vCenter");
                Ok(g.generation)
            }
            Err(e) => {
                let rejected = e.is_fault("InvalidLogin") || e.is_fault("NoPermission");
                warn!(url = %self.sdk_url, user = %credentials.username, error = %e, "vCenter login failed");
                g.failed(&credentials, rejected, &e, Instant::now());
                Err(e)
            }
        }
    }

    fn search_body(
        &self,
        sc: &ServiceContent,
        method: &str,
        datacenter: Option<&MoRef>,
        args: &str,
    ) -> String {
        format!(
            "<{method} xmlns=\"urn:vim25\">{}{}{args}</{method}>",
            sc.search_index.to_xml("_this"),
            datacenter.map(|d| d.to_xml("datacenter")).unwrap_or_default()
        )
    }

    /// `SearchIndex.FindByUuid` for a VM by BIOS UUID (or instance UUID).
    pub async fn find_by_uuid(
        &self,
        datacenter: Option<&MoRef>,
        uuid: &str,
        instance_uuid: bool,
    ) -> Result<Option<MoRef>, Error> {
        let sc = self.service_content().await?.clone();
        let args = format!(
            "<uuid>{}</uuid><vmSearch>true</vmSearch><instanceUuid>{instance_uuid}</instanceUuid>",
            escape(uuid)
        );
        let r = self
            .call(&self.search_body(&sc, "FindByUuid", datacenter, &args))
            .await?;
        Ok(r.child("returnval").and_then(MoRef::from_element))
    }

    /// `SearchIndex.FindAllByDnsName` for VMs whose guest reports this host name.
    pub async fn find_all_by_dns_name(
        &self,
        datacenter: Option<&MoRef>,
        name: &str,
    ) -> Result<Vec<MoRef>, Error> {
        let sc = self.service_content().await?.clone();
        let args = format!("<dnsName>{}</dnsName><vmSearch>true</vmSearch>", escape(name));
        let r = self
            .call(&self.search_body(&sc, "FindAllByDnsName", datacenter, &args))
            .await?;
        Ok(r.children_named("returnval")
            .filter_map(MoRef::from_element)
            .collect())
    }

    /// `SearchIndex.FindByIp` for a VM with this guest IP.
    pub async fn find_by_ip(&self, datacenter: Option<&MoRef>, ip: &str) -> Result<Option<MoRef>, Error> {
        let sc = self.service_content().await?.clone();
        let args = format!("<ip>{}</ip><vmSearch>true</vmSearch>", escape(ip));
        let r = self
            .call(&self.search_body(&sc, "FindByIp", datacenter, &args))
            .await?;
        Ok(r.child("returnval").and_then(MoRef::from_element))
    }

    /// `RetrievePropertiesEx` (+ `ContinueRetrievePropertiesEx`) with an object spec XML.
    async fn retrieve(
        &self,
        type_: &str,
        paths: &[&str],
        object_set: &str,
    ) -> Result<Vec<(MoRef, PropertySet)>, Error> {
        let sc = self.service_content().await?.clone();
        let path_set: String = paths
            .iter()
            .map(|p| format!("<pathSet>{}</pathSet>", escape(p)))
            .collect();
        let body = format!(
            "<RetrievePropertiesEx xmlns=\"urn:vim25\">{}<specSet><propSet><type>{}</type>{path_set}</propSet>{object_set}</specSet><options></options></RetrievePropertiesEx>",
            sc.property_collector.to_xml("_this"),
            escape(type_)
        );
        let mut out = Vec::new();
        let mut token = read_retrieve_result(&self.call(&body).await?, &mut out);
        while let Some(t) = token {
            let body = format!(
                "<ContinueRetrievePropertiesEx xmlns=\"urn:vim25\">{}<token>{}</token></ContinueRetrievePropertiesEx>",
                sc.property_collector.to_xml("_this"),
                escape(&t)
            );
            let r = self.call(&body).await?;
            // ContinueRetrievePropertiesEx answers a RetrieveResult directly in returnval.
            token = read_retrieve_result(&r, &mut out);
        }
        Ok(out)
    }

    /// Named properties of one object. A deleted object is a `ManagedObjectNotFound` fault.
    pub async fn retrieve_properties(&self, obj: &MoRef, paths: &[&str]) -> Result<PropertySet, Error> {
        let objects = self
            .retrieve(
                &obj.kind,
                paths,
                &format!("<objectSet>{}</objectSet>", obj.to_xml("obj")),
            )
            .await?;
        Ok(objects.into_iter().next().map(|(_, s)| s).unwrap_or_default())
    }

    /// Every object of `type_` under the root folder, with named properties (a container view,
    /// destroyed afterwards).
    pub async fn list_objects(
        &self,
        type_: &str,
        paths: &[&str],
    ) -> Result<Vec<(MoRef, PropertySet)>, Error> {
        let sc = self.service_content().await?.clone();
        let body = format!(
            "<CreateContainerView xmlns=\"urn:vim25\">{}{}<type>{}</type><recursive>true</recursive></CreateContainerView>",
            sc.view_manager.to_xml("_this"),
            sc.root_folder.to_xml("container"),
            escape(type_)
        );
        let r = self.call(&body).await?;
        let view = r
            .child("returnval")
            .and_then(MoRef::from_element)
            .ok_or_else(|| Error::Response("CreateContainerView: no view".into()))?;
        let object_set = format!(
            "<objectSet>{}<skip>true</skip><selectSet xsi:type=\"TraversalSpec\"><type>ContainerView</type><path>view</path><skip>false</skip></selectSet></objectSet>",
            view.to_xml("obj")
        );
        let result = self.retrieve(type_, paths, &object_set).await;
        let _ = self
            .call(&format!(
                "<DestroyView xmlns=\"urn:vim25\">{}</DestroyView>",
                view.to_xml("_this")
            ))
            .await;
        result
    }

    /// The `parent` of every object on the way from each of `objects` to the root, in one
    /// `RetrievePropertiesEx` (a `TraversalSpec` that follows `parent` recursively, as
    /// govmomi's `mo.Ancestors` does). The root folder maps to `None`.
    pub async fn parents(&self, objects: &[MoRef]) -> Result<BTreeMap<MoRef, Option<MoRef>>, Error> {
        Ok(self
            .ancestry(objects)
            .await?
            .into_iter()
            .map(|(obj, (parent, _))| (obj, parent))
            .collect())
    }

    /// As [`Client::parents`], with each object's `name` too.
    pub async fn ancestry(
        &self,
        objects: &[MoRef],
    ) -> Result<BTreeMap<MoRef, (Option<MoRef>, Option<String>)>, Error> {
        if objects.is_empty() {
            return Ok(BTreeMap::new());
        }
        let object_sets: String = objects
            .iter()
            .map(|o| {
                format!(
                    "<objectSet>{}<skip>false</skip><selectSet xsi:type=\"TraversalSpec\"><name>traverseParent</name><type>ManagedEntity</type><path>parent</path><skip>false</skip><selectSet><name>traverseParent</name></selectSet></selectSet></objectSet>",
                    o.to_xml("obj")
                )
            })
            .collect();
        let found = self
            .retrieve("ManagedEntity", &["parent", "name"], &object_sets)
            .await?;
        Ok(found
            .into_iter()
            .map(|(obj, props)| (obj, (props.moref("parent"), props.string("name"))))
            .collect())
    }

    /// The chain from `obj` up to the root (`obj` first), from a [`Client::parents`] map.
    pub fn chain(parents: &BTreeMap<MoRef, Option<MoRef>>, obj: &MoRef) -> Vec<MoRef> {
        let mut chain = vec![obj.clone()];
        let mut current = obj.clone();
        while let Some(Some(parent)) = parents.get(&current) {
            if chain.contains(parent) || chain.len() > 64 {
                break;
            }
            chain.push(parent.clone());
            current = parent.clone();
        }
        chain
    }

    /// The object and its ancestors (`parent`, or `resourcePool`'s parents), up to the root.
    pub async fn ancestors(&self, obj: &MoRef) -> Result<Vec<MoRef>, Error> {
        let mut chain = vec![obj.clone()];
        let mut current = obj.clone();
        for _ in 0..64 {
            let props = self.retrieve_properties(&current, &["parent"]).await?;
            match props.moref("parent") {
                Some(parent) => {
                    chain.push(parent.clone());
                    current = parent;
                }
                None => return Ok(chain),
            }
        }
        Err(Error::Response(format!(
            "ancestor chain of {obj} is longer than 64 objects"
        )))
    }
}

/// Reads the answer to `RetrievePropertiesEx` / `ContinueRetrievePropertiesEx`: each object
/// with its properties appended to `out` (objects without a readable reference skipped), and
/// the continuation token, if any.
pub fn read_retrieve_result(r: &Element, out: &mut Vec<(MoRef, PropertySet)>) -> Option<String> {
    let rv = r.child("returnval")?;
    for o in rv.children_named("objects") {
        let Some(obj) = o.child("obj").and_then(MoRef::from_element) else {
            continue;
        };
        let mut set = PropertySet::default();
        for p in o.children_named("propSet") {
            if let (Some(name), Some(val)) = (p.child_text("name"), p.child("val")) {
                set.props.insert(name.to_string(), val.clone());
            }
        }
        out.push((obj, set));
    }
    rv.child_text("token").map(str::to_string)
}

/// Reads a SOAP answer (HTTP `status`, body `text`, from `url`): the first element of the
/// `Body`, or the typed [`SoapFault`] it carries, or an error saying what is wrong with it.
/// Never panics, whatever the bytes (fuzzed by `fuzz/fuzz_targets/vsphere_soap.rs`).
pub fn read_answer(url: &str, status: u16, text: &str) -> Result<Element, Error> {
    let root = match xml::parse(text) {
        Ok(r) => r,
        Err(_) if !(200..300).contains(&status) => {
            return Err(Error::Status {
                url: url.to_string(),
                status,
                body: text.chars().take(200).collect(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let body = root
        .child("Body")
        .ok_or_else(|| Error::Response("SOAP answer without Body".into()))?;
    if let Some(fault) = body.child("Fault") {
        let detail = fault.child("detail").and_then(|d| d.children.first());
        let kind = detail
            .and_then(|d| {
                d.xsi_type
                    .clone()
                    .or_else(|| Some(d.name.trim_end_matches("Fault").to_string()))
            })
            .unwrap_or_else(|| fault.child_text("faultcode").unwrap_or_default().to_string());
        return Err(Error::Fault(SoapFault {
            kind,
            message: fault.child_text("faultstring").unwrap_or_default().to_string(),
        }));
    }
    if !(200..300).contains(&status) {
        return Err(Error::Status {
            url: url.to_string(),
            status,
            body: text.chars().take(200).collect(),
        });
    }
    body.children
        .first()
        .cloned()
        .ok_or_else(|| Error::Response("empty SOAP Body".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn property_sets_read_typed_values() {
        let doc = r#"<R><returnval><objects><obj type="VirtualMachine">vm-1</obj>
            <propSet><name>summary.config.uuid</name><val xsi:type="xsd:string">4211ab</val></propSet>
            <propSet><name>summary.config.numCpu</name><val xsi:type="xsd:int">4</val></propSet>
            <propSet><name>runtime.host</name><val XMLSchema-instance:type="ManagedObjectReference" type="HostSystem">host-9</val></propSet>
            <propSet><name>guest.net</name><val xsi:type="ArrayOfGuestNicInfo">
              <GuestNicInfo><network>VM Network</network><ipAddress>10.0.0.5</ipAddress><macAddress>00:50:56:01:02:03</macAddress><deviceConfigId>4000</deviceConfigId></GuestNicInfo>
              <GuestNicInfo><ipAddress>172.17.0.1</ipAddress><deviceConfigId>-1</deviceConfigId></GuestNicInfo>
            </val></propSet></objects><token>t1</token></returnval></R>"#;
        let mut out = Vec::new();
        let token = read_retrieve_result(&xml::parse(doc).unwrap(), &mut out);
        assert_eq!(token.as_deref(), Some("t1"));
        let (obj, p) = &out[0];
        assert_eq!(obj, &MoRef::new("VirtualMachine", "vm-1"));
        assert_eq!(p.string("summary.config.uuid").as_deref(), Some("4211ab"));
        assert_eq!(p.int("summary.config.numCpu"), Some(4));
        assert_eq!(p.moref("runtime.host"), Some(MoRef::new("HostSystem", "host-9")));
        let nics = p.guest_nics("guest.net");
        assert_eq!(nics.len(), 2);
        assert_eq!(nics[0].network, "VM Network");
        assert_eq!(nics[1].device_config_id, -1);
        assert!(!p.has("guest.hostName"));
    }
}
