//! `cloud-controller-manager-vsphere` as a real process against a real kube-apiserver and
//! vcsim, and the `vsphere-api` bindings against vcsim (TLS, faults, sessions).

use std::time::Duration;

use anyhow::Result;
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::TAINT_SHUTDOWN,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::{Api, api::PostParams};
use rcp_e2e::{
    TestCluster, Vcsim,
    ccm::CcmProcess,
    k8s::{initialised, set_ready, set_system_uuid, tainted_node, wait_for},
    vcsim::{VcsimModel, small_model, vm_name},
};
use vsphere_api::{Client, Credentials, MoRef, Secret, rest::RestClient, tls::TlsOptions};

const T: Duration = Duration::from_secs(60);
const BIN: &str = "cloud-controller-manager-vsphere";

fn model(vms: usize) -> VcsimModel {
    small_model(vms)
}

fn vm(i: usize) -> String {
    vm_name(i)
}

fn identify(vcsim: &Vcsim, count: usize) -> Result<()> {
    vcsim.identify(count)
}

fn cloud_config(cluster: &TestCluster, vcsim: &Vcsim, zones: bool) -> Result<std::path::PathBuf> {
    let port = vcsim.host_port().rsplit(':').next().unwrap_or("443");
    let mut yaml = format!(
        "global:\n  user: {}\n  password: {}\n  port: {port}\n  insecureFlag: true\nvcenter:\n  sim:\n    server: 127.0.0.1\n",
        serde_json::to_string(vcsim.username())?,
        serde_json::to_string(vcsim.password())?
    );
    if zones {
        yaml.push_str("labels:\n  zone: k8s-zone\n  region: k8s-region\n");
    }
    let path = cluster
        .dir()
        .join(format!("vsphere-{}.yaml", if zones { "zones" } else { "plain" }));
    std::fs::write(&path, yaml)?;
    Ok(path)
}

fn start_ccm(
    cluster: &TestCluster,
    config: &std::path::Path,
    name: &str,
    extra: &[&str],
) -> Result<CcmProcess> {
    let mut args = vec![
        format!("--cloud-config={}", config.display()),
        "--leader-elect=false".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    CcmProcess::start(
        BIN,
        name,
        &cluster.ccm_kubeconfig("vsphere/base")?,
        cluster.dir(),
        &args,
    )
}

/// The kubelet's (SMBIOS) byte order of a vCenter UUID: first three groups byte-swapped.
fn swap(uuid: &str) -> String {
    let p: Vec<&str> = uuid.split('-').collect();
    let rev = |s: &str| {
        (0..s.len())
            .step_by(2)
            .rev()
            .map(|i| &s[i..i + 2])
            .collect::<String>()
    };
    format!("{}-{}-{}-{}-{}", rev(p[0]), rev(p[1]), rev(p[2]), p[3], p[4])
}

#[tokio::test]
async fn nodes_are_found_by_uuid_in_both_byte_orders_and_by_guest_host_name() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let vcsim = Vcsim::start_with(model(4))?;
    identify(&vcsim, 4)?;
    let uuids: Vec<String> = (0..4).map(|i| vcsim.vm_uuid(&vm(i))).collect::<Result<_>>()?;
    let config = cloud_config(&cluster, &vcsim, false)?;
    let _ccm = start_ccm(&cluster, &config, "ccm-vsphere", &[])?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);

    // Nodes 0 and 1 have names no guest reports, so only their systemUUID can find them:
    // node 0 in the kubelet's (SMBIOS) byte order, node 1 in vCenter's.
    for (i, uuid) in [(0, swap(&uuids[0])), (1, uuids[1].clone())] {
        let name = format!("by-uuid-{i}");
        nodes.create(&PostParams::default(), &tainted_node(&name)).await?;
        set_system_uuid(&nodes, &name, &uuid.to_ascii_uppercase()).await?;
    }
    // Nodes 2 and 3 have no systemUUID: found by guest host name.
    for i in 2..4 {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
    }
    for (name, i) in [("by-uuid-0", 0), ("by-uuid-1", 1), ("node-2", 2), ("node-3", 3)] {
        let n = wait_for(&format!("{name} initialised"), T, || initialised(&nodes, name)).await?;
        assert_eq!(
            n.spec.as_ref().unwrap().provider_id.as_deref(),
            Some(format!("vsphere://{}", uuids[i]).as_str()),
            "{name}"
        );
        let ip = format!("10.20.0.{}", i + 10);
        let a = |t: &str, v: &str| NodeAddress {
            type_: t.into(),
            address: v.into(),
        };
        assert_eq!(
            addresses(&n),
            &[
                a("Hostname", &format!("node-{i}")),
                a("InternalIP", &ip),
                a("ExternalIP", &ip)
            ],
            "{name}"
        );
        let labels = n.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("node.kubernetes.io/instance-type").map(String::as_str),
            Some("vsphere-vm.cpu-1.mem-0gb.os-other"),
            "{name}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn zone_and_region_come_from_tags_on_the_cluster_and_the_datacenter() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let vcsim = Vcsim::start_with(model(2))?;
    identify(&vcsim, 2)?;
    vcsim.tag_zone_and_region()?;
    let config = cloud_config(&cluster, &vcsim, true)?;
    let _ccm = start_ccm(&cluster, &config, "ccm-vsphere-zones", &[])?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    nodes
        .create(&PostParams::default(), &tainted_node("node-0"))
        .await?;
    let n = wait_for("node-0 initialised", T, || initialised(&nodes, "node-0")).await?;
    let labels = n.metadata.labels.unwrap_or_default();
    for (k, v) in [
        ("topology.kubernetes.io/zone", "zone-a"),
        ("failure-domain.beta.kubernetes.io/zone", "zone-a"),
        ("topology.kubernetes.io/region", "region-1"),
        ("failure-domain.beta.kubernetes.io/region", "region-1"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
    }
    Ok(())
}

#[tokio::test]
async fn powered_off_vms_taint_destroyed_ones_delete_and_an_unreachable_vcenter_deletes_nothing() -> Result<()>
{
    let cluster = TestCluster::start().await?;
    let mut vcsim = Vcsim::start_with(model(3))?;
    identify(&vcsim, 3)?;
    let config = cloud_config(&cluster, &vcsim, false)?;
    let ccm = start_ccm(
        &cluster,
        &config,
        "ccm-vsphere-lifecycle",
        &["--node-monitor-period=1s"],
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    for i in 0..3 {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
    }
    for i in 0..3 {
        let name = format!("node-{i}");
        wait_for("initialised", T, || initialised(&nodes, &name)).await?;
    }
    vcsim.govc(&["vm.power", "-off", "-force", &vm(0)])?;
    set_ready(&nodes, "node-0", "False").await?;
    wait_for("shutdown taint on node-0", T, || async {
        has_taint(&nodes.get("node-0").await.ok()?, TAINT_SHUTDOWN).then_some(())
    })
    .await?;

    vcsim.govc(&["vm.power", "-off", "-force", &vm(1)])?;
    vcsim.govc(&["vm.destroy", &vm(1)])?;
    set_ready(&nodes, "node-1", "Unknown").await?;
    wait_for("node-1 deleted", T, || async {
        nodes.get_opt("node-1").await.ok()?.is_none().then_some(())
    })
    .await?;
    assert!(
        nodes.get_opt("node-0").await?.is_some(),
        "a powered-off VM still exists"
    );

    let lifecycle = "controller=\"cloud-node-lifecycle-controller\"";
    let passes = ["controller_reconcile_total{", lifecycle];
    let failed_calls = ["cloudprovider_api_calls_total{", lifecycle, "result=\"error\""];
    let (passes_before, failed_before) = (ccm.metric_sum(&passes).await, ccm.metric_sum(&failed_calls).await);
    vcsim.stop();
    set_ready(&nodes, "node-2", "False").await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    // Nothing deleted because the controller ran and vCenter failed, not because it did not run.
    let (passes_after, failed_after) = (ccm.metric_sum(&passes).await, ccm.metric_sum(&failed_calls).await);
    println!(
        "vCenter down 8 s: {} monitor passes, {} failed checks",
        passes_after - passes_before,
        failed_after - failed_before
    );
    assert!(
        passes_after - passes_before >= 3.0,
        "the lifecycle controller ran during the outage"
    );
    assert!(failed_after > failed_before, "and asked vCenter, which failed");
    for n in ["node-0", "node-2"] {
        assert!(
            nodes.get_opt(n).await?.is_some(),
            "{n} must not be deleted while vCenter is unreachable"
        );
    }
    Ok(())
}

#[tokio::test]
async fn twenty_nodes_reuse_one_soap_and_one_rest_session() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let vcsim = Vcsim::start_with(model(20))?;
    identify(&vcsim, 20)?;
    vcsim.tag_zone_and_region()?;
    let config = cloud_config(&cluster, &vcsim, true)?;
    let ccm = start_ccm(
        &cluster,
        &config,
        "ccm-vsphere-20",
        &["--concurrent-node-syncs=5"],
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    for i in 0..20 {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
    }
    for i in 0..20 {
        let name = format!("node-{i}");
        wait_for("initialised", T, || initialised(&nodes, &name)).await?;
    }
    let soap = ccm
        .metric_value("cloudprovider_vsphere_sessions_created_total{api=\"soap\"}")
        .await;
    let rest = ccm
        .metric_value("cloudprovider_vsphere_sessions_created_total{api=\"rest\"}")
        .await;
    println!(
        "20 nodes initialised (with zone/region tag look-ups) using {soap} SOAP login(s) and {rest} REST session(s)"
    );
    assert!((1.0..=2.0).contains(&soap), "SOAP logins: {soap}");
    assert!(
        (1.0..=3.0).contains(&rest),
        "REST sessions: {rest} (the first may be a 404 probe of /api)"
    );
    Ok(())
}

fn creds(vcsim: &Vcsim, password: &str) -> Credentials {
    Credentials {
        username: vcsim.username().to_string(),
        password: Secret::new(password),
    }
}

fn port(vcsim: &Vcsim) -> u16 {
    vcsim
        .host_port()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(443)
}

#[tokio::test]
async fn tls_is_verified_unless_pinned_or_explicitly_insecure() -> Result<()> {
    rcp_e2e::init();
    let vcsim = Vcsim::start()?;
    let good = creds(&vcsim, vcsim.password());
    // Default: the self-signed certificate is refused.
    let strict = Client::new("127.0.0.1", port(&vcsim), &TlsOptions::default(), good.clone())?;
    let e = strict
        .login()
        .await
        .expect_err("an untrusted certificate must be refused");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    // A wrong thumbprint is refused; the right one (SHA-1, as vCenter shows it) works.
    let wrong = TlsOptions {
        thumbprint: Some("00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33".into()),
        ..Default::default()
    };
    let e = Client::new("127.0.0.1", port(&vcsim), &wrong, good.clone())?
        .login()
        .await
        .expect_err("thumbprint mismatch");
    assert!(
        e.to_string().contains("does not match the configured thumbprint"),
        "{e}"
    );
    let pinned = TlsOptions {
        thumbprint: Some(vcsim.thumbprint()?),
        ..Default::default()
    };
    Client::new("127.0.0.1", port(&vcsim), &pinned, good.clone())?
        .login()
        .await?;
    // A CA bundle holding the server's CA verifies it the normal way.
    let with_ca = TlsOptions {
        ca_pem: Some(vcsim.ca_pem()?),
        ..Default::default()
    };
    Client::new("127.0.0.1", port(&vcsim), &with_ca, good.clone())?
        .login()
        .await?;
    // govmomi's semantics: the thumbprint is consulted only when the chain does not verify, so
    // a trusted chain with a stale thumbprint still works ...
    let trusted_with_stale_thumbprint = TlsOptions {
        ca_pem: Some(vcsim.ca_pem()?),
        thumbprint: wrong.thumbprint.clone(),
        ..Default::default()
    };
    Client::new(
        "127.0.0.1",
        port(&vcsim),
        &trusted_with_stale_thumbprint,
        good.clone(),
    )?
    .login()
    .await?;
    // ... and insecure skips the thumbprint too.
    let insecure_with_wrong_thumbprint = TlsOptions {
        insecure: true,
        thumbprint: wrong.thumbprint.clone(),
        ..Default::default()
    };
    Client::new(
        "127.0.0.1",
        port(&vcsim),
        &insecure_with_wrong_thumbprint,
        good.clone(),
    )?
    .login()
    .await?;
    // Insecure only when asked.
    let insecure = TlsOptions {
        insecure: true,
        ..Default::default()
    };
    Client::new("127.0.0.1", port(&vcsim), &insecure, good)?
        .login()
        .await?;
    Ok(())
}

#[tokio::test]
async fn soap_faults_are_typed_and_an_expired_session_logs_in_again() -> Result<()> {
    rcp_e2e::init();
    let mut vcsim = Vcsim::start_with(model(2))?;
    let insecure = TlsOptions {
        insecure: true,
        ..Default::default()
    };
    let bad = Client::new(
        "127.0.0.1",
        port(&vcsim),
        &insecure,
        creds(&vcsim, "wrong-password"),
    )?;
    let e = bad.login().await.expect_err("wrong password");
    assert!(e.is_fault("InvalidLogin"), "{e:?}");
    assert!(
        !format!("{e} {e:?} {bad:?}").contains("wrong-password"),
        "no password in errors or Debug"
    );

    let client = Client::new(
        "127.0.0.1",
        port(&vcsim),
        &insecure,
        creds(&vcsim, vcsim.password()),
    )?;
    let uuid = vcsim.vm_uuid(&vm(0))?;
    let found = client
        .find_by_uuid(None, &uuid, false)
        .await?
        .expect("VM by UUID");
    assert_eq!(found.kind, "VirtualMachine");
    let e = client
        .retrieve_properties(&MoRef::new("VirtualMachine", "vm-999999"), &["name"])
        .await
        .expect_err("no such VM");
    assert!(e.is_fault("ManagedObjectNotFound"), "{e:?}");
    assert_eq!(client.logins(), 1);

    // vCenter restarts: every session is gone; the next call gets NotAuthenticated, logs in
    // again once and succeeds.
    vcsim.restart(model(2))?;
    let again = client.find_by_uuid(None, &vcsim.vm_uuid(&vm(0))?, false).await?;
    assert!(again.is_some());
    assert_eq!(client.logins(), 2, "one re-login after the session expired");

    // REST: the /api probe falls back to /rest; tags are read; the session is reused.
    vcsim.govc(&["tags.category.create", "k8s-zone"])?;
    vcsim.govc(&["tags.create", "-c", "k8s-zone", "zone-z"])?;
    vcsim.govc(&["tags.attach", "-c", "k8s-zone", "zone-z", "/DC0"])?;
    let rest = RestClient::new(
        "127.0.0.1",
        port(&vcsim),
        &insecure,
        creds(&vcsim, vcsim.password()),
    )?;
    let dcs = client.list_objects("Datacenter", &["name"]).await?;
    let dc = &dcs[0].0;
    let tags = rest.list_attached_tags(dc).await?;
    assert_eq!(tags.len(), 1);
    let tag = rest.get_tag(&tags[0]).await?;
    assert_eq!(tag.name, "zone-z");
    assert_eq!(rest.get_category(&tag.category_id).await?.name, "k8s-zone");
    let logins = rest.logins();
    rest.list_attached_tags(dc).await?;
    assert_eq!(rest.logins(), logins, "the REST session is reused");
    Ok(())
}

/// Shadow mode on vSphere (whose bindings only read vCenter): the Nodes are not initialised
/// and no Lease is taken, the would-be writes are announced, and they are exactly what the
/// normal run then does.
#[tokio::test]
async fn shadow_mode_initialises_nothing_and_announces_what_the_normal_mode_then_does() -> Result<()> {
    use std::collections::BTreeSet;

    use k8s_openapi::api::coordination::v1::Lease;
    use rcp_e2e::ccm::{LOG_WRITES, logged_writes};

    let cluster = TestCluster::start().await?;
    let vcsim = Vcsim::start_with(model(2))?;
    identify(&vcsim, 2)?;
    let config = cloud_config(&cluster, &vcsim, false)?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let names = ["node-0", "node-1"];
    for name in names {
        nodes.create(&PostParams::default(), &tainted_node(name)).await?;
    }
    let run = |name: &str, extra: &[&str]| -> Result<CcmProcess> {
        let mut args = vec![
            format!("--cloud-config={}", config.display()),
            "--logging-format=json".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        CcmProcess::start_with_env(
            BIN,
            name,
            &cluster.ccm_kubeconfig("vsphere/base")?,
            cluster.dir(),
            &args,
            &[("RUST_LOG", LOG_WRITES)],
        )
    };
    let writes_of = |log: &str, dry: bool| -> BTreeSet<(String, String, String)> {
        logged_writes(log)
            .into_iter()
            .filter(|w| w.3 == dry)
            .map(|(c, a, o, _)| (c, a, o))
            .collect()
    };

    let mut shadow = run("ccm-vsphere-shadow", &["--dry-run"])?;
    wait_for("the node initialisations announced", T, || {
        let seen = writes_of(&shadow.log(), true);
        let all = names.iter().all(|n| {
            seen.contains(&(
                "node-controller".to_string(),
                "patch nodes".to_string(),
                n.to_string(),
            ))
        });
        async move { all.then_some(()) }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    shadow.signal(nix::sys::signal::Signal::SIGTERM)?;
    assert_eq!(
        shadow.wait_exit(Duration::from_secs(30))?,
        Some(0),
        "{}",
        shadow.log()
    );
    let announced = writes_of(&shadow.log(), true);
    println!("vSphere shadow run announced: {announced:#?}");
    for name in names {
        assert!(
            initialised(&nodes, name).await.is_none(),
            "{name} is still tainted"
        );
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    assert!(leases.get_opt("cloud-controller-manager").await?.is_none());

    let mut normal = run("ccm-vsphere-normal", &["--leader-elect=false"])?;
    for name in names {
        wait_for(&format!("{name} initialised"), T, || initialised(&nodes, name)).await?;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    normal.signal(nix::sys::signal::Signal::SIGTERM)?;
    assert_eq!(
        normal.wait_exit(Duration::from_secs(30))?,
        Some(0),
        "{}",
        normal.log()
    );
    let done = writes_of(&normal.log(), false);
    assert_eq!(announced, done);
    Ok(())
}
