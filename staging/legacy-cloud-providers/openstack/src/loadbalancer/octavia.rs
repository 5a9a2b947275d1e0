//! Octavia's objects and the waits for its asynchronous changes.

use std::time::{Duration, Instant};

use k8s_cloud_provider::{CloudError, CloudResult};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    OpenStackCloud,
    client::{Service, query_escape},
    cloud_error,
};

/// An Octavia load balancer.
#[derive(Debug, Clone, Deserialize)]
pub struct OctaviaLoadBalancer {
    /// UUID.
    pub id: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// `ACTIVE`, `PENDING_*`, `ERROR`, `DELETED`.
    #[serde(default)]
    pub provisioning_status: String,
    /// VIP address.
    #[serde(default)]
    pub vip_address: String,
    /// VIP port.
    #[serde(default)]
    pub vip_port_id: String,
    /// VIP subnet.
    #[serde(default)]
    pub vip_subnet_id: String,
    /// Tags (OCCM tags a load balancer with the names of the Services it serves).
    #[serde(default)]
    pub tags: Vec<String>,
}

impl OctaviaLoadBalancer {
    /// Whether Octavia reports it in `ERROR`.
    pub fn is_error(&self) -> bool {
        self.provisioning_status == "ERROR"
    }
}

/// A listener.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Listener {
    pub(super) id: String,
    pub(super) protocol: String,
    pub(super) protocol_port: i32,
    #[serde(default)]
    pub(super) default_pool_id: Option<String>,
    #[serde(default)]
    pub(super) allowed_cidrs: Option<Vec<String>>,
    /// The names of the Services that made it (OCCM tags a listener with its Service's load
    /// balancer name; older ones have none).
    #[serde(default)]
    pub(super) tags: Vec<String>,
    /// `X-Forwarded-For` and such, on HTTP listeners.
    #[serde(default)]
    pub(super) insert_headers: Option<serde_json::Map<String, Value>>,
    /// The certificate of a `TERMINATED_HTTPS` listener.
    #[serde(default)]
    pub(super) default_tls_container_ref: Option<String>,
    /// Every other field (`connection_limit`, `timeout_*`, …), compared with what is wanted.
    #[serde(flatten)]
    pub(super) settings: serde_json::Map<String, Value>,
}

/// A pool.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Pool {
    pub(super) id: String,
    #[serde(default)]
    pub(super) protocol: String,
    #[serde(default)]
    pub(super) lb_algorithm: String,
    #[serde(default)]
    pub(super) healthmonitor_id: Option<String>,
    /// `{"type": "SOURCE_IP", …}` or null.
    #[serde(default)]
    pub(super) session_persistence: Option<serde_json::Value>,
}

impl Pool {
    /// The session persistence type, if any.
    pub(super) fn persistence_type(&self) -> Option<&str> {
        self.session_persistence.as_ref()?.get("type")?.as_str()
    }
}

/// A pool member.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Member {
    #[serde(default)]
    pub(super) name: String,
    pub(super) address: String,
    pub(super) protocol_port: i32,
    #[serde(default)]
    pub(super) subnet_id: Option<String>,
    /// The port health checks go to (`healthCheckNodePort`), if not the member's own.
    #[serde(default)]
    pub(super) monitor_port: Option<i32>,
}

pub(super) const LBAAS: &str = "/v2/lbaas";

/// Octavia API features that OCCM checks by the API version before it uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OctaviaFeature {
    /// Listener timeouts (2.1).
    Timeouts,
    /// Tags on load balancers and listeners (2.5): shared load balancers need them.
    Tags,
    /// `allowed_cidrs` on listeners (2.12): `loadBalancerSourceRanges`.
    VipAcl,
    /// HTTP health monitors on UDP pools (2.16).
    HttpMonitorsOnUdp,
    /// Octavia flavors (2.6): `flavor-id`.
    Flavors,
    /// Availability zones (2.14): `availability-zone`.
    AvailabilityZones,
}

impl OctaviaFeature {
    /// The first Octavia API version `(2, minor)` with the feature.
    pub fn since(self) -> (u32, u32) {
        match self {
            Self::Timeouts => (2, 1),
            Self::Tags => (2, 5),
            Self::VipAcl => (2, 12),
            Self::HttpMonitorsOnUdp => (2, 16),
            Self::Flavors => (2, 6),
            Self::AvailabilityZones => (2, 14),
        }
    }

    /// Whether the OVN provider lacks it whatever the API version (as OCCM).
    fn ovn_lacks(self) -> bool {
        !matches!(self, Self::Tags)
    }
}

/// The highest `vMAJOR.MINOR` of Octavia's version document (`GET /`).
pub fn octavia_api_version(doc: &Value) -> Option<(u32, u32)> {
    doc.get("versions")?
        .as_array()?
        .iter()
        .filter_map(|v| {
            let id = v.get("id")?.as_str()?.strip_prefix('v')?;
            let (major, minor) = id.split_once('.')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        })
        .max()
}

impl OpenStackCloud {
    /// Whether this Octavia (and `[LoadBalancer] lb-provider`) has `feature`. The version is
    /// read once; a failure to read it is an error (retried), never taken for "no".
    pub async fn octavia_supports(&self, feature: OctaviaFeature) -> CloudResult<bool> {
        if self.config.load_balancer.lb_provider == "ovn" && feature.ovn_lacks() {
            return Ok(false);
        }
        let version = self
            .octavia_version
            .get_or_try_init(|| async {
                let doc = self
                    .client
                    .get(Service::LoadBalancer, "/")
                    .await
                    .map_err(|e| cloud_error("reading Octavia's API versions", e))?;
                octavia_api_version(&doc).ok_or_else(|| {
                    CloudError::msg(format!(
                        "Octavia's version document names no API version: {}",
                        crate::client::summary(&doc)
                    ))
                })
            })
            .await?;
        Ok(*version >= feature.since())
    }

    /// The load balancer with this ID (`None`: it does not exist or is `DELETED`).
    pub(super) async fn load_balancer_by_id(&self, id: &str) -> CloudResult<Option<OctaviaLoadBalancer>> {
        match self
            .client
            .get_as::<OctaviaLoadBalancer>(
                Service::LoadBalancer,
                &format!("{LBAAS}/loadbalancers/{}", query_escape(id)),
                "loadbalancer",
            )
            .await
        {
            Ok(lb) if lb.provisioning_status == "DELETED" => Ok(None),
            Ok(lb) => Ok(Some(lb)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(cloud_error(format!("reading load balancer {id}"), e)),
        }
    }

    /// The load balancer named exactly `name` (not `DELETED`); two of that name are an error.
    pub(super) async fn find_load_balancer(&self, name: &str) -> CloudResult<Option<OctaviaLoadBalancer>> {
        let path = format!("{LBAAS}/loadbalancers?name={}", query_escape(name));
        let mut lbs: Vec<OctaviaLoadBalancer> = self
            .client
            .list(Service::LoadBalancer, &path, "loadbalancers")
            .await
            .map_err(|e| cloud_error(format!("listing load balancers named {name}"), e))?;
        lbs.retain(|lb| lb.name == name && lb.provisioning_status != "DELETED");
        match lbs.len() {
            0 => Ok(None),
            1 => Ok(lbs.pop()),
            n => Err(CloudError::msg(format!(
                "{n} Octavia load balancers are named {name}; delete the extra ones by hand"
            ))),
        }
    }

    /// Waits until the load balancer is `ACTIVE` (or gone, with `gone_ok`); `ERROR` is an
    /// error naming it.
    pub(super) async fn wait_active(
        &self,
        id: &str,
        gone_ok: bool,
    ) -> CloudResult<Option<OctaviaLoadBalancer>> {
        match self.wait_settled(id).await? {
            Some(lb) if lb.is_error() => Err(CloudError::msg(format!(
                "Octavia load balancer {id} is in ERROR (see Octavia's logs for why)"
            ))),
            Some(lb) => Ok(Some(lb)),
            None if gone_ok => Ok(None),
            None => Err(CloudError::msg(format!("Octavia load balancer {id} disappeared"))),
        }
    }

    /// Waits (at most [`super::PROVISIONING_TIMEOUT`], or as `OCCM_WAIT_LB_ACTIVE_STEPS` says)
    /// until the load balancer is no longer
    /// `PENDING_*`: `ACTIVE` or `ERROR` (returned), or gone (`None`).
    pub(super) async fn wait_settled(&self, id: &str) -> CloudResult<Option<OctaviaLoadBalancer>> {
        let start = Instant::now();
        let mut delay = Duration::from_millis(200);
        // A wait that lasts is said, every 30 s, with the state it is in: an Octavia whose
        // worker does not move a load balancer on is then visible in the CCM's log.
        let mut next_report = Duration::from_secs(30);
        loop {
            let path = format!("{LBAAS}/loadbalancers/{id}");
            match self
                .client
                .get_as::<OctaviaLoadBalancer>(Service::LoadBalancer, &path, "loadbalancer")
                .await
            {
                Ok(lb) if lb.provisioning_status == "DELETED" => return Ok(None),
                Ok(lb) if !lb.provisioning_status.starts_with("PENDING_") => return Ok(Some(lb)),
                Ok(lb) => {
                    if start.elapsed() >= next_report {
                        tracing::info!(
                            lb = id,
                            provisioning_status = %lb.provisioning_status,
                            waited_s = start.elapsed().as_secs(),
                            limit_s = self.lb_wait.as_secs(),
                            "still waiting for the Octavia load balancer to leave its PENDING state"
                        );
                        next_report += Duration::from_secs(30);
                    }
                }
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(cloud_error(format!("reading load balancer {id}"), e)),
            }
            if start.elapsed() > self.lb_wait {
                return Err(CloudError::retry_after(
                    format!(
                        "Octavia load balancer {id} is still provisioning after {:.1} s",
                        self.lb_wait.as_secs_f64()
                    ),
                    Duration::from_secs(30),
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(3));
        }
    }

    /// Deletes the load balancer `lb` (waited out of `PENDING_*` first; `ACTIVE` or `ERROR`)
    /// and waits until it is gone. With `cascade` Octavia deletes its listeners, pools,
    /// members and monitors itself; without (`cascade-delete = false`: an Octavia provider
    /// without cascade deletion) each pool and listener is deleted first, as OCCM does.
    pub(crate) async fn delete_load_balancer(
        &self,
        lb: &OctaviaLoadBalancer,
        cascade: bool,
    ) -> CloudResult<()> {
        let Some(lb) = self.wait_settled(&lb.id).await? else {
            return Ok(());
        };
        if !cascade {
            let listeners: Vec<Listener> = self
                .client
                .list(
                    Service::LoadBalancer,
                    &format!("{LBAAS}/listeners?loadbalancer_id={}", query_escape(&lb.id)),
                    "listeners",
                )
                .await
                .map_err(|e| cloud_error(format!("listing listeners of {}", lb.id), e))?;
            for l in &listeners {
                if let Some(pool) = l.default_pool_id.as_deref().filter(|p| !p.is_empty()) {
                    self.delete_child(&lb.id, &format!("{LBAAS}/pools/{pool}"), "pool")
                        .await?;
                }
                self.delete_child(&lb.id, &format!("{LBAAS}/listeners/{}", l.id), "listener")
                    .await?;
            }
            // Pools without a listener (a create that failed half-way).
            let pools: Vec<Pool> = self
                .client
                .list(
                    Service::LoadBalancer,
                    &format!("{LBAAS}/pools?loadbalancer_id={}", query_escape(&lb.id)),
                    "pools",
                )
                .await
                .map_err(|e| cloud_error(format!("listing pools of {}", lb.id), e))?;
            for p in &pools {
                self.delete_child(&lb.id, &format!("{LBAAS}/pools/{}", p.id), "pool")
                    .await?;
            }
        }
        let cascade = if cascade { "?cascade=true" } else { "" };
        match self
            .client
            .delete(
                Service::LoadBalancer,
                &format!("{LBAAS}/loadbalancers/{}{cascade}", lb.id),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => {
                return Err(cloud_error(
                    format!("deleting load balancer {} ({})", lb.name, lb.id),
                    e,
                ));
            }
        }
        if self.wait_settled(&lb.id).await?.is_some() {
            return Err(CloudError::retry_after(
                format!(
                    "Octavia did not delete load balancer {} ({}): it is still there, deletion retried",
                    lb.name, lb.id
                ),
                Duration::from_secs(10),
            ));
        }
        Ok(())
    }

    /// Deletes one child of `lb_id` (gone already is fine) and waits until the load balancer is
    /// out of `PENDING_*` (`ACTIVE` or `ERROR`).
    async fn delete_child(&self, lb_id: &str, path: &str, what: &str) -> CloudResult<()> {
        match self.client.delete(Service::LoadBalancer, path).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => {
                return Err(cloud_error(
                    format!("deleting {what} of load balancer {lb_id}"),
                    e,
                ));
            }
        }
        self.wait_settled(lb_id).await?;
        Ok(())
    }

    /// The listeners of the load balancer `lb_id`.
    pub(super) async fn listeners_of(&self, lb_id: &str) -> CloudResult<Vec<Listener>> {
        self.client
            .list(
                Service::LoadBalancer,
                &format!("{LBAAS}/listeners?loadbalancer_id={}", query_escape(lb_id)),
                "listeners",
            )
            .await
            .map_err(|e| cloud_error(format!("listing listeners of {lb_id}"), e))
    }

    /// Deletes a listener of `lb_id` with its default pool (its members and monitor go with
    /// it): the pool first, then the listener, each waited out.
    pub(super) async fn delete_listener(&self, lb_id: &str, l: &Listener) -> CloudResult<()> {
        if let Some(pool) = l.default_pool_id.as_deref().filter(|p| !p.is_empty()) {
            self.lb_delete(lb_id, &format!("{LBAAS}/pools/{pool}"), "pool")
                .await?;
        }
        self.lb_delete(lb_id, &format!("{LBAAS}/listeners/{}", l.id), "listener")
            .await
    }

    /// Creates a child of `lb_id` and waits until the load balancer is `ACTIVE` again.
    pub(super) async fn lb_post(
        &self,
        lb_id: &str,
        path: &str,
        body: Value,
        what: &str,
    ) -> CloudResult<Value> {
        let v = self
            .client
            .post(Service::LoadBalancer, path, &body)
            .await
            .map_err(|e| cloud_error(format!("creating {what}"), e))?;
        self.wait_active(lb_id, false).await?;
        Ok(v)
    }

    /// Updates a child of `lb_id` and waits until the load balancer is `ACTIVE` again.
    pub(super) async fn lb_put(&self, lb_id: &str, path: &str, body: Value, what: &str) -> CloudResult<()> {
        self.client
            .put(Service::LoadBalancer, path, &body)
            .await
            .map_err(|e| cloud_error(format!("updating {what}"), e))?;
        self.wait_active(lb_id, false).await?;
        Ok(())
    }

    /// Deletes a child of `lb_id` and waits until the load balancer is `ACTIVE` again.
    pub(super) async fn lb_delete(&self, lb_id: &str, path: &str, what: &str) -> CloudResult<()> {
        self.client
            .delete(Service::LoadBalancer, path)
            .await
            .map_err(|e| cloud_error(format!("deleting {what}"), e))?;
        self.wait_active(lb_id, false).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_version_is_the_highest_listed() {
        let doc = serde_json::json!({"versions": [
            {"id": "v2.0", "status": "SUPPORTED"},
            {"id": "v2.27", "status": "CURRENT"},
            {"id": "v2.9", "status": "SUPPORTED"},
            {"id": "weird"}
        ]});
        assert_eq!(octavia_api_version(&doc), Some((2, 27)));
        assert_eq!(octavia_api_version(&serde_json::json!({"versions": []})), None);
        assert_eq!(octavia_api_version(&serde_json::json!({})), None);
        assert!((2, 27) >= OctaviaFeature::VipAcl.since());
        assert!((2, 4) < OctaviaFeature::Tags.since());
    }
}
