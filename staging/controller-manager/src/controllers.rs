//! Controller names and the `--controllers` selection rules (upstream `names/`,
//! `IsControllerEnabled`, and the alias resolution of the newest CCM).
//!
//! A list entry is `*` (every controller enabled by default), `name` (enable) or `-name`
//! (disable); the first entry naming a controller wins. Aliases (the 1.20 names) are resolved
//! to canonical names, keeping a leading `-`.

use std::collections::{BTreeMap, BTreeSet};

/// The controllers a binary knows: canonical names, aliases, and those off by default.
#[derive(Debug, Clone, Default)]
pub struct ControllerRegistry {
    known: BTreeSet<String>,
    aliases: BTreeMap<String, String>,
    disabled_by_default: BTreeSet<String>,
}

impl ControllerRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a controller with its aliases.
    pub fn register(&mut self, canonical: &str, aliases: &[&str], enabled_by_default: bool) -> &mut Self {
        self.known.insert(canonical.to_string());
        for a in aliases {
            self.aliases.insert(a.to_string(), canonical.to_string());
        }
        if !enabled_by_default {
            self.disabled_by_default.insert(canonical.to_string());
        }
        self
    }

    /// Canonical names.
    pub fn known(&self) -> impl Iterator<Item = &str> {
        self.known.iter().map(String::as_str)
    }

    /// The canonical name of `name` (itself or an alias), if known.
    pub fn canonical(&self, name: &str) -> Option<&str> {
        if let Some(k) = self.known.get(name) {
            return Some(k.as_str());
        }
        self.aliases.get(name).map(String::as_str)
    }

    /// Resolves aliases in a `--controllers` list and rejects unknown names with upstream's
    /// message (`"<name>" is not in the list of known controllers`).
    pub fn resolve(&self, list: &[String]) -> Result<Vec<String>, Vec<String>> {
        let mut errors = Vec::new();
        let mut out = Vec::new();
        for entry in list {
            let entry = entry.trim();
            if entry == "*" {
                out.push("*".to_string());
                continue;
            }
            let (negated, name) = match entry.strip_prefix('-') {
                Some(n) => (true, n),
                None => (false, entry),
            };
            match self.canonical(name) {
                Some(c) => out.push(if negated { format!("-{c}") } else { c.to_string() }),
                None => errors.push(format!("{name:?} is not in the list of known controllers")),
            }
        }
        if errors.is_empty() { Ok(out) } else { Err(errors) }
    }

    /// Whether `canonical` is enabled by a resolved list.
    pub fn is_enabled(&self, canonical: &str, resolved: &[String]) -> bool {
        let mut has_star = false;
        for entry in resolved {
            if entry == canonical {
                return true;
            }
            if entry.strip_prefix('-') == Some(canonical) {
                return false;
            }
            if entry == "*" {
                has_star = true;
            }
        }
        has_star && !self.disabled_by_default.contains(canonical)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> ControllerRegistry {
        let mut r = ControllerRegistry::new();
        r.register("cloud-node-controller", &["cloud-node"], true)
            .register("service-lb-controller", &["service", "service-controller"], true)
            .register("node-route-controller", &["route", "route-controller"], true)
            .register("tagging", &[], false);
        r
    }

    fn list(s: &str) -> Vec<String> {
        s.split(',').map(str::to_string).collect()
    }

    #[test]
    fn star_and_negation_with_aliases() {
        let r = registry();
        let l = r.resolve(&list("*,-service")).unwrap();
        assert_eq!(l, vec!["*", "-service-lb-controller"]);
        assert!(r.is_enabled("cloud-node-controller", &l));
        assert!(!r.is_enabled("service-lb-controller", &l));
        assert!(!r.is_enabled("tagging", &l), "disabled by default");
        let l = r.resolve(&list("*,tagging")).unwrap();
        assert!(r.is_enabled("tagging", &l));
    }

    #[test]
    fn first_match_wins() {
        let r = registry();
        let l = r.resolve(&list("route,-node-route-controller")).unwrap();
        assert!(r.is_enabled("node-route-controller", &l));
        let l = r.resolve(&list("-route,*")).unwrap();
        assert!(!r.is_enabled("node-route-controller", &l));
        assert!(
            !r.is_enabled("cloud-node-controller", &r.resolve(&list("service")).unwrap()),
            "no * ⇒ only named ones"
        );
    }

    #[test]
    fn unknown_names_are_errors() {
        let e = registry().resolve(&list("*,-bogus,nope")).unwrap_err();
        assert_eq!(
            e,
            vec![
                "\"bogus\" is not in the list of known controllers",
                "\"nope\" is not in the list of known controllers"
            ]
        );
    }
}
