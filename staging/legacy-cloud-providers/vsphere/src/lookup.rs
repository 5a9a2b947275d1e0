//! Finding a node's VM (VS-15): by its UUIDs (both byte orders), DNS name or IP, in every
//! vCenter at once, each within [`VCENTER_LOOKUP_DEADLINE`]; "gone" only when every vCenter
//! and datacenter answered.

use super::*;

/// A VM found for a node.
#[derive(Debug, Clone)]
pub(crate) struct VmRef {
    pub(crate) vcenter: usize,
    pub(crate) vm: MoRef,
}

/// The outcome of a complete search.
#[derive(Debug)]
pub(crate) enum Lookup {
    Found(VmRef),
    /// Every configured vCenter and datacenter answered, and none knows the VM.
    Gone,
}

impl VsphereCloud {
    /// The UUIDs to look a node up by: its providerID's, or its `systemUUID` in both byte
    /// orders (VS-02). A malformed providerID or `systemUUID` is an error: a search for
    /// garbage finding nothing proves nothing.
    pub(crate) fn node_uuids(node: &Node) -> CloudResult<Vec<String>> {
        let pid = provider_id(node);
        if !pid.is_empty() {
            return Ok(vec![uuid_from_provider_id(pid).map_err(CloudError::msg)?]);
        }
        let sys = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.system_uuid.trim().to_ascii_lowercase())
            .unwrap_or_default();
        if sys.is_empty() {
            return Ok(Vec::new());
        }
        match swap_uuid_byte_order(&sys) {
            Some(swapped) => Ok(vec![swapped, sys]),
            None => Err(CloudError::msg(format!(
                "node {}: status.nodeInfo.systemUUID {sys:?} is not a UUID",
                node_name(node)
            ))),
        }
    }

    /// Finds the VM of a node in every vCenter and datacenter. [`Lookup::Gone`] only when the
    /// search covered every configured vCenter and datacenter without an error; a vCenter
    /// that fails does not stop the search in the others, but then "not found" is an error.
    pub(crate) async fn find_vm(&self, node: &Node) -> CloudResult<Lookup> {
        use futures::stream::{FuturesUnordered, StreamExt};
        let name = node_name(node);
        let uuids = Self::node_uuids(node)?;
        let mut failures: Vec<String> = Vec::new();
        let all = 0..self.vcenters.len();
        if !uuids.is_empty() {
            // Every vCenter at once, each within its deadline; the first to find the VM answers.
            let mut searches: FuturesUnordered<_> = all
                .map(|i| {
                    let uuids = &uuids;
                    async move { (i, self.within_deadline(i, self.find_by_uuids(i, uuids)).await) }
                })
                .collect();
            while let Some((i, result)) = searches.next().await {
                match result {
                    Ok(Some(vm)) => return Ok(Lookup::Found(VmRef { vcenter: i, vm })),
                    Ok(None) => {}
                    Err(e) => failures.push(format!("vCenter {}: {e}", self.vcenters[i].label)),
                }
            }
            return Self::not_found(name, failures);
        }
        // By guest host name (every vCenter must answer: a second VM of that name could be in
        // any of them), then by IP (the node name used as one).
        let answers = futures::future::join_all(
            all.clone()
                .map(|i| self.within_deadline(i, self.find_by_dns_name(i, name))),
        )
        .await;
        let mut by_name = Vec::new();
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(vms) => by_name.extend(vms.into_iter().map(|vm| VmRef { vcenter: i, vm })),
                Err(e) => failures.push(format!("vCenter {}: {e}", self.vcenters[i].label)),
            }
        }
        match by_name.len() {
            // A second VM with this name could be in a vCenter that did not answer.
            1 if failures.is_empty() => return Ok(Lookup::Found(by_name.remove(0))),
            0 => {}
            n => {
                return Err(CloudError::msg(format!(
                    "node {name}: {n} VMs report this guest host name ({}){}; set the node's providerID or make host names unique",
                    by_name
                        .iter()
                        .map(|v| v.vm.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    if failures.is_empty() {
                        String::new()
                    } else {
                        format!(" and other vCenters did not answer: {}", failures.join("; "))
                    }
                )));
            }
        }
        if name.parse::<IpAddr>().is_ok() {
            let mut searches: FuturesUnordered<_> = all
                .map(|i| async move { (i, self.within_deadline(i, self.find_by_ip(i, name)).await) })
                .collect();
            while let Some((i, result)) = searches.next().await {
                match result {
                    Ok(Some(vm)) => return Ok(Lookup::Found(VmRef { vcenter: i, vm })),
                    Ok(None) => {}
                    Err(e) => failures.push(format!("vCenter {}: {e}", self.vcenters[i].label)),
                }
            }
        }
        Self::not_found(name, failures)
    }

    /// One vCenter's part of a look-up, bounded by [`VCENTER_LOOKUP_DEADLINE`].
    pub(crate) async fn within_deadline<T>(
        &self,
        i: usize,
        search: impl Future<Output = CloudResult<T>>,
    ) -> CloudResult<T> {
        let vc = &self.vcenters[i];
        let paused = *vc.unresponsive_until.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(until) = paused
            && std::time::Instant::now() < until
        {
            return Err(CloudError::msg(format!(
                "vCenter {} missed the {VCENTER_LOOKUP_DEADLINE:?} look-up deadline less than {VCENTER_UNRESPONSIVE_PAUSE:?} ago: not asked again yet",
                vc.label
            )));
        }
        match tokio::time::timeout(VCENTER_LOOKUP_DEADLINE, search).await {
            Ok(result) => result,
            Err(_) => {
                *vc.unresponsive_until.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(std::time::Instant::now() + VCENTER_UNRESPONSIVE_PAUSE);
                Err(CloudError::msg(format!(
                    "no answer from vCenter {} within {VCENTER_LOOKUP_DEADLINE:?}",
                    vc.label
                )))
            }
        }
    }

    pub(crate) fn not_found(name: &str, failures: Vec<String>) -> CloudResult<Lookup> {
        if failures.is_empty() {
            Ok(Lookup::Gone)
        } else {
            Err(CloudError::msg(format!(
                "node {name}: VM not found, and the search was incomplete, so it may still exist: {}",
                failures.join("; ")
            )))
        }
    }

    pub(crate) async fn find_by_uuids(&self, i: usize, uuids: &[String]) -> CloudResult<Option<MoRef>> {
        let (soap, _) = self.clients(i).await?;
        for dc in &self.datacenters(i).await? {
            for uuid in uuids {
                if let Some(vm) = soap
                    .find_by_uuid(Some(dc), uuid, false)
                    .await
                    .map_err(|e| api_err(format!("FindByUuid {uuid}"), e))?
                {
                    return Ok(Some(vm));
                }
            }
        }
        Ok(None)
    }

    pub(crate) async fn find_by_dns_name(&self, i: usize, name: &str) -> CloudResult<Vec<MoRef>> {
        let (soap, _) = self.clients(i).await?;
        let mut out = Vec::new();
        for dc in &self.datacenters(i).await? {
            out.extend(
                soap.find_all_by_dns_name(Some(dc), name)
                    .await
                    .map_err(|e| api_err(format!("FindAllByDnsName {name}"), e))?,
            );
        }
        Ok(out)
    }

    pub(crate) async fn find_by_ip(&self, i: usize, ip: &str) -> CloudResult<Option<MoRef>> {
        let (soap, _) = self.clients(i).await?;
        for dc in &self.datacenters(i).await? {
            if let Some(vm) = soap
                .find_by_ip(Some(dc), ip)
                .await
                .map_err(|e| api_err(format!("FindByIp {ip}"), e))?
            {
                return Ok(Some(vm));
            }
        }
        Ok(None)
    }

    pub(crate) async fn vm_properties(&self, r: &VmRef) -> CloudResult<PropertySet> {
        let (soap, _) = self.clients(r.vcenter).await?;
        soap.retrieve_properties(&r.vm, &VM_PROPERTIES)
            .await
            .map_err(|e| api_err(format!("reading {}", r.vm), e))
    }

    pub(crate) async fn found(&self, node: &Node) -> CloudResult<Option<(VmRef, PropertySet)>> {
        let Lookup::Found(r) = self.find_vm(node).await? else {
            return Ok(None);
        };
        let props = self.vm_properties(&r).await?;
        if !props.has("summary.config.uuid") {
            return Err(CloudError::msg(format!(
                "{}: vCenter returned no properties for the VM (not visible to this account?)",
                r.vm
            )));
        }
        self.remember(node_name(node), r.clone());
        Ok(Some((r, props)))
    }

    /// Remembers the VM of a Node; entries of Nodes that no longer exist are dropped once the
    /// map holds more entries than there are Nodes (memory stays bounded by the cluster).
    pub(crate) fn remember(&self, node: &str, r: VmRef) {
        let mut seen = self.seen.lock();
        seen.insert(node.to_string(), r);
        if let Some(store) = self.nodes.lock().as_ref() {
            let known = store.len();
            if seen.len() > known.max(16) {
                seen.retain(|name, _| store.get(name).is_some());
            }
        }
    }
}
