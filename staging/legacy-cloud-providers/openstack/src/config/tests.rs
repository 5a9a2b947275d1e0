//! The cloud config's unit tests.

use super::*;

#[test]
fn global_load_balancer_networking_and_route_sections() {
    let c = OpenStackConfig::parse(Some(
        br#"
[Global]
auth-url = http://127.0.0.1:5000/v3
username = demo
password = "s3cret"
tenant-name = demo
domain-name = Default
region = RegionOne
[LoadBalancer]
subnet-id = 1234
floating-network-id = 5678
lb-method = SOURCE_IP
create-monitor = true
monitor-delay = 1m30s
[Networking]
public-network-name = public
public-network-name = ext
internal-network-name = private
ipv6-support-disabled = true
[Route]
router-id = r1
[Metadata]
search-order = metadataService
[BlockStorage]
bs-version = v3
"#,
    ))
    .unwrap();
    assert_eq!(c.global.auth.username, "demo");
    assert_eq!(c.global.auth.password, "s3cret");
    assert_eq!(c.global.region, "RegionOne");
    assert_eq!(c.global.interface, "public");
    assert_eq!(c.load_balancer.lb_method, "SOURCE_IP");
    assert!(c.load_balancer.monitor.create);
    assert_eq!(c.load_balancer.monitor.delay, Duration::from_secs(90));
    assert_eq!(c.networking.public_network_names, ["public", "ext"]);
    assert_eq!(c.route.router_id, "r1");
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    c.validate().unwrap();
    assert!(!format!("{:?}", c).contains("s3cret"));
}

/// OCCM's documented `os-endpoint-type` (an earlier version logged it as an unknown key and
/// used public endpoints); `member-subnet-id` too.
#[test]
fn occm_shared_load_balancers_classes_and_keys_not_acted_on() {
    let c = OpenStackConfig::parse(Some(
        br#"[LoadBalancer]
max-shared-lb = 5
node-selector = "env=prod, lb"
manage-security-groups = true
lb-version = v2
floating-subnet = public-*
floating-subnet-tags = &lb,prod
enable-ingress-hostname = true
default-tls-container-ref = https://barbican.example/v1/containers/abc
[LoadBalancerClass "internet"]
floating-network-id = ext-net
floating-subnet-id = ext-sub
member-subnet-id = members
[LoadBalancerClass "cheap"]
subnet-id = vip-sub
floating-subnet-tags = !old
colour = blue
"#,
    ))
    .unwrap();
    let lb = &c.load_balancer;
    assert_eq!(lb.max_shared_lb, 5);
    assert_eq!(lb.node_selector, "env=prod, lb");
    assert_eq!(lb.classes.len(), 2);
    assert_eq!(lb.classes["internet"].floating_network_id, "ext-net");
    assert_eq!(lb.classes["internet"].floating_subnet_id, "ext-sub");
    assert_eq!(lb.classes["internet"].member_subnet_id, "members");
    assert_eq!(lb.classes["cheap"].subnet_id, "vip-sub");
    // Warned, never fatal: an OCCM cloud.conf is read unchanged.
    let w = c.warnings.join("\n");
    assert_eq!(lb.floating_subnet, "public-*");
    assert_eq!(lb.floating_subnet_tags, "&lb,prod");
    assert_eq!(lb.classes["cheap"].floating_subnet_tags, "!old");
    assert!(lb.enable_ingress_hostname);
    assert_eq!(lb.ingress_hostname_suffix, "nip.io", "the default");
    assert!(w.contains("colour"), "colour not warned: {w}");
    assert_eq!(c.warnings.len(), 1, "{w}");
    assert!(lb.manage_security_groups);
    assert_eq!(lb.tls_container_ref, "https://barbican.example/v1/containers/abc");
    assert_eq!(lb.container_store, ContainerStore::Barbican, "OCCM's default");
    assert_eq!(
        OpenStackConfig::parse(Some(b"[LoadBalancer]\nmax-shared-lb = 2\n"))
            .unwrap()
            .load_balancer
            .max_shared_lb,
        2
    );
    assert_eq!(OpenStackConfig::default().load_balancer.max_shared_lb, 2);
    for (bad, names) in [
        ("[LoadBalancer]\nmax-shared-lb = 0\n", "max-shared-lb"),
        ("[LoadBalancer]\nmax-shared-lb = many\n", "many"),
        ("[LoadBalancer]\nlb-version = v1\n", "v1"),
        ("[LoadBalancerClass]\nsubnet-id = x\n", "needs a name"),
        (
            "[LoadBalancer]\nfloating-subnet = ~(\n",
            "not a valid subnet name pattern",
        ),
    ] {
        let e = OpenStackConfig::parse(Some(bad.as_bytes()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(names), "{bad:?}: {e}");
    }
}

#[test]
fn occm_endpoint_type_and_member_subnet() {
    let c = OpenStackConfig::parse(Some(
        b"[Global]\nos-endpoint-type = internalURL\n[LoadBalancer]\nmember-subnet-id = m1\n",
    ))
    .unwrap();
    assert_eq!(c.global.interface, "internal");
    assert_eq!(c.load_balancer.member_subnet_id, "m1");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn bad_values_name_the_key_and_value() {
    let e = OpenStackConfig::parse(Some(b"[LoadBalancer]\nlb-method = RANDOM\n")).unwrap_err();
    assert!(
        e.to_string().contains("lb-method") && e.to_string().contains("RANDOM"),
        "{e}"
    );
    let e = OpenStackConfig::parse(Some(b"[LoadBalancer]\nmonitor-delay = soon\n")).unwrap_err();
    assert!(
        e.to_string().contains("monitor-delay") && e.to_string().contains("soon"),
        "{e}"
    );
    let e =
        OpenStackConfig::parse(Some(b"[Networking]\naddress-sort-order = 10.0.0.0/8, nope\n")).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    let e = OpenStackConfig::parse(Some(b"[Global]\nauth-url = x\nusername = u\npassword = p\n"))
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("auth-url"), "{e}");
    let e = OpenStackConfig::parse(Some(b"[Global]\nauth-url = http://k/v3\nusername = u\n"))
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("password"), "{e}");
}

#[test]
fn clouds_yaml_fills_what_the_ini_leaves_empty() {
    let dir = std::env::temp_dir().join(format!("rcp-clouds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("clouds.yaml");
    std::fs::write(
        &file,
        "clouds:\n  mine:\n    auth:\n      auth_url: http://k:5000/v3\n      username: u\n      password: p\n      project_name: demo\n      user_domain_name: Default\n    region_name: R2\n",
    )
    .unwrap();
    let ini = format!(
        "[Global]\nuse-clouds = true\nclouds-file = {}\ncloud = mine\nusername = override\n",
        file.display()
    );
    let c = OpenStackConfig::parse(Some(ini.as_bytes())).unwrap();
    assert_eq!(c.global.auth.auth_url, "http://k:5000/v3");
    assert_eq!(c.global.auth.username, "override");
    assert_eq!(c.global.auth.project_name, "demo");
    assert_eq!(c.global.region, "R2");
    let ini = format!(
        "[Global]\nuse-clouds = true\nclouds-file = {}\ncloud = other\n",
        file.display()
    );
    let e = OpenStackConfig::parse(Some(ini.as_bytes())).unwrap_err();
    assert!(
        e.to_string().contains("\"other\"") && e.to_string().contains("mine"),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// `default-tls-container-ref` and `container-store` as OCCM reads them; a reference that is not
/// barbican's is refused at start-up only while the store is barbican.
#[test]
fn tls_container_ref_and_container_store() {
    let config = |ini: &str| {
        OpenStackConfig::parse(Some(
            format!(
                "[Global]\nauth-url = http://k:5000/v3\nusername = u\npassword = p\n[LoadBalancer]\n{ini}"
            )
            .as_bytes(),
        ))
    };
    let c = config("container-store = external\ndefault-tls-container-ref = vault://certs/web\n").unwrap();
    assert_eq!(c.load_balancer.container_store, ContainerStore::External);
    c.validate().unwrap();
    let c = config("default-tls-container-ref = vault://certs/web\n").unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("[LoadBalancer] default-tls-container-ref") && e.contains("vault://certs/web"),
        "{e}"
    );
    let e = config("container-store = castellan\n").unwrap_err().to_string();
    assert!(e.contains("container-store") && e.contains("castellan"), "{e}");
}
