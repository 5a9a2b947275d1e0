//! A node's zone and region from the vSphere tags of its VM's ancestors (VS-12), with tag
//! and category names cached for [`TAG_CACHE_TTL`].

use super::*;

impl VsphereCloud {
    /// Zone and region (VS-13) in two round trips: one PropertyCollector traversal for the
    /// ancestors of the host, the resource pool and the VM, one bulk tag-association read for
    /// all of them; tag and category names come from caches that expire after
    /// [`TAG_CACHE_TTL`]. The search order is upstream's: the host and its ancestors, then the
    /// resource pool's, then the VM's; the first tag of each category wins.
    pub(crate) async fn zone_region(&self, r: &VmRef, props: &PropertySet) -> CloudResult<(String, String)> {
        let (zone_cat, region_cat) = (&self.config.zone_category, &self.config.region_category);
        if zone_cat.is_empty() || region_cat.is_empty() {
            return Ok((String::new(), String::new()));
        }
        let (soap, rest) = self.clients(r.vcenter).await?;
        let starts: Vec<MoRef> = [
            props.moref("runtime.host"),
            props.moref("resourcePool"),
            Some(r.vm.clone()),
        ]
        .into_iter()
        .flatten()
        .collect();
        let parents = soap
            .parents(&starts)
            .await
            .map_err(|e| api_err(format!("ancestors of {}", r.vm), e))?;
        let chains: Vec<Vec<MoRef>> = starts.iter().map(|s| Client::chain(&parents, s)).collect();
        let mut objects: Vec<MoRef> = Vec::new();
        for o in chains.iter().flatten() {
            if !objects.contains(o) {
                objects.push(o.clone());
            }
        }
        let attached = rest
            .list_attached_tags_on_objects(&objects)
            .await
            .map_err(|e| api_err(format!("tags of {} and its ancestors", r.vm), e))?;
        let (mut zone, mut region) = (None, None);
        'outer: for obj in chains.iter().flatten() {
            for tag_id in attached.get(obj).into_iter().flatten() {
                let (tag_name, category_id) = self.tag(rest, tag_id).await?;
                let category = self.category(rest, &category_id).await?;
                if &category == zone_cat && zone.is_none() {
                    zone = Some(tag_name.clone());
                }
                if &category == region_cat && region.is_none() {
                    region = Some(tag_name);
                }
                if zone.is_some() && region.is_some() {
                    break 'outer;
                }
            }
        }
        match (zone, region) {
            (Some(z), Some(r)) => Ok((z, r)),
            (z, rg) => Err(CloudError::msg(format!(
                "{}: no {} tag found on the host, resource pool or VM or their ancestors",
                r.vm,
                [
                    (z.is_none(), format!("zone ({zone_cat})")),
                    (rg.is_none(), format!("region ({region_cat})"))
                ]
                .into_iter()
                .filter_map(|(missing, what)| missing.then_some(what))
                .collect::<Vec<_>>()
                .join(" or ")
            ))),
        }
    }

    /// A tag's name and category ID (cached for [`TAG_CACHE_TTL`]).
    pub(crate) async fn tag(&self, rest: &RestClient, id: &str) -> CloudResult<(String, String)> {
        if let Some((v, at)) = self.tags.lock().get(id)
            && at.elapsed() < TAG_CACHE_TTL
        {
            return Ok(v.clone());
        }
        let t = rest
            .get_tag(id)
            .await
            .map_err(|e| api_err(format!("tag {id}"), e))?;
        let v = (t.name, t.category_id);
        let mut tags = self.tags.lock();
        tags.retain(|_, (_, at)| at.elapsed() < TAG_CACHE_TTL);
        tags.insert(id.to_string(), (v.clone(), std::time::Instant::now()));
        Ok(v)
    }

    /// A category's name (cached for [`TAG_CACHE_TTL`]).
    pub(crate) async fn category(&self, rest: &RestClient, id: &str) -> CloudResult<String> {
        if let Some((v, at)) = self.categories.lock().get(id)
            && at.elapsed() < TAG_CACHE_TTL
        {
            return Ok(v.clone());
        }
        let name = rest
            .get_category(id)
            .await
            .map_err(|e| api_err(format!("category {id}"), e))?
            .name;
        let mut categories = self.categories.lock();
        categories.retain(|_, (_, at)| at.elapsed() < TAG_CACHE_TTL);
        categories.insert(id.to_string(), (name.clone(), std::time::Instant::now()));
        Ok(name)
    }
}
