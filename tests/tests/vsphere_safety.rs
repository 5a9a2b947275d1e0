//! `cloud-controller-manager-vsphere` never deletes a Node on doubt, keeps working when one of
//! several vCenters is down, survives hostile node fields, and handles credentials that rotate
//! — real binary, kube-apiserver and vcsim (behind a rule-driven proxy where vCenter must
//! answer as it does for an account that cannot see an object).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Node, NodeSpec, Secret},
};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use nix::sys::signal::Signal;
use rcp_e2e::{
    TestCluster, Vcsim,
    ccm::CcmProcess,
    fault_proxy::{Action, FaultProxy, Rule},
    k8s::{initialised, set_ready, set_system_uuid, tainted_node, wait_for, wait_for_event},
    vcsim::{VcsimModel, small_model, vm_name},
};

const T: Duration = Duration::from_secs(60);
const BIN: &str = "cloud-controller-manager-vsphere";
const AGENT: &str = "k8s-cloud-provider-vsphere";
const EXISTENCE_UNKNOWN: &str = "node_lifecycle_instance_existence_unknown_total";

fn port_of(host_port: &str) -> &str {
    host_port.rsplit(':').next().unwrap_or("443")
}

fn start_ccm(cluster: &TestCluster, yaml: &str, name: &str, extra: &[&str]) -> Result<CcmProcess> {
    let path = cluster.dir().join(format!("{name}.yaml"));
    std::fs::write(&path, yaml)?;
    let mut args = vec![
        format!("--cloud-config={}", path.display()),
        "--leader-elect=false".to_string(),
        "--node-monitor-period=1s".to_string(),
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

/// A config with the vCenter `sim` at 127.0.0.1:`port` and vcsim's user and password inline;
/// `extra_global` lines go into `global:`.
fn inline_config(vcsim: &Vcsim, port: &str, extra_global: &str) -> Result<String> {
    Ok(format!(
        "global:\n  user: {}\n  password: {}\n  port: {port}\n  insecureFlag: true\n{extra_global}vcenter:\n  sim:\n    server: 127.0.0.1\n",
        serde_json::to_string(vcsim.username())?,
        serde_json::to_string(vcsim.password())?,
    ))
}

/// An initialised Node (providerID set, no taint) whose kubelet stopped reporting.
async fn not_ready_node(nodes: &Api<Node>, name: &str, provider_id: &str) -> Result<()> {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.into()),
            ..Default::default()
        }),
        status: None,
    };
    nodes.create(&PostParams::default(), &node).await?;
    set_ready(nodes, name, "Unknown").await
}

async fn metric(ccm: &CcmProcess, name: &str) -> f64 {
    ccm.metric_value(name).await
}

/// Waits until `name` grew by at least `by` (proof that the controller ran meanwhile).
async fn wait_metric_growth(ccm: &CcmProcess, name: &str, by: f64) -> Result<f64> {
    let start = metric(ccm, name).await;
    wait_for(&format!("{name} to grow by {by}"), T, || async {
        let now = metric(ccm, name).await;
        (now >= start + by).then_some(now)
    })
    .await
    .with_context(|| {
        let log = ccm.log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        format!(
            "CCM log (last lines):\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    })
}

/// Whether an `InstanceExistenceUnknown` Warning about `node` mentioning `needle` appears
/// (events are written in the background, so this waits for it).
async fn warning_mentions(cluster: &TestCluster, node: &str, needle: &str) -> Result<bool> {
    let client = cluster.client().await?;
    let found = wait_for_event(&client, "default", node, T, |reason, message| {
        reason == "InstanceExistenceUnknown" && message.contains(needle)
    })
    .await;
    if let Err(e) = &found {
        eprintln!("{e}");
    }
    Ok(found.is_ok())
}

#[tokio::test]
async fn doubt_never_deletes_a_node_and_proof_does() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let vcsim = Vcsim::start_with(small_model(3))?;
    vcsim.identify(3)?;
    let (cert, key) = vcsim.tls_files();
    let proxy = FaultProxy::start_tls(&format!("https://{}", vcsim.host_port()), &cert, &key).await?;
    let yaml = inline_config(&vcsim, &proxy.port().to_string(), "")?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    let uuids: Vec<String> = (0..3)
        .map(|i| vcsim.vm_uuid(&vm_name(i)))
        .collect::<Result<_>>()?;
    for (i, uuid) in uuids.iter().enumerate() {
        not_ready_node(&nodes, &format!("node-{i}"), &format!("vsphere://{uuid}")).await?;
    }

    // 1. The account sees no datacenter: nothing can be looked up, nothing is deleted.
    proxy.add(Rule::new(
        &["RetrievePropertiesEx", "<type>Datacenter</type>"],
        Action::empty_soap("RetrievePropertiesEx"),
    ));
    let ccm = start_ccm(&cluster, &yaml, "ccm-no-datacenter", &[])?;
    wait_metric_growth(&ccm, EXISTENCE_UNKNOWN, 6.0).await?;
    for i in 0..3 {
        assert!(
            nodes.get_opt(&format!("node-{i}")).await?.is_some(),
            "node-{i} kept"
        );
    }
    assert!(
        warning_mentions(&cluster, "node-0", "sees no datacenter").await?,
        "a Warning event says why"
    );
    drop(ccm);
    proxy.clear();

    // 2. A VM seen before is no longer visible to the account (its search finds nothing, its
    //    properties come back empty): unknown, not gone.
    let ccm = start_ccm(&cluster, &yaml, "ccm-invisible-vm", &[])?;
    wait_for("every VM seen once", T, || async {
        (metric(
            &ccm,
            "cloudprovider_api_calls_total{controller=\"cloud-node-lifecycle-controller\",operation=\"InstanceShutdown\",result=\"success\"}",
        )
        .await
            >= 3.0)
            .then_some(())
    })
    .await?;
    let moref = vcsim.vm_moref(&vm_name(1))?;
    proxy.add(Rule::new(
        &["FindByUuid", &uuids[1]],
        Action::empty_soap("FindByUuid"),
    ));
    proxy.add(Rule::new(
        &[
            "RetrievePropertiesEx",
            &format!("type=\"VirtualMachine\">{moref}<"),
        ],
        Action::empty_soap("RetrievePropertiesEx"),
    ));
    wait_metric_growth(&ccm, EXISTENCE_UNKNOWN, 3.0).await?;
    assert!(nodes.get_opt("node-1").await?.is_some(), "node-1 kept");
    assert!(
        warning_mentions(&cluster, "node-1", "not visible to this account").await?,
        "a Warning event says why"
    );
    assert!(proxy.faulted() > 0, "the proxy hid the VM");
    proxy.clear();

    // 3. Proof: the VM is destroyed; its Node goes, the others stay.
    vcsim.govc(&["vm.power", "-off", "-force", &vm_name(0)])?;
    vcsim.govc(&["vm.destroy", &vm_name(0)])?;
    wait_for("node-0 deleted", T, || async {
        nodes.get_opt("node-0").await.ok()?.is_none().then_some(())
    })
    .await?;
    for n in ["node-1", "node-2"] {
        assert!(nodes.get_opt(n).await?.is_some(), "{n} kept");
    }
    Ok(())
}

/// A cloud config with vCenter `a` (reached on 127.0.0.1:`a_port`) and vCenter `b` (only its
/// datacenter DC1).
fn two_vcenters(a_port: &str, a: &Vcsim, b: &Vcsim) -> Result<String> {
    Ok(format!(
        "global:\n  insecureFlag: true\nvcenter:\n  a:\n    server: 127.0.0.1\n    port: {a_port}\n    user: {}\n    password: {}\n  b:\n    server: localhost\n    port: {}\n    user: {}\n    password: {}\n    datacenters: [DC1]\n",
        serde_json::to_string(a.username())?,
        serde_json::to_string(a.password())?,
        port_of(b.host_port()),
        serde_json::to_string(b.username())?,
        serde_json::to_string(b.password())?,
    ))
}

#[tokio::test]
async fn one_vcenter_down_blocks_neither_the_others_nor_keeps_hostile_nodes_from_being_reported() -> Result<()>
{
    let cluster = TestCluster::start().await?;
    let mut a = Vcsim::start_with(small_model(2))?;
    // A second vCenter with two datacenters; only DC1 (VM names unlike vCenter a's) is used.
    let b = Vcsim::start_with(VcsimModel {
        extra_args: vec!["-dc".into(), "2".into()],
        ..small_model(2)
    })?;
    b.set_guest_identity("/DC1/vm/DC1_C0_RP0_VM0", "10.30.0.10", "b-node")?;
    let b_uuid = b
        .govc(&[
            "object.collect",
            "-s",
            "/DC1/vm/DC1_C0_RP0_VM0",
            "summary.config.uuid",
        ])?
        .trim()
        .to_ascii_lowercase();
    // vcsim derives UUIDs from the inventory, so vCenter b has VMs with vCenter a's UUIDs: the
    // node of vCenter a uses a UUID no simulator has (what b answers for a's real VMs).
    let a_uuid = "4211aaaa-bbbb-cccc-dddd-eeeeffff0000";
    let yaml = two_vcenters(port_of(a.host_port()), &a, &b)?;
    a.stop();
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    not_ready_node(&nodes, "a-node", &format!("vsphere://{a_uuid}")).await?;
    let mut ccm = start_ccm(&cluster, &yaml, "ccm-two-vcenters", &[])?;

    // A node of vCenter b initialises although vCenter a does not answer.
    nodes
        .create(&PostParams::default(), &tainted_node("b-node"))
        .await?;
    set_system_uuid(&nodes, "b-node", &b_uuid).await?;
    let n = wait_for("b-node initialised", T, || initialised(&nodes, "b-node")).await?;
    assert_eq!(
        n.spec.and_then(|s| s.provider_id).as_deref(),
        Some(format!("vsphere://{b_uuid}").as_str())
    );
    // The node of the vCenter that is down is kept, and the event names that vCenter.
    wait_metric_growth(&ccm, EXISTENCE_UNKNOWN, 2.0).await?;
    assert!(nodes.get_opt("a-node").await?.is_some(), "a-node kept");
    assert!(warning_mentions(&cluster, "a-node", "vCenter a").await?);

    // Hostile node fields: an error event each, and the controllers keep running.
    nodes
        .create(&PostParams::default(), &tainted_node("hostile-uuid"))
        .await?;
    set_system_uuid(&nodes, "hostile-uuid", "ééééééé-éééé-éééé-éééé-é\u{0}éééééééééé").await?;
    not_ready_node(
        &nodes,
        "hostile-provider-id",
        "vsphere://zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz/../x",
    )
    .await?;
    for (node, needle) in [
        ("hostile-uuid", "is not a UUID"),
        ("hostile-provider-id", "is not a UUID"),
    ] {
        wait_for(&format!("warning event on {node}"), T, || async {
            warning_mentions(&cluster, node, needle).await.ok()?.then_some(())
        })
        .await?;
    }
    ccm.check_running().context("the CCM survives hostile nodes")?;
    // (By UUID: a search by guest host name must hear from every vCenter, since a second VM
    // with that name could be in the one that is down.)
    b.set_guest_identity("/DC1/vm/DC1_C0_RP0_VM1", "10.30.0.11", "b-node-2")?;
    let uuid_2 = b
        .govc(&[
            "object.collect",
            "-s",
            "/DC1/vm/DC1_C0_RP0_VM1",
            "summary.config.uuid",
        ])?
        .trim()
        .to_ascii_lowercase();
    nodes
        .create(&PostParams::default(), &tainted_node("b-node-2"))
        .await?;
    set_system_uuid(&nodes, "b-node-2", &uuid_2).await?;
    wait_for("b-node-2 initialised", T, || initialised(&nodes, "b-node-2")).await?;
    Ok(())
}

/// One of two vCenters hangs (a proxy that accepts every request and never answers): the
/// vCenters are searched at once, each within its own deadline, so a node of the other vCenter
/// is initialised at once instead of after the hung vCenter's timeouts (a SOAP call may take
/// 60 s × 3 attempts), and the hung vCenter's node is kept.
#[tokio::test]
async fn a_hung_vcenter_stalls_no_look_up_in_the_other() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let a = Vcsim::start_with(small_model(2))?;
    let (cert, key) = a.tls_files();
    let hung = FaultProxy::start_tls(&format!("https://{}", a.host_port()), &cert, &key).await?;
    hung.add(Rule::new(&[""], Action::Hang));
    let b = Vcsim::start_with(VcsimModel {
        extra_args: vec!["-dc".into(), "2".into()],
        ..small_model(2)
    })?;
    b.set_guest_identity("/DC1/vm/DC1_C0_RP0_VM0", "10.30.0.10", "b-node")?;
    let b_uuid = b
        .govc(&[
            "object.collect",
            "-s",
            "/DC1/vm/DC1_C0_RP0_VM0",
            "summary.config.uuid",
        ])?
        .trim()
        .to_ascii_lowercase();
    let yaml = two_vcenters(&hung.port().to_string(), &a, &b)?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    not_ready_node(&nodes, "a-node", "vsphere://4211aaaa-bbbb-cccc-dddd-eeeeffff0000").await?;
    let mut ccm = start_ccm(&cluster, &yaml, "ccm-hung-vcenter", &[])?;
    // The hung vCenter's look-ups (a-node's) have started when b-node comes, registered by a
    // kubelet with `--provider-id` (a search by UUID: the first vCenter to find it answers).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut b_node = tainted_node("b-node");
    b_node.spec.get_or_insert_with(Default::default).provider_id = Some(format!("vsphere://{b_uuid}"));
    nodes.create(&PostParams::default(), &b_node).await?;
    let created = std::time::Instant::now();
    let n = wait_for("b-node initialised", T, || initialised(&nodes, "b-node")).await?;
    let took = created.elapsed();
    println!("vCenter a hung: b-node (vCenter b) initialised {took:.1?} after it was registered");

    assert_eq!(
        n.spec.and_then(|s| s.provider_id).as_deref(),
        Some(format!("vsphere://{b_uuid}").as_str())
    );
    // The hung vCenter's deadline (10 s) is not waited for: b answered first. (Searched one
    // vCenter after the other, b-node would wait for vCenter a's SOAP timeouts: 60 s per call.)
    assert!(
        took < Duration::from_secs(10),
        "b-node waited {took:?} for the hung vCenter"
    );
    assert!(hung.total() > 0, "the CCM did ask the hung vCenter");
    // The hung vCenter's node: its existence is unknown, so it is kept.
    wait_metric_growth(&ccm, EXISTENCE_UNKNOWN, 1.0).await?;
    assert!(nodes.get_opt("a-node").await?.is_some(), "a-node kept");
    ccm.check_running()?;
    Ok(())
}

async fn put_secret(secrets: &Api<Secret>, password: &str) -> Result<()> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("vsphere-cloud-secret".into()),
            ..Default::default()
        },
        data: Some(
            [
                (
                    "127.0.0.1.username".to_string(),
                    ByteString(b"k8s-user@vsphere.local".to_vec()),
                ),
                (
                    "127.0.0.1.password".to_string(),
                    ByteString(password.as_bytes().to_vec()),
                ),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match secrets.get_opt("vsphere-cloud-secret").await? {
        Some(_) => {
            secrets
                .replace("vsphere-cloud-secret", &PostParams::default(), &secret)
                .await?;
        }
        None => {
            secrets.create(&PostParams::default(), &secret).await?;
        }
    }
    Ok(())
}

const SOAP_LOGINS: &str = "cloudprovider_vsphere_sessions_created_total{api=\"soap\"}";

#[tokio::test]
async fn rotated_passwords_are_picked_up_and_a_wrong_one_is_not_hammered() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let mut vcsim = Vcsim::start_with(small_model(3))?;
    assert_eq!(vcsim.username(), "k8s-user@vsphere.local");
    vcsim.identify(3)?;
    let uuids: Vec<String> = (0..3)
        .map(|i| vcsim.vm_uuid(&vm_name(i)))
        .collect::<Result<_>>()?;
    let client = cluster.client().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    put_secret(&secrets, vcsim.password()).await?;
    let yaml = format!(
        "global:\n  port: {}\n  insecureFlag: true\n  secretName: vsphere-cloud-secret\n  secretNamespace: kube-system\nvcenter:\n  sim:\n    server: 127.0.0.1\n",
        port_of(vcsim.host_port())
    );
    let ccm = start_ccm(&cluster, &yaml, "ccm-rotation", &[])?;
    let nodes: Api<Node> = Api::all(client);
    let add = |i: usize| {
        let nodes = nodes.clone();
        let uuid = uuids[i].clone();
        async move {
            nodes
                .create(&PostParams::default(), &tainted_node(&format!("n{i}")))
                .await?;
            set_system_uuid(&nodes, &format!("n{i}"), &uuid).await
        }
    };
    add(0).await?;
    wait_for("n0 initialised", T, || initialised(&nodes, "n0")).await?;

    // Rotation: vCenter takes a new password, the Secret is updated; no restart of the CCM.
    vcsim.restart_with_password(small_model(3), "rotated-2")?;
    vcsim.identify(3)?;
    put_secret(&secrets, "rotated-2").await?;
    add(1).await?;
    wait_for("n1 initialised with the rotated password", T, || {
        initialised(&nodes, "n1")
    })
    .await?;
    let after_rotation = metric(&ccm, SOAP_LOGINS).await;

    // A wrong password in the Secret: one login attempt, then a long back-off, no loop.
    vcsim.restart_with_password(small_model(3), "rotated-3")?;
    vcsim.identify(3)?;
    put_secret(&secrets, "wrong").await?;
    add(2).await?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let attempts = metric(&ccm, SOAP_LOGINS).await - after_rotation;
    println!("SOAP login attempts in 20 s with a wrong password: {attempts}");
    assert!(
        (1.0..=2.0).contains(&attempts),
        "bounded login attempts with rejected credentials: {attempts}"
    );
    assert!(initialised(&nodes, "n2").await.is_none());
    // The right password goes at once (new credentials are not held back).
    put_secret(&secrets, "rotated-3").await?;
    wait_for("n2 initialised once the Secret is fixed", T, || {
        initialised(&nodes, "n2")
    })
    .await?;
    assert!(!ccm.log().contains("rotated-"), "no password in the log");
    Ok(())
}

#[tokio::test]
async fn a_vcenter_restart_costs_one_login_and_shutdown_logs_out() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let mut vcsim = Vcsim::start_with(small_model(2))?;
    vcsim.identify(2)?;
    let uuids: Vec<String> = (0..2)
        .map(|i| vcsim.vm_uuid(&vm_name(i)))
        .collect::<Result<_>>()?;
    // (The datacenter is named by its inventory path.)
    let yaml = inline_config(&vcsim, port_of(vcsim.host_port()), "  datacenters: [/DC0]\n")?;
    let mut ccm = start_ccm(&cluster, &yaml, "ccm-sessions", &[])?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    for (i, uuid) in uuids.iter().enumerate() {
        if i == 1 {
            vcsim.restart(small_model(2))?;
            vcsim.identify(2)?;
        }
        let name = format!("s{i}");
        nodes.create(&PostParams::default(), &tainted_node(&name)).await?;
        set_system_uuid(&nodes, &name, uuid).await?;
        wait_for(&format!("{name} initialised"), T, || initialised(&nodes, &name)).await?;
        assert_eq!(vcsim.sessions_of(AGENT)?, 1, "one CCM session in vCenter");
    }
    assert_eq!(
        metric(&ccm, SOAP_LOGINS).await,
        2.0,
        "one login, and one more after the restart"
    );
    ccm.signal(Signal::SIGTERM)?;
    ccm.wait_exit(Duration::from_secs(30))?;
    assert_eq!(vcsim.sessions_of(AGENT)?, 0, "the CCM logged out on shutdown");
    Ok(())
}

#[tokio::test]
async fn a_changed_config_file_stops_the_ccm_gracefully_so_that_it_restarts() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let vcsim = Vcsim::start_with(small_model(1))?;
    let yaml = inline_config(&vcsim, port_of(vcsim.host_port()), "")?;
    let mut ccm = start_ccm(&cluster, &yaml, "ccm-config-change", &[])?;
    wait_for("CCM healthy", T, || async {
        (ccm.get("/healthz").await.ok()?.0 == 200).then_some(())
    })
    .await?;
    let path = cluster.dir().join("ccm-config-change.yaml");
    std::fs::write(&path, format!("{yaml}labels:\n  zone: z\n  region: r\n"))?;
    let code = ccm.wait_exit(Duration::from_secs(30))?;
    assert_eq!(code, Some(1), "exit 1 so that the pod is restarted");
    assert!(
        ccm.log().contains("the cloud config file changed"),
        "the log says why"
    );
    Ok(())
}
