//! The bodies of the fuzz targets in `fuzz/` (cargo-fuzz, nightly): each takes arbitrary bytes
//! and feeds them to one parser of untrusted input. A body passes when it returns: parsers
//! answer bad input with an error, never a panic. Where a parser has a property worth more
//! than "no panic" (a provider ID that parses names the instance it was built from), the body
//! asserts it.
//!
//! | target | input |
//! |---|---|
//! | `gcfg` | gcfg (INI) cloud config ([`k8s_cloud_provider::gcfg`]) |
//! | `aws_config` | the AWS cloud config ([`k8s_legacy_cloud_provider_aws::config::CloudConfig`]) |
//! | `vsphere_config` | the vSphere cloud config, YAML or INI |
//! | `aws_annotations` | a Service's `service.beta.kubernetes.io/aws-load-balancer-*` annotations |
//! | `provider_ids` | provider IDs, `node-ip`s, cluster CIDRs, Go durations, guestinfo |
//! | `leader_migration` | the leader-migration configuration file |
//! | `vsphere_soap` | a vCenter SOAP answer (XML reader and fault parser) |
//! | `vsphere_soap_typed` | a vCenter answer read as what the provider asked for (service content, property sets, typed properties) |
//! | `openstack_config` | the OpenStack cloud config (INI) and a clouds.yaml |
//! | `openstack_keystone` | keystone's answer to a token request (status, token, catalog, expiry) |
//!
//! The seeds of each target include deeply nested documents (XML, JSON, YAML, past every
//! nesting limit), so that the fuzzers start from them.

#[cfg(feature = "aws")]
use std::collections::BTreeMap;

#[cfg(feature = "aws")]
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
#[cfg(feature = "aws")]
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The body of a target.
pub type Body = fn(&[u8]);

/// Every target of the enabled features (`aws`, `vsphere`; both by default): name and body.
pub const TARGETS: &[(&str, Body)] = &[
    ("gcfg", gcfg),
    #[cfg(feature = "aws")]
    ("aws_config", aws_config),
    #[cfg(feature = "vsphere")]
    ("vsphere_config", vsphere_config),
    #[cfg(feature = "aws")]
    ("aws_annotations", aws_annotations),
    ("provider_ids", provider_ids),
    ("leader_migration", leader_migration),
    #[cfg(feature = "vsphere")]
    ("vsphere_soap", vsphere_soap),
    #[cfg(feature = "vsphere")]
    ("vsphere_soap_typed", vsphere_soap_typed),
    #[cfg(feature = "openstack")]
    ("openstack_config", openstack_config),
    #[cfg(feature = "openstack")]
    ("openstack_keystone", openstack_keystone),
];

/// The gcfg reader and its value helpers.
pub fn gcfg(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(sections) = k8s_cloud_provider::gcfg::parse(&text) {
        for s in &sections {
            let _ = format!("{s:?}");
        }
    }
    let _ = k8s_cloud_provider::gcfg::parse_int(&text);
    let _ = k8s_cloud_provider::gcfg::parse_bool(Some(&text));
}

/// The AWS cloud config.
#[cfg(feature = "aws")]
pub fn aws_config(data: &[u8]) {
    let _ = k8s_legacy_cloud_provider_aws::config::CloudConfig::parse(Some(data));
}

/// The vSphere cloud config (YAML or INI), with the environment overrides.
#[cfg(feature = "vsphere")]
pub fn vsphere_config(data: &[u8]) {
    use k8s_legacy_cloud_provider_vsphere::config::VsphereConfig;
    if let Ok(cfg) = VsphereConfig::parse(Some(data)) {
        let _ = cfg.apply_env(|_| None);
    }
}

/// A Service built from the input: each line `key=value` is an annotation (keys without a
/// `/` get the AWS prefix), a line `port=<n>/<protocol>` a port.
#[cfg(feature = "aws")]
pub fn service_from(data: &[u8]) -> Service {
    let text = String::from_utf8_lossy(data);
    let mut annotations = BTreeMap::new();
    let mut ports = Vec::new();
    for line in text.lines() {
        let (k, v) = line.split_once('=').unwrap_or((line, ""));
        if k == "port" {
            let (p, proto) = v.split_once('/').unwrap_or((v, "TCP"));
            ports.push(ServicePort {
                port: p.parse().unwrap_or(0),
                protocol: Some(proto.to_string()),
                node_port: Some(30000 + ports.len() as i32),
                ..Default::default()
            });
        } else if k.contains('/') {
            annotations.insert(k.to_string(), v.to_string());
        } else {
            annotations.insert(
                format!("service.beta.kubernetes.io/aws-load-balancer-{k}"),
                v.to_string(),
            );
        }
    }
    Service {
        metadata: ObjectMeta {
            name: Some("fuzz".into()),
            namespace: Some("default".into()),
            uid: Some("5b2c1f0e-9a8d-4c3b-a2e1-0f9e8d7c6b5a".into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(ports),
            ..Default::default()
        }),
        status: None,
    }
}

/// The AWS load-balancer annotations.
#[cfg(feature = "aws")]
pub fn aws_annotations(data: &[u8]) {
    let svc = service_from(data);
    let _ = k8s_legacy_cloud_provider_aws::annotations::LbOptions::parse(&svc);
    let _ = k8s_cloud_provider::service::helpers::load_balancer_source_ranges(&svc);
}

/// Provider IDs (generic, AWS, vSphere) and the other one-line values the controllers parse.
pub fn provider_ids(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = k8s_cloud_provider::node::helpers::ProviderId::parse(&text);
    let _ = k8s_cloud_provider::node::helpers::parse_provided_node_ips(&text);
    let _ = k8s_cloud_provider::controllers::route::parse_cluster_cidrs(&text);
    let _ = k8s_controller_manager::duration::parse_go_duration(&text);
    let _ = k8s_cloud_provider::service::helpers::parse_go_bool(&text);
    #[cfg(feature = "vsphere")]
    {
        let _ = k8s_legacy_cloud_provider_vsphere::uuid_from_provider_id(&text);
        let pairs: Vec<(String, String)> = text
            .lines()
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap_or((l, ""));
                (k.to_string(), v.to_string())
            })
            .collect();
        let _ = k8s_legacy_cloud_provider_vsphere::guestinfo::static_addresses(&pairs);
    }
    // Property: an AWS provider ID built from a zone and an instance ID names that instance.
    #[cfg(feature = "aws")]
    if let Ok(id) = k8s_legacy_cloud_provider_aws::instances::instance_id_from_provider_id(&text) {
        let again = k8s_legacy_cloud_provider_aws::instances::provider_id_for("us-east-1a", &id);
        assert_eq!(
            k8s_legacy_cloud_provider_aws::instances::instance_id_from_provider_id(&again).as_deref(),
            Ok(id.as_str()),
            "{again:?}"
        );
    }
}

/// The leader-migration configuration.
pub fn leader_migration(data: &[u8]) {
    let _ = k8s_controller_manager::leadermigration::LeaderMigrationConfiguration::parse(
        &String::from_utf8_lossy(data),
    );
}

/// A SOAP answer: the first two bytes choose the HTTP status, the rest is the body.
#[cfg(feature = "vsphere")]
pub fn vsphere_soap(data: &[u8]) {
    let (status, body) = match data {
        [a, b, rest @ ..] => (100 + (u16::from(*a) << 8 | u16::from(*b)) % 500, rest),
        _ => (200, data),
    };
    let text = String::from_utf8_lossy(body);
    let _ = vsphere_api::xml::parse(&text);
    let _ = vsphere_api::soap::read_answer("https://vcenter.invalid/sdk", status, &text);
}

/// A SOAP answer read as each typed answer the provider decodes: the service content, a
/// `RetrievePropertiesEx` result and every property the vSphere provider reads from it.
#[cfg(feature = "vsphere")]
pub fn vsphere_soap_typed(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(answer) = vsphere_api::soap::read_answer("https://vcenter.invalid/sdk", 200, &text) else {
        return;
    };
    let _ = vsphere_api::ServiceContent::from_answer(&answer);
    let mut sets = Vec::new();
    let _ = vsphere_api::soap::read_retrieve_result(&answer, &mut sets);
    let mut parents = std::collections::BTreeMap::new();
    for (obj, props) in &sets {
        for path in [
            "name",
            "summary.config.uuid",
            "summary.runtime.powerState",
            "summary.config.guestId",
        ] {
            let _ = props.string(path);
        }
        let _ = props.int("summary.config.numCpu");
        let _ = props.int("summary.config.memorySizeMB");
        let _ = props.option_values("config.extraConfig");
        let _ = props.guest_nics("guest.net");
        parents.insert(obj.clone(), props.moref("parent"));
    }
    if let Some((first, _)) = sets.first() {
        let chain = vsphere_api::soap::Client::chain(&parents, first);
        assert!(chain.len() <= 65, "an ancestor chain is bounded");
    }
}

/// The OpenStack cloud config, validated, and the input as a clouds.yaml.
#[cfg(feature = "openstack")]
pub fn openstack_config(data: &[u8]) {
    use k8s_legacy_cloud_provider_openstack::config::OpenStackConfig;
    if let Ok(cfg) = OpenStackConfig::parse(Some(data)) {
        let _ = cfg.validate();
    }
    let mut cfg = OpenStackConfig::default();
    let _ = cfg.apply_clouds_yaml_text(&String::from_utf8_lossy(data), "openstack", "fuzz");
}

/// Keystone's answer to a token request: the first byte chooses the HTTP status (200, 201,
/// 401, 500), the second whether the `X-Subject-Token` header is there, the rest is the body.
#[cfg(feature = "openstack")]
pub fn openstack_keystone(data: &[u8]) {
    use k8s_legacy_cloud_provider_openstack::client::{read_token_answer, unix_seconds_utc};
    let (status, token, body) = match data {
        [a, b, rest @ ..] => ([200, 201, 401, 500][usize::from(*a) % 4], b % 2 == 0, rest),
        _ => (201, true, data),
    };
    let status = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    let now = 1_790_000_000;
    if let Ok(answer) = read_token_answer(
        "https://keystone.invalid/v3/auth/tokens",
        status,
        token.then_some("gAAAA-fuzz"),
        body,
        now,
    ) {
        assert_eq!(answer.value, "gAAAA-fuzz");
        for entry in &answer.catalog {
            let _ = entry.endpoints.iter().find(|e| e.interface == "public");
        }
    }
    let _ = unix_seconds_utc(&String::from_utf8_lossy(body));
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    /// Seeds (also the cargo-fuzz corpus: `fuzz/corpus/<target>/`) and every input a fuzzer
    /// ever crashed a target with (`fuzz/regressions/<target>/`).
    fn inputs(dir: &str, target: &str) -> Vec<Vec<u8>> {
        // CARGO_MANIFEST_DIR of the run first: a build cache shared by checkouts at other paths
        // can hold this test binary, still fresh by its sources' times, compiled in another
        // checkout (whose corpus may be gone).
        let path = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
            .join("../../fuzz")
            .join(dir)
            .join(target);
        let Ok(entries) = std::fs::read_dir(&path) else {
            return Vec::new();
        };
        let mut files: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.sort();
        files.into_iter().filter_map(|p| std::fs::read(p).ok()).collect()
    }

    /// Byte-level mutations of a seed (bit flips, insertions, deletions, splices of another
    /// seed): a few thousand per target on stable Rust, so CI replays the fuzzers' ground in
    /// seconds. The real fuzzing (coverage-guided, millions of inputs) is `hack/fuzz.sh`.
    fn mutate(rng: &mut rand::rngs::StdRng, seed: &[u8], other: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..rng.random_range(1..8) {
            match rng.random_range(0..5) {
                0 if !v.is_empty() => {
                    let i = rng.random_range(0..v.len());
                    v[i] ^= 1 << rng.random_range(0..8);
                }
                1 => {
                    let i = rng.random_range(0..=v.len());
                    v.insert(
                        i,
                        *b"=\n[]\"#;:/<>&-0123456789 aZ\xff"
                            .get(rng.random_range(0..25))
                            .unwrap_or(&b'x'),
                    );
                }
                2 if !v.is_empty() => {
                    let i = rng.random_range(0..v.len());
                    let j = rng.random_range(i..=v.len().min(i + 16));
                    v.drain(i..j);
                }
                3 if !other.is_empty() => {
                    let i = rng.random_range(0..=v.len());
                    let a = rng.random_range(0..other.len());
                    let b = rng.random_range(a..=other.len().min(a + 64));
                    v.splice(i..i, other[a..b].iter().copied());
                }
                _ => {
                    let i = rng.random_range(0..=v.len());
                    let j = rng.random_range(i..=v.len());
                    v.truncate(j);
                    v.drain(..i.min(v.len()));
                }
            }
        }
        v
    }

    #[test]
    fn every_target_survives_its_seeds_regressions_and_random_mutations() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        for (name, body) in super::TARGETS {
            let seeds = inputs("corpus", name);
            assert!(!seeds.is_empty(), "fuzz/corpus/{name}/ has seeds");
            for input in seeds.iter().chain(inputs("regressions", name).iter()) {
                body(input);
            }
            for i in 0..3000 {
                let seed = &seeds[i % seeds.len()];
                let other = &seeds[rng.random_range(0..seeds.len())];
                body(&mutate(&mut rng, seed, other));
            }
        }
    }
}
