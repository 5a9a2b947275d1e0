//! Leader migration (KEP-2436, spec §7): moving cloud controllers from kube-controller-manager
//! (KCM) to a cloud-controller-manager (CCM) of a running HA cluster without ever running a
//! controller twice or not at all.
//!
//! A `LeaderMigrationConfiguration` (group `controllermanager.config.k8s.io`, versions `v1`,
//! `v1beta1`, `v1alpha1`) lists controllers and which component runs them during the
//! migration. For a component, each of its controllers is
//! - **Migrated** (listed with this component or `*`): runs only while the component also holds
//!   the *migration* lock (a Lease named `leaderName`) that both components contend for;
//! - **Unowned** (listed with the other component): not run at all;
//! - **NonMigrated** (not listed): runs under the component's normal (primary) lock.
//!
//! Deliberate differences from upstream (spec §7.1–7.2):
//! - controller names in the config are resolved through the same alias table as
//!   `--controllers` (`route`, `route-controller` and `node-route-controller` are the same
//!   controller); a name that matches no controller is an error, not a silent no-op;
//! - `resourceLock: leases` in a `v1` document (as the official documentation shows it) is
//!   accepted with a warning; any other unknown field is an error;
//! - `resourceLock: endpoints` is rejected: only Lease locks exist here.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::controllers::ControllerRegistry;

/// The values `component` may take.
pub const COMPONENTS: [&str; 3] = ["kube-controller-manager", "cloud-controller-manager", "*"];

/// API group of the configuration.
pub const GROUP: &str = "controllermanager.config.k8s.io";
/// Kind of the configuration.
pub const KIND: &str = "LeaderMigrationConfiguration";
/// Default migration Lease name.
pub const DEFAULT_LEADER_NAME: &str = "cloud-provider-extraction-migration";
/// Component name of the cloud-controller-manager.
pub const CCM: &str = "cloud-controller-manager";
/// Component name of kube-controller-manager.
pub const KCM: &str = "kube-controller-manager";

/// One `controllerLeaders` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerLeader {
    /// Controller name as written.
    pub name: String,
    /// `kube-controller-manager`, `cloud-controller-manager` or `*`.
    pub component: String,
}

/// A parsed and validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderMigrationConfiguration {
    /// Name of the migration Lease.
    pub leader_name: String,
    /// Lock type (always `leases`).
    pub resource_lock: String,
    /// The controllers that migrate.
    pub controller_leaders: Vec<ControllerLeader>,
}

/// A configuration error; the message names the entry or field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leader migration configuration: {0}")]
pub struct ConfigError(pub String);

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLeader {
    name: Option<String>,
    component: Option<String>,
    #[serde(flatten)]
    unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    api_version: Option<String>,
    kind: Option<String>,
    leader_name: Option<String>,
    resource_lock: Option<String>,
    #[serde(default)]
    controller_leaders: Vec<RawLeader>,
    #[serde(flatten)]
    unknown: BTreeMap<String, serde_json::Value>,
}

/// How a controller runs for one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classification {
    /// Under the migration lock.
    Migrated,
    /// Not at all (the other component runs it).
    Unowned,
    /// Under the component's primary lock.
    NonMigrated,
}

impl LeaderMigrationConfiguration {
    /// The configuration used when `--enable-leader-migration` is given without a file: the
    /// route, service and cloud-node-lifecycle controllers migrate, component `*`.
    pub fn default_config() -> Self {
        Self {
            leader_name: DEFAULT_LEADER_NAME.into(),
            resource_lock: "leases".into(),
            controller_leaders: ["route", "service", "cloud-node-lifecycle"]
                .into_iter()
                .map(|n| ControllerLeader {
                    name: n.into(),
                    component: "*".into(),
                })
                .collect(),
        }
    }

    /// Parses a YAML (or JSON) document, strictly, and validates it.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let raw: Raw =
            serde_saphyr::from_str(text).map_err(|e| ConfigError(format!("not valid YAML: {e}")))?;
        let api_version = raw.api_version.clone().unwrap_or_default();
        let version = match api_version.split_once('/') {
            Some((g, v)) if g == GROUP && matches!(v, "v1" | "v1beta1" | "v1alpha1") => v.to_string(),
            _ => {
                return Err(ConfigError(format!(
                    "apiVersion {api_version:?} is not {GROUP}/v1, {GROUP}/v1beta1 or {GROUP}/v1alpha1"
                )));
            }
        };
        if raw.kind.as_deref() != Some(KIND) {
            return Err(ConfigError(format!(
                "kind {:?} is not {KIND}",
                raw.kind.unwrap_or_default()
            )));
        }
        if let Some(field) = raw.unknown.keys().next() {
            return Err(ConfigError(format!("unknown field {field:?}")));
        }
        let resource_lock = match (version.as_str(), raw.resource_lock) {
            ("v1", None) => "leases".to_string(),
            ("v1", Some(lock)) if lock == "leases" => {
                tracing::warn!(
                    "leader migration configuration: resourceLock is not a field of v1 (it is always leases); accepted for compatibility"
                );
                lock
            }
            ("v1", Some(lock)) => {
                return Err(ConfigError(format!(
                    "resourceLock {lock:?}: v1 has no resourceLock field (locks are always leases)"
                )));
            }
            (_, None) => {
                return Err(ConfigError(
                    "resource Lock must be one of 'leases' or 'endpoints'".into(),
                ));
            }
            (_, Some(lock)) => lock,
        };
        match resource_lock.as_str() {
            "leases" => {}
            "endpoints" => {
                return Err(ConfigError(
                    "resourceLock \"endpoints\" is not supported: use \"leases\"".into(),
                ));
            }
            other => {
                return Err(ConfigError(format!(
                    "resource Lock must be one of 'leases' or 'endpoints' (got {other:?})"
                )));
            }
        }
        let leader_name = raw.leader_name.unwrap_or_default();
        if leader_name.is_empty() {
            return Err(ConfigError(
                "leaderName must be set for LeaderMigrationConfiguration".into(),
            ));
        }
        let mut controller_leaders = Vec::new();
        for (i, l) in raw.controller_leaders.into_iter().enumerate() {
            if let Some(field) = l.unknown.keys().next() {
                return Err(ConfigError(format!(
                    "controllerLeaders[{i}]: unknown field {field:?}"
                )));
            }
            let name = l.name.unwrap_or_default();
            let component = l.component.unwrap_or_default();
            if name.is_empty() {
                return Err(ConfigError(format!("controllerLeaders[{i}]: name must be set")));
            }
            if component.is_empty() {
                return Err(ConfigError(format!(
                    "controllerLeaders[{i}] ({name}): component must be set"
                )));
            }
            if !COMPONENTS.contains(&component.as_str()) {
                return Err(ConfigError(format!(
                    "controllerLeaders[{i}] ({name}): component {component:?} must be one of {}",
                    COMPONENTS.join(", ")
                )));
            }
            controller_leaders.push(ControllerLeader { name, component });
        }
        Ok(Self {
            leader_name,
            resource_lock,
            controller_leaders,
        })
    }

    /// Resolves every entry's name through `registry` (aliases included). A name this
    /// component does not know is logged and skipped — the same file configures the other
    /// component (e.g. kube-controller-manager's `nodeipam`). Two entries naming the same
    /// controller are an error naming the entry.
    pub fn resolve(&self, registry: &ControllerRegistry) -> Result<BTreeMap<String, String>, ConfigError> {
        let mut out = BTreeMap::new();
        for (i, l) in self.controller_leaders.iter().enumerate() {
            let Some(canonical) = registry.canonical(&l.name) else {
                tracing::warn!(
                    entry = i,
                    name = %l.name,
                    "leader migration: controllerLeaders[{i}] {:?} is not a controller of this component (known: {}); ignored",
                    l.name,
                    registry.known().collect::<Vec<_>>().join(", ")
                );
                continue;
            };
            if out.insert(canonical.to_string(), l.component.clone()).is_some() {
                return Err(ConfigError(format!(
                    "controllerLeaders[{i}]: {:?} names {canonical} a second time",
                    l.name
                )));
            }
        }
        Ok(out)
    }

    /// How `component` runs the controller `canonical`, given the resolved entries.
    pub fn classify(resolved: &BTreeMap<String, String>, canonical: &str, component: &str) -> Classification {
        match resolved.get(canonical) {
            None => Classification::NonMigrated,
            Some(c) if c == component || c == "*" => Classification::Migrated,
            Some(_) => Classification::Unowned,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> ControllerRegistry {
        let mut r = ControllerRegistry::new();
        r.register("cloud-node-controller", &["cloud-node"], true)
            .register("cloud-node-lifecycle-controller", &["cloud-node-lifecycle"], true)
            .register("service-lb-controller", &["service", "service-controller"], true)
            .register("node-route-controller", &["route", "route-controller"], true);
        r
    }

    const DOC_V1_WITH_LOCK: &str = "kind: LeaderMigrationConfiguration
apiVersion: controllermanager.config.k8s.io/v1
leaderName: cloud-provider-extraction-migration
resourceLock: leases
controllerLeaders:
  - name: route
    component: \"*\"
  - name: service
    component: \"*\"
  - name: cloud-node-lifecycle
    component: \"*\"
";

    #[test]
    fn the_documented_v1_example_with_resource_lock_is_accepted() {
        let c = LeaderMigrationConfiguration::parse(DOC_V1_WITH_LOCK).unwrap();
        assert_eq!(c, LeaderMigrationConfiguration::default_config());
    }

    #[test]
    fn older_versions_need_a_lock() {
        let doc = DOC_V1_WITH_LOCK.replace("/v1\n", "/v1beta1\n");
        assert!(LeaderMigrationConfiguration::parse(&doc).is_ok());
        let no_lock = doc.replace("resourceLock: leases\n", "");
        assert!(
            LeaderMigrationConfiguration::parse(&no_lock)
                .unwrap_err()
                .0
                .contains("'leases' or 'endpoints'")
        );
        let endpoints = doc.replace("resourceLock: leases", "resourceLock: endpoints");
        assert!(
            LeaderMigrationConfiguration::parse(&endpoints)
                .unwrap_err()
                .0
                .contains("\"endpoints\" is not supported")
        );
        let alpha = DOC_V1_WITH_LOCK.replace("/v1\n", "/v1alpha1\n");
        assert!(LeaderMigrationConfiguration::parse(&alpha).is_ok());
    }

    #[test]
    fn strict_decoding_and_validation_name_the_problem() {
        let cases = [
            (
                DOC_V1_WITH_LOCK.replace("leaderName: cloud-provider-extraction-migration\n", ""),
                "leaderName must be set",
            ),
            (
                DOC_V1_WITH_LOCK.replace("apiVersion: controllermanager.config.k8s.io/v1", "apiVersion: v1"),
                "apiVersion \"v1\" is not",
            ),
            (
                DOC_V1_WITH_LOCK.replace("kind: LeaderMigrationConfiguration", "kind: Nope"),
                "kind \"Nope\"",
            ),
            (format!("{DOC_V1_WITH_LOCK}extra: 1\n"), "unknown field \"extra\""),
            (
                DOC_V1_WITH_LOCK.replace(
                    "    component: \"*\"\n  - name: service",
                    "    compnent: \"*\"\n  - name: service",
                ),
                "controllerLeaders[0]: unknown field \"compnent\"",
            ),
            (
                DOC_V1_WITH_LOCK.replace("resourceLock: leases", "resourceLock: configmaps"),
                "v1 has no resourceLock field",
            ),
            ("{{{".to_string(), "not valid YAML"),
        ];
        for (doc, needle) in cases {
            let e = LeaderMigrationConfiguration::parse(&doc).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
        }
        let typo = DOC_V1_WITH_LOCK.replacen("component: \"*\"", "component: kube-controler-manager", 1);
        assert!(
            LeaderMigrationConfiguration::parse(&typo)
                .unwrap_err()
                .0
                .contains("controllerLeaders[0] (route): component \"kube-controler-manager\" must be one of kube-controller-manager, cloud-controller-manager, *")
        );
        let missing_component = DOC_V1_WITH_LOCK.replacen("    component: \"*\"\n", "", 1);
        assert_eq!(
            LeaderMigrationConfiguration::parse(&missing_component)
                .unwrap_err()
                .0,
            "controllerLeaders[0] (route): component must be set"
        );
    }

    #[test]
    fn names_resolve_through_aliases_and_unknown_names_are_skipped() {
        let r = registry();
        let resolved = LeaderMigrationConfiguration::default_config()
            .resolve(&r)
            .unwrap();
        assert_eq!(
            resolved.keys().collect::<Vec<_>>(),
            vec![
                "cloud-node-lifecycle-controller",
                "node-route-controller",
                "service-lb-controller"
            ]
        );
        let mut c = LeaderMigrationConfiguration::default_config();
        c.controller_leaders.push(ControllerLeader {
            name: "nodeipam".into(),
            component: "*".into(),
        });
        assert_eq!(
            c.resolve(&r).unwrap().len(),
            3,
            "the other component's controller is skipped"
        );
        let mut dup = LeaderMigrationConfiguration::default_config();
        dup.controller_leaders.push(ControllerLeader {
            name: "route-controller".into(),
            component: "*".into(),
        });
        assert!(
            dup.resolve(&r)
                .unwrap_err()
                .0
                .contains("names node-route-controller a second time")
        );
    }

    #[test]
    fn classification() {
        let r = registry();
        let mut c = LeaderMigrationConfiguration::default_config();
        c.controller_leaders[1].component = KCM.into();
        c.controller_leaders[2].component = CCM.into();
        let resolved = c.resolve(&r).unwrap();
        use Classification::*;
        assert_eq!(
            LeaderMigrationConfiguration::classify(&resolved, "node-route-controller", CCM),
            Migrated
        );
        assert_eq!(
            LeaderMigrationConfiguration::classify(&resolved, "service-lb-controller", CCM),
            Unowned
        );
        assert_eq!(
            LeaderMigrationConfiguration::classify(&resolved, "service-lb-controller", KCM),
            Migrated
        );
        assert_eq!(
            LeaderMigrationConfiguration::classify(&resolved, "cloud-node-lifecycle-controller", CCM),
            Migrated
        );
        assert_eq!(
            LeaderMigrationConfiguration::classify(&resolved, "cloud-node-controller", CCM),
            NonMigrated
        );
    }
}
