//! `--feature-gates`: the gates Go's cloud-controller-manager 1.37 knows
//! (`k8s.io/controller-manager`'s, `k8s.io/component-base`'s logging, metrics and z-pages
//! gates, and `k8s.io/apiserver`'s, which the Go binary registers too), so that a manifest
//! written for it starts here unchanged.
//!
//! None of them changes what this cloud-controller-manager does: the behaviour they switch is
//! either Go-specific (API server caches, Go's HTTP/2 mitigation, klog options), served the
//! same way here whatever the gate says, or not built (webhooks). A gate set to other than its
//! default is therefore reported at start-up ("has no effect here"); an unknown gate or a value
//! that is not a boolean is an error, as upstream's.

use std::collections::BTreeMap;

/// Maturity of a gate, as upstream prints it in `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Off by default, may change or go away.
    Alpha,
    /// Usually on by default.
    Beta,
}

/// A feature gate Go's cloud-controller-manager knows: name, stage, default.
pub const FEATURE_GATES: &[(&str, Stage, bool)] = &[
    ("APIResponseCompression", Stage::Beta, true),
    ("APIServerIdentity", Stage::Beta, true),
    ("APIServerWebhookAuthenticationToken", Stage::Alpha, false),
    ("APIServingWithRoutine", Stage::Alpha, false),
    ("AllAlpha", Stage::Alpha, false),
    ("AllBeta", Stage::Beta, false),
    ("AllowParsingUserUIDFromCertAuth", Stage::Beta, true),
    ("AllowUnsafeMalformedObjectDeletion", Stage::Beta, true),
    ("CBORServingAndStorage", Stage::Alpha, false),
    (
        "CloudControllerManagerWatchBasedRoutesReconciliation",
        Stage::Alpha,
        false,
    ),
    ("CloudControllerManagerWebhook", Stage::Alpha, false),
    ("ComponentFlagz", Stage::Beta, true),
    ("ComponentStatusz", Stage::Beta, true),
    ("ConcurrentWatchObjectDecode", Stage::Beta, true),
    ("ConsistentListFromCacheSkipTimeoutFallback", Stage::Alpha, false),
    ("ConstrainedImpersonation", Stage::Beta, true),
    ("ContextualLogging", Stage::Beta, true),
    (
        "ControllerManagerReleaseLeaderElectionLockOnExit",
        Stage::Alpha,
        false,
    ),
    ("CoordinatedLeaderElection", Stage::Beta, false),
    ("DeclarativeValidationBeta", Stage::Beta, true),
    ("DetectCacheInconsistency", Stage::Beta, true),
    ("EtcdRangeStream", Stage::Beta, true),
    ("ExcludeAdmissionWebhookVirtualResources", Stage::Beta, true),
    ("ListFromCacheSnapshot", Stage::Beta, true),
    ("LoggingAlphaOptions", Stage::Alpha, false),
    ("LoggingBetaOptions", Stage::Beta, true),
    ("ManifestBasedAdmissionControlConfig", Stage::Beta, true),
    ("NativeHistograms", Stage::Beta, true),
    ("OpenAPIEnums", Stage::Beta, true),
    ("RemoteRequestHeaderUID", Stage::Beta, true),
    ("ShardedListAndWatch", Stage::Alpha, false),
    ("SizeBasedListCostEstimate", Stage::Beta, true),
    ("StorageVersionAPI", Stage::Alpha, false),
    ("StorageVersionHash", Stage::Beta, true),
    (
        "StructuredAuthenticationConfigurationEgressSelector",
        Stage::Beta,
        true,
    ),
    (
        "StructuredAuthenticationConfigurationJWKSMetrics",
        Stage::Beta,
        true,
    ),
    ("TokenRequestServiceAccountUIDValidation", Stage::Beta, true),
    ("UnauthenticatedHTTP2DOSMitigation", Stage::Beta, true),
    ("UnknownVersionInteroperabilityProxy", Stage::Beta, true),
    ("WatchList", Stage::Beta, true),
    ("WatchListCompression", Stage::Beta, true),
    ("WebhookRoundTripLoadBalancing", Stage::Beta, true),
];

/// The `--help` text of `--feature-gates`: upstream's, with every gate, its stage and default.
pub fn help() -> String {
    let mut text = String::from(
        "A set of key=value pairs that describe feature gates for alpha/experimental features (the gates of Go's cloud-controller-manager 1.37; none changes what this one does, so a gate set to other than its default is reported at start-up). Options are:",
    );
    for (name, stage, default) in FEATURE_GATES {
        let stage = match stage {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
        };
        text.push_str(&format!("\n{name}=true|false ({stage} - default={default})"));
    }
    text
}

/// Parses `--feature-gates` entries (`Name=bool`, as split at commas) into the gates set,
/// with upstream's messages for an unknown gate or a value that is not a Go boolean. Every
/// problem is reported, not only the first.
pub fn parse(entries: &[String]) -> Result<BTreeMap<String, bool>, Vec<String>> {
    let mut set = BTreeMap::new();
    let mut errors = Vec::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let Some((name, value)) = entry.split_once('=') else {
            errors.push(format!("--feature-gates: missing bool value for {entry}"));
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        let Some(value) = crate::service::helpers::parse_go_bool(value) else {
            errors.push(format!(
                "--feature-gates: invalid value of {name}={value} (use true or false)"
            ));
            continue;
        };
        if !FEATURE_GATES.iter().any(|(known, _, _)| *known == name) {
            errors.push(format!("--feature-gates: unrecognized feature gate: {name}"));
            continue;
        }
        set.insert(name.to_string(), value);
    }
    if errors.is_empty() { Ok(set) } else { Err(errors) }
}

/// The gates of `set` that differ from their default (they have no effect here).
pub fn changed(set: &BTreeMap<String, bool>) -> Vec<String> {
    set.iter()
        .filter(|(name, value)| {
            FEATURE_GATES
                .iter()
                .any(|(known, _, default)| known == name && default != *value)
        })
        .map(|(name, value)| format!("{name}={value}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(text: &str) -> Vec<String> {
        text.split(',').map(str::to_string).collect()
    }

    #[test]
    fn known_gates_parse_and_only_changed_ones_are_reported() {
        let set = parse(&entries(
            "ContextualLogging=true, CloudControllerManagerWebhook=true,AllAlpha=f",
        ))
        .unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(
            changed(&set),
            vec!["CloudControllerManagerWebhook=true".to_string()]
        );
        assert!(parse(&entries("")).unwrap().is_empty());
    }

    #[test]
    fn unknown_gates_and_bad_values_are_errors_naming_them() {
        let errors = parse(&entries("NoSuchGate=true,WatchList=maybe,ContextualLogging")).unwrap_err();
        assert_eq!(
            errors,
            vec![
                "--feature-gates: unrecognized feature gate: NoSuchGate".to_string(),
                "--feature-gates: invalid value of WatchList=maybe (use true or false)".to_string(),
                "--feature-gates: missing bool value for ContextualLogging".to_string(),
            ]
        );
    }

    #[test]
    fn the_help_lists_every_gate_with_its_default() {
        let help = help();
        assert_eq!(help.lines().count(), FEATURE_GATES.len() + 1);
        assert!(help.contains("\nCloudControllerManagerWebhook=true|false (ALPHA - default=false)"));
        assert!(help.contains("\nWatchList=true|false (BETA - default=true)"));
    }
}
