//! Which subnet of the floating network a new floating IP comes from (OCCM's
//! `floatingSubnetSpec`): a subnet ID (`floating-subnet-id`), or subnets chosen by name
//! (`floating-subnet`) and by tags (`floating-subnet-tags`), tried in neutron's order until one
//! has a free address.
//!
//! A name pattern is a glob (`*` any characters but `/`, `**` any characters, `?` one character
//! but `/`, `{a,b}` either), or with a leading `~` a regular expression; either matches the
//! whole name; a leading `!` negates it. A tag expression is a comma-separated list of tags:
//! any of them present, with a leading `&` all of them, with a leading `!` none of them (`!&`:
//! not all of them).

use regex::Regex;

/// The floating subnet a Service's floating IP comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FloatingSubnetSpec {
    /// A subnet ID (wins over the rest).
    pub id: String,
    /// A name pattern.
    pub pattern: String,
    /// A tag expression.
    pub tags: String,
}

impl FloatingSubnetSpec {
    /// Whether anything is set.
    pub fn is_set(&self) -> bool {
        !self.id.is_empty() || !self.pattern.is_empty() || !self.tags.is_empty()
    }

    /// The matcher of a spec without a subnet ID (`None`: an ID, or nothing, is set); a bad
    /// pattern is an error naming it.
    pub fn matcher(&self) -> Result<Option<SubnetMatcher>, String> {
        if !self.id.is_empty() || (self.pattern.is_empty() && self.tags.is_empty()) {
            return Ok(None);
        }
        Ok(Some(SubnetMatcher {
            name: if self.pattern.is_empty() {
                None
            } else {
                Some(name_matcher(&self.pattern)?)
            },
            tags: (!self.tags.is_empty()).then(|| TagExpression::parse(&self.tags)),
        }))
    }
}

impl std::fmt::Display for FloatingSubnetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (what, v) in [("id", &self.id), ("name", &self.pattern), ("tags", &self.tags)] {
            if !v.is_empty() {
                parts.push(format!("{what} {v:?}"));
            }
        }
        if parts.is_empty() {
            f.write_str("any subnet")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// Chooses subnets by name and tags.
#[derive(Debug, Clone)]
pub struct SubnetMatcher {
    name: Option<(Regex, bool)>,
    tags: Option<TagExpression>,
}

impl SubnetMatcher {
    /// Whether a subnet of this name and tags is chosen.
    pub fn matches(&self, name: &str, tags: &[String]) -> bool {
        let by_name = self
            .name
            .as_ref()
            .is_none_or(|(re, negated)| re.is_match(name) != *negated);
        by_name && self.tags.as_ref().is_none_or(|t| t.matches(tags))
    }

    /// The neutron list filter of a positive tag expression (`&tags=…` for all, `&tags-any=…`
    /// for any), else empty: the subnets are checked here in any case, and a negated expression
    /// only here (OCCM's documentation says what it means; the neutron filters it maps it to
    /// do not mean that).
    pub fn neutron_query(&self) -> String {
        let Some(t) = self.tags.as_ref().filter(|t| !t.not) else {
            return String::new();
        };
        let key = if t.all { "tags" } else { "tags-any" };
        format!("&{key}={}", crate::client::query_escape(&t.list.join(",")))
    }
}

/// `a,b` (any), `&a,b` (all), `!a,b` (none), `!&a,b` (not all).
#[derive(Debug, Clone)]
struct TagExpression {
    list: Vec<String>,
    not: bool,
    all: bool,
}

impl TagExpression {
    fn parse(text: &str) -> Self {
        let mut rest = text.trim();
        let not = rest.starts_with('!');
        if not {
            rest = &rest[1..];
        }
        let all = rest.starts_with('&');
        if all {
            rest = &rest[1..];
        }
        Self {
            list: rest
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
            not,
            all,
        }
    }

    fn matches(&self, tags: &[String]) -> bool {
        let has = |t: &String| tags.contains(t);
        let hit = if self.all {
            self.list.iter().all(has)
        } else {
            self.list.iter().any(has)
        };
        hit != self.not
    }
}

/// A name pattern as a whole-name regular expression and whether it is negated.
fn name_matcher(pattern: &str) -> Result<(Regex, bool), String> {
    let (negated, p) = match pattern.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    let source = match p.strip_prefix('~') {
        Some(re) => re.to_string(),
        None => glob_to_regex(p),
    };
    let re = Regex::new(&format!("^(?:{source})$"))
        .map_err(|e| format!("{pattern:?} is not a valid subnet name pattern: {e}"))?;
    Ok((re, negated))
}

/// A glob as a regular expression (without anchors).
fn glob_to_regex(glob: &str) -> String {
    let mut out = String::new();
    let mut chars = glob.chars().peekable();
    let mut braces = 0;
    while let Some(c) = chars.next() {
        match c {
            '*' if chars.peek() == Some(&'*') => {
                chars.next();
                out.push_str(".*");
            }
            '*' => out.push_str("[^/]*"),
            '?' => out.push_str("[^/]"),
            '{' => {
                braces += 1;
                out.push_str("(?:");
            }
            '}' if braces > 0 => {
                braces -= 1;
                out.push(')');
            }
            ',' if braces > 0 => out.push('|'),
            c => out.push_str(&regex::escape(&c.to_string())),
        }
    }
    for _ in 0..braces {
        out.push(')');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pattern: &str, tags: &str) -> SubnetMatcher {
        FloatingSubnetSpec {
            id: String::new(),
            pattern: pattern.into(),
            tags: tags.into(),
        }
        .matcher()
        .unwrap()
        .unwrap()
    }

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_by_glob_or_regex_whole_and_negated() {
        assert!(spec("public-*", "").matches("public-a", &[]));
        assert!(!spec("public-*", "").matches("xpublic-a", &[]), "the whole name");
        assert!(!spec("public-*", "").matches("public-a/b", &[]), "* stops at /");
        assert!(spec("public-**", "").matches("public-a/b", &[]));
        assert!(spec("pub?ic", "").matches("public", &[]));
        assert!(spec("{ext,pub}-net", "").matches("pub-net", &[]));
        assert!(!spec("{ext,pub}-net", "").matches("priv-net", &[]));
        assert!(
            spec("a.b", "").matches("a.b", &[]) && !spec("a.b", "").matches("axb", &[]),
            "glob dots are literal"
        );
        assert!(spec("~pub.*-[0-9]+", "").matches("public-42", &[]));
        assert!(
            !spec("~pub", "").matches("public", &[]),
            "a regular expression matches the whole name"
        );
        assert!(spec("!public-*", "").matches("private", &[]));
        assert!(!spec("!public-*", "").matches("public-a", &[]));
        let e = FloatingSubnetSpec {
            pattern: "~(".into(),
            ..Default::default()
        }
        .matcher()
        .unwrap_err();
        assert!(e.contains("\"~(\""), "{e}");
    }

    #[test]
    fn tag_expressions_and_their_neutron_filters() {
        let any = spec("", "a,b");
        assert!(any.matches("x", &tags(&["b"])));
        assert!(!any.matches("x", &tags(&["c"])));
        assert_eq!(any.neutron_query(), "&tags-any=a%2Cb");
        let all = spec("", "&a,b");
        assert!(all.matches("x", &tags(&["a", "b", "c"])));
        assert!(!all.matches("x", &tags(&["a"])));
        assert_eq!(all.neutron_query(), "&tags=a%2Cb");
        let none = spec("", "!a,b");
        assert!(none.matches("x", &tags(&["c"])));
        assert!(!none.matches("x", &tags(&["a"])));
        assert_eq!(none.neutron_query(), "", "negated: checked here only");
        let not_all = spec("", "!&a,b");
        assert!(not_all.matches("x", &tags(&["a"])));
        assert!(!not_all.matches("x", &tags(&["a", "b"])));
        assert_eq!(not_all.neutron_query(), "");
        assert!(spec("pub*", "a").matches("pub1", &tags(&["a"])), "name and tags");
        assert!(!spec("pub*", "a").matches("pub1", &tags(&["b"])));
        assert!(
            FloatingSubnetSpec {
                id: "s1".into(),
                pattern: "p*".into(),
                tags: String::new()
            }
            .matcher()
            .unwrap()
            .is_none(),
            "an ID wins"
        );
    }
}
