//! Routes (AWS-59…63): pod-CIDR routes in the cluster's route table, targeting instances.
//!
//! - The table is `[Global] RouteTableID`, else the one route table tagged for the cluster
//!   (none or several is an error naming them).
//! - `ListRoutes` returns every IPv4 route with a destination CIDR that targets an instance
//!   (node name from the Node informer's provider IDs, else the instance's private DNS name) or
//!   is a blackhole; other targets (gateways, NAT, …) are not listed, so the route controller
//!   never touches them. A route to an instance EC2 does not know is left out too (upstream
//!   does the same), never reported as a blackhole to be deleted.
//! - `CreateRoute` turns the instance's source/destination check off (when it is on) and
//!   creates the route; only when EC2 answers `RouteAlreadyExists` is the table described: a
//!   blackhole route for the CIDR is replaced (as upstream), a route to the same instance is
//!   success. Deliberate difference: upstream describes the whole table before every create,
//!   so a burst of N routes costs N describes of up to N routes each.

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, RouteState};
use k8s_cloud_provider::{CloudError, CloudResult, Route, Routes, node::helpers::provider_id};

use crate::{
    AwsCloud,
    api::AwsError,
    cloud_error,
    instances::{NodeKey, instance_id_from_provider_id},
};

impl AwsCloud {
    /// The route table of the cluster (cached after the first successful discovery).
    pub async fn route_table_id(&self) -> CloudResult<String> {
        if let Some(id) = self.route_table.lock().clone() {
            return Ok(id);
        }
        let mut req = self.ec2.describe_route_tables();
        if !self.config.route_table_id.is_empty() {
            req = req.filters(
                Filter::builder()
                    .name("route-table-id")
                    .values(&self.config.route_table_id)
                    .build(),
            );
        }
        let mut tables = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .api
                .call(
                    "describe_route_tables",
                    req.clone().set_next_token(token.clone()).send(),
                )
                .await
                .map_err(|e| cloud_error("listing route tables", e))?;
            tables.extend(page.route_tables().iter().cloned());
            token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        let id = if !self.config.route_table_id.is_empty() {
            if tables.is_empty() {
                return Err(CloudError::msg(format!(
                    "[Global] RouteTableID {:?}: no such route table",
                    self.config.route_table_id
                )));
            }
            self.config.route_table_id.clone()
        } else {
            let key = format!("kubernetes.io/cluster/{}", self.cluster_id);
            let tagged: Vec<String> = tables
                .iter()
                .filter(|t| {
                    t.tags().iter().any(|tag| {
                        tag.key() == Some(key.as_str())
                            || (tag.key() == Some("KubernetesCluster")
                                && tag.value() == Some(self.cluster_id.as_str()))
                    })
                })
                .filter_map(|t| t.route_table_id().map(str::to_string))
                .collect();
            match tagged.as_slice() {
                [one] => one.clone(),
                [] => {
                    return Err(CloudError::msg(format!(
                        "no route table is tagged {key}: tag the cluster's route table or set [Global] RouteTableID"
                    )));
                }
                many => {
                    return Err(CloudError::msg(format!(
                        "several route tables are tagged {key} ({}): set [Global] RouteTableID",
                        many.join(", ")
                    )));
                }
            }
        };
        *self.route_table.lock() = Some(id.clone());
        Ok(id)
    }

    pub(crate) async fn describe_table(
        &self,
        table_id: &str,
    ) -> CloudResult<Vec<aws_sdk_ec2::types::RouteTable>> {
        let out = self
            .api
            .call(
                "describe_route_tables",
                self.ec2
                    .describe_route_tables()
                    .filters(Filter::builder().name("route-table-id").values(table_id).build())
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("describing route table {table_id}"), e))?;
        Ok(out.route_tables().to_vec())
    }

    /// Instance ID → node name, from the Node informer's provider IDs (AWS-06's `instanceID`
    /// index, built once per listing; a malformed provider ID is left out with a warning).
    fn instance_index(&self) -> std::collections::HashMap<String, String> {
        let mut index = std::collections::HashMap::new();
        if let Some(store) = self.instances.nodes() {
            for n in store.list() {
                let pid = provider_id(&n);
                if pid.is_empty() {
                    continue;
                }
                match instance_id_from_provider_id(pid) {
                    Ok(id) => {
                        index.insert(id, n.metadata.name.clone().unwrap_or_default());
                    }
                    Err(e) => {
                        tracing::warn!(node = n.metadata.name.as_deref().unwrap_or_default(), error = %e, "node left out of the instance index")
                    }
                }
            }
        }
        index
    }
}

impl AwsCloud {
    async fn create_instance_route(
        &self,
        table_id: &str,
        cidr: &str,
        instance_id: &str,
    ) -> Result<(), AwsError> {
        self.api
            .call(
                "create_route",
                self.ec2
                    .create_route()
                    .route_table_id(table_id)
                    .destination_cidr_block(cidr)
                    .instance_id(instance_id)
                    .send(),
            )
            .await
            .map(|_| ())
    }

    pub(crate) async fn delete_cidr_route(&self, table_id: &str, cidr: &str) -> Result<(), AwsError> {
        self.api
            .call(
                "delete_route",
                self.ec2
                    .delete_route()
                    .route_table_id(table_id)
                    .destination_cidr_block(cidr)
                    .send(),
            )
            .await
            .map(|_| ())
    }
}

fn route_create_error(table_id: &str, route: &Route, instance_id: &str, e: AwsError) -> CloudError {
    cloud_error(
        format!(
            "creating route {} → {instance_id} in {table_id}",
            route.destination_cidr
        ),
        e,
    )
}

#[async_trait]
impl Routes for AwsCloud {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        let table_id = self.route_table_id().await?;
        let index = self.instance_index();
        let mut routes = Vec::new();
        for table in self.describe_table(&table_id).await? {
            for r in table.routes() {
                let Some(cidr) = r.destination_cidr_block() else {
                    continue;
                };
                let name = format!("{cluster_name}-{cidr}");
                if r.state() == Some(&RouteState::Blackhole) {
                    routes.push(Route::new("", cidr).with_name(name).with_blackhole(true));
                    continue;
                }
                let Some(instance_id) = r.instance_id() else {
                    continue;
                };
                let key = NodeKey::Id(instance_id.to_string());
                let (target, blackhole) = match self.lookup(&key, crate::instances::CACHE_TTL).await? {
                    Some(i) => (
                        index
                            .get(&i.id)
                            .cloned()
                            .unwrap_or_else(|| i.private_dns_name.clone()),
                        i.state.as_deref() == Some("terminated"),
                    ),
                    // As upstream: a route to an instance EC2 does not know is left out (and so
                    // never deleted by the route controller) — it may be a lookup that lags.
                    None => {
                        tracing::warn!(route = %name, instance = instance_id, "route target instance not found; route left alone");
                        continue;
                    }
                };
                routes.push(Route::new(target, cidr).with_name(name).with_blackhole(blackhole));
            }
        }
        Ok(routes)
    }

    async fn create_route(&self, _cluster_name: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        let table_id = self.route_table_id().await?;
        let instance = self
            .instance_for_name(&route.target_node, crate::instances::CACHE_TTL)
            .await?
            .ok_or_else(|| {
                CloudError::msg(format!(
                    "creating route {name_hint} {}: no instance for node {}",
                    route.destination_cidr, route.target_node
                ))
            })?;
        if instance.source_dest_check != Some(false) {
            self.api
                .call(
                    "modify_instance_attribute",
                    self.ec2
                        .modify_instance_attribute()
                        .instance_id(&instance.id)
                        .source_dest_check(
                            aws_sdk_ec2::types::AttributeBooleanValue::builder()
                                .value(false)
                                .build(),
                        )
                        .send(),
                )
                .await
                .map_err(|e| {
                    cloud_error(
                        format!("disabling the source/destination check of {}", instance.id),
                        e,
                    )
                })?;
            self.instances.invalidate(&NodeKey::Id(instance.id.clone()));
        }
        // The route is created first; the table is described only when EC2 says a route for
        // the CIDR exists (upstream describes the table before every create: one
        // DescribeRouteTables of every route per route, quadratic in the Nodes).
        let created = self
            .create_instance_route(&table_id, &route.destination_cidr, &instance.id)
            .await;
        let Err(e) = created else {
            return Ok(());
        };
        if e.code.as_deref() != Some("RouteAlreadyExists") {
            return Err(route_create_error(&table_id, route, &instance.id, e));
        }
        // A route for the CIDR exists: a blackhole (its instance is gone) is replaced, as
        // upstream; a route to the same instance is what was asked for; any other is left alone
        // (the route controller deletes it first if it is its own).
        let existing = self.describe_table(&table_id).await?;
        let current = existing
            .iter()
            .flat_map(|t| t.routes())
            .find(|r| r.destination_cidr_block() == Some(route.destination_cidr.as_str()));
        let cidr = route.destination_cidr.as_str();
        let blackhole = match current {
            Some(r) if r.state() == Some(&RouteState::Blackhole) => true,
            Some(r) if r.instance_id() == Some(instance.id.as_str()) => return Ok(()),
            Some(_) => return Err(route_create_error(&table_id, route, &instance.id, e)),
            // Gone since (deleted by the controller's own concurrent deletion): create it now.
            None => false,
        };
        if blackhole {
            self.delete_cidr_route(&table_id, cidr)
                .await
                .map_err(|e| cloud_error(format!("deleting the blackhole route {cidr}"), e))?;
        }
        self.create_instance_route(&table_id, cidr, &instance.id)
            .await
            .map_err(|e| route_create_error(&table_id, route, &instance.id, e))
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> CloudResult<()> {
        let table_id = self.route_table_id().await?;
        self.delete_cidr_route(&table_id, &route.destination_cidr)
            .await
            .map_err(|e| {
                cloud_error(
                    format!("deleting route {} from {table_id}", route.destination_cidr),
                    e,
                )
            })
    }
}
