//! More of everything than one page of the OpenStack APIs: `hack/openstack.sh` sets nova's,
//! neutron's and Octavia's page size to 3, so the provider's lists only see everything by
//! following the `next` links.

use std::{collections::BTreeSet, time::Duration};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::{Api, api::PostParams};
use rcp_e2e::{
    TestCluster,
    k8s::{initialised, tainted_node, wait_for},
    openstack::{OpenStack, start_ccm},
};

const T: Duration = Duration::from_secs(120);

/// Seven servers and their Nodes (more than two pages of nova's 3): every Node is initialised
/// (found by name in a paginated list) and gets its Pod route on the router and its CIDR in its
/// port's allowed address pairs, and once the routes are there the route controller,
/// reconciling every second, changes the router no more: no live next hop is taken for a
/// blackhole because its server was on a later page.
#[tokio::test]
async fn routes_of_more_servers_than_a_page_converge_and_stay() -> Result<()> {
    let os = OpenStack::shared().await?;
    // The API server starts while the project is made.
    let (cluster, project) = tokio::try_join!(TestCluster::start(), os.project("scale"))?;
    let net = project.network("private", "10.3.0.0/24").await?;
    let public = project.external_network("public", "172.26.4.0/24").await?;
    let router = project.router("edge", &public, &net).await?;
    const SERVERS: usize = 7;
    let ids = project.servers("node", SERVERS, &net).await?;
    let config = format!(
        "{}[LoadBalancer]\nenabled = false\n[Route]\nrouter-id = {router}\n",
        project.global_section()
    );
    let ccm = start_ccm(
        &cluster,
        &config,
        "ccm-openstack-scale",
        &[
            "--controllers=*,route",
            "--configure-cloud-routes=true",
            "--cluster-cidr=10.244.0.0/16",
            "--route-reconciliation-period=1s",
        ],
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    let mut ips = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        ips.push(project.server_ip(id, "private").await?);
        let mut n = tainted_node(&format!("node-{i}"));
        let cidr = format!("10.244.{}.0/24", i + 1);
        n.spec = Some(NodeSpec {
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            ..n.spec.unwrap_or_default()
        });
        nodes.create(&PostParams::default(), &n).await?;
    }
    for i in 0..SERVERS {
        let name = format!("node-{i}");
        wait_for(&format!("{name} initialised"), T, || initialised(&nodes, &name))
            .await
            .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    }
    let routes = || async {
        let r = project.router_routes(&router).await.ok()?;
        Some(
            r.iter()
                .map(|r| {
                    (
                        r["destination"].as_str().unwrap_or_default().to_string(),
                        r["nexthop"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect::<BTreeSet<_>>(),
        )
    };
    let want: BTreeSet<(String, String)> = (0..SERVERS)
        .map(|i| (format!("10.244.{}.0/24", i + 1), ips[i].clone()))
        .collect();
    wait_for("every Node's route on the router", T, || async {
        routes().await.filter(|r| *r == want)
    })
    .await
    .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    // A route is two writes: the router's extra route, then the CIDR in the server port's
    // allowed address pairs. Converged means both are there for every Node.
    for (i, id) in ids.iter().enumerate() {
        let cidr = format!("10.244.{}.0/24", i + 1);
        wait_for(
            &format!("{cidr} in node-{i}'s allowed address pairs"),
            T,
            || async {
                let pairs = project.address_pairs(id).await.ok()?;
                pairs.contains(&cidr).then_some(())
            },
        )
        .await
        .inspect_err(|_| eprintln!("{}", ccm.log()))?;
    }
    let writes = || -> usize {
        project
            .neutron_proxy
            .counts_by_method()
            .iter()
            .filter(|(k, _)| !k.starts_with("GET "))
            .map(|(_, n)| n)
            .sum()
    };
    let listed_pages = |counts: &std::collections::BTreeMap<String, usize>| -> usize {
        counts
            .iter()
            .filter(|(k, _)| k.starts_with("GET ") && k.ends_with("/servers/detail"))
            .map(|(_, n)| n)
            .sum()
    };
    let before = writes();
    let pages_before = listed_pages(&project.nova_proxy.counts_by_method());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pages_after = listed_pages(&project.nova_proxy.counts_by_method());
    assert!(
        pages_after >= pages_before + 3,
        "the route controller listed the servers meanwhile, page after page ({pages_before} → {pages_after} page reads)"
    );
    assert_eq!(
        writes(),
        before,
        "the router or a port was changed again: routes flapped"
    );
    assert_eq!(routes().await, Some(want));
    Ok(())
}
