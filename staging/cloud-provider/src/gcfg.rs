//! A reader for the INI dialect of Go's `gcfg` library, which upstream cloud configs use:
//! `[Section]` and `[Section "subsection"]` headers, `key = value` lines, `;`/`#` comments
//! (also after values), double-quoted values with `\"`, `\\`, `\n`, `\t` escapes, a value
//! continued on the next line by an unquoted `\` at the end of the line, a key without `=`
//! (a "blank" value: `true` for booleans, a reset for lists, an error for other types), repeated
//! keys for lists, and case-insensitive section and key names (subsection names are
//! case-sensitive).
//!
//! This reader only checks syntax, which gcfg treats as fatal. What gcfg reports as "extra
//! data" (unknown sections and keys) is for the caller to decide: upstream providers read their
//! files with `gcfg.FatalOnly`, so those are warnings, never errors. Differences that only make
//! the reader more tolerant: a leading UTF-8 byte-order mark is skipped (gcfg's `ReadInto`
//! refuses it), a key may start with a digit, and an unquoted `\"` is read as a quote.

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key as written.
    pub key: String,
    /// The unquoted value (`None` for a bare key).
    pub value: Option<String>,
    /// 1-based line number.
    pub line: usize,
}

/// One section (`[name]` or `[name "sub"]`) with its entries in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The section name as written.
    pub name: String,
    /// The subsection name, if any.
    pub subsection: Option<String>,
    /// 1-based line number of the header.
    pub line: usize,
    /// Entries in order.
    pub entries: Vec<Entry>,
}

impl Section {
    /// Whether this section is `name` (case-insensitive).
    pub fn is(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }

    /// `[Name]` or `[Name "sub"]`, for messages.
    pub fn display_name(&self) -> String {
        match &self.subsection {
            Some(s) => format!("[{} {s:?}]", self.name),
            None => format!("[{}]", self.name),
        }
    }
}

/// A syntax error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct SyntaxError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

fn unquote(raw: &str, line: usize) -> Result<String, SyntaxError> {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    let mut in_quotes = false;
    let mut pending_space = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push_str(&pending_space);
                pending_space.clear();
                in_quotes = !in_quotes;
            }
            '\\' => {
                out.push_str(&pending_space);
                pending_space.clear();
                match chars.next() {
                    Some('"') => out.push('"'),
                    Some('\\') => out.push('\\'),
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(other) => {
                        return Err(SyntaxError {
                            line,
                            message: format!("invalid escape sequence \\{other}"),
                        });
                    }
                    None => {
                        return Err(SyntaxError {
                            line,
                            message: "value ends with a backslash".into(),
                        });
                    }
                }
            }
            ';' | '#' if !in_quotes => break,
            c if c.is_whitespace() && !in_quotes => pending_space.push(c),
            c => {
                if !out.is_empty() {
                    out.push_str(&pending_space);
                }
                pending_space.clear();
                out.push(c);
            }
        }
    }
    if in_quotes {
        return Err(SyntaxError {
            line,
            message: "unterminated quoted value".into(),
        });
    }
    Ok(out)
}

/// Parses a whole file.
pub fn parse(text: &str) -> Result<Vec<Section>, SyntaxError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut sections: Vec<Section> = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, first)) = lines.next() {
        let line = i + 1;
        // A value continued by an unquoted backslash at the end of the line (gcfg joins the
        // lines and drops the backslash and the line break).
        let mut logical = first.to_string();
        while ends_with_continuation(&logical) {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next),
                None => break,
            }
        }
        let raw = logical.as_str();
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
            continue;
        }
        if let Some(header) = trimmed.strip_prefix('[') {
            let Some(end) = header.rfind(']') else {
                return Err(SyntaxError {
                    line,
                    message: format!("section header {trimmed:?} has no closing ]"),
                });
            };
            let rest = header[end + 1..].trim();
            if !rest.is_empty() && !rest.starts_with(';') && !rest.starts_with('#') {
                return Err(SyntaxError {
                    line,
                    message: format!("unexpected text {rest:?} after the section header"),
                });
            }
            let inner = header[..end].trim();
            let (name, subsection) = match inner.split_once(char::is_whitespace) {
                Some((name, sub)) => {
                    let sub = sub.trim();
                    if !(sub.len() >= 2 && sub.starts_with('"') && sub.ends_with('"')) {
                        return Err(SyntaxError {
                            line,
                            message: format!("subsection name in {trimmed:?} must be double-quoted"),
                        });
                    }
                    let sub = unquote(sub, line)?;
                    if sub.is_empty() {
                        return Err(SyntaxError {
                            line,
                            message: format!("empty subsection name in {trimmed:?}"),
                        });
                    }
                    (name.to_string(), Some(sub))
                }
                None => (inner.to_string(), None),
            };
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                return Err(SyntaxError {
                    line,
                    message: format!("invalid section name {name:?}"),
                });
            }
            sections.push(Section {
                name,
                subsection,
                line,
                entries: Vec::new(),
            });
            continue;
        }
        let Some(section) = sections.last_mut() else {
            return Err(SyntaxError {
                line,
                message: format!("{trimmed:?} appears before any [section]"),
            });
        };
        let (key, value) = match trimmed.split_once('=') {
            Some((k, v)) => (k.trim(), Some(unquote(v.trim(), line)?)),
            None => (trimmed.split([';', '#']).next().unwrap_or_default().trim(), None),
        };
        if key.is_empty() || !key.chars().all(|c| c.is_alphanumeric() || c == '-') {
            return Err(SyntaxError {
                line,
                message: format!("invalid key {key:?}"),
            });
        }
        section.entries.push(Entry {
            key: key.to_string(),
            value,
            line,
        });
    }
    Ok(sections)
}

/// Whether `line` ends with a backslash that is outside quotes, outside a comment and not part
/// of an escape sequence: gcfg's line continuation.
fn ends_with_continuation(line: &str) -> bool {
    if !line.ends_with('\\') {
        return false;
    }
    let mut in_quotes = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => in_quotes = !in_quotes,
            ';' | '#' if !in_quotes => return false,
            '\\' => {
                if chars.peek().is_none() {
                    return !in_quotes;
                }
                chars.next();
            }
            _ => {}
        }
    }
    false
}

/// gcfg's integers for `int`-typed keys: decimal or `0x` hexadecimal, with an optional sign.
pub fn parse_int(value: &str) -> Option<i64> {
    let v = value.trim();
    let (negative, digits) = match v.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, v.strip_prefix('+').unwrap_or(v)),
    };
    let magnitude = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16).ok()?,
        None if digits.chars().all(|c| c.is_ascii_digit()) => digits.parse().ok()?,
        None => return None,
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// gcfg's booleans: `true/yes/on/1` and `false/no/off/0` (case-insensitive); a bare key is true.
pub fn parse_bool(value: Option<&str>) -> Option<bool> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Some(true),
        Some(v) => match v.as_str() {
            "true" | "yes" | "on" | "1" => Some(true),
            "false" | "no" | "off" | "0" => Some(false),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_subsections_comments_quotes_and_bare_keys() {
        let text = r#"
; comment
[Global]
Zone = us-east-1a ; trailing comment
KubernetesClusterID="my \"cluster\"" # hash comment
DisableSecurityGroupIngress
NodeIPFamilies = ipv4
NodeIPFamilies = ipv6

[ServiceOverride "ec2"]
Service = Elastic Load Balancing
"#;
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 2);
        assert!(s[0].is("global"));
        assert_eq!(s[0].entries[0].value.as_deref(), Some("us-east-1a"));
        assert_eq!(s[0].entries[1].value.as_deref(), Some("my \"cluster\""));
        assert_eq!(s[0].entries[2].value, None);
        assert_eq!(s[0].entries[4].line, 8);
        assert_eq!(s[1].subsection.as_deref(), Some("ec2"));
        assert_eq!(
            s[1].entries[0].value.as_deref(),
            Some("Elastic Load Balancing"),
            "inner spaces are kept"
        );
        assert_eq!(s[1].display_name(), "[ServiceOverride \"ec2\"]");
    }

    #[test]
    fn syntax_errors_name_the_line() {
        assert_eq!(
            parse("Zone = x").unwrap_err().to_string(),
            "line 1: \"Zone = x\" appears before any [section]"
        );
        assert_eq!(parse("[Global\nA=1").unwrap_err().line, 1);
        assert!(
            parse("[Global]\nA = \"open")
                .unwrap_err()
                .to_string()
                .contains("line 2: unterminated")
        );
        assert!(
            parse("[ServiceOverride ec2]")
                .unwrap_err()
                .message
                .contains("double-quoted")
        );
        assert!(
            parse("[Global]\nbad key = 1")
                .unwrap_err()
                .message
                .contains("invalid key")
        );
        assert!(
            parse("[Global]\nA = \\q")
                .unwrap_err()
                .message
                .contains("invalid escape")
        );
    }

    #[test]
    fn continuation_lines_bom_and_unicode_keys() {
        let s =
            parse("\u{feff}[Global]\nZone = us-east-\\\n1a\nName = \"a\\\\\" ; not continued \\\nKlé = 1\n")
                .unwrap();
        assert_eq!(s[0].entries[0].value.as_deref(), Some("us-east-1a"));
        assert_eq!(s[0].entries[0].line, 2);
        assert_eq!(s[0].entries[1].value.as_deref(), Some("a\\"));
        assert_eq!(s[0].entries[2].key, "Klé");
        assert_eq!(s[0].entries[2].line, 5);
        assert!(!ends_with_continuation("a = \"x\\\\\""));
        assert!(!ends_with_continuation("a = x ; c \\"));
        assert!(ends_with_continuation("a = x\\"));
        assert!(
            parse("[ServiceOverride \"\"]")
                .unwrap_err()
                .message
                .contains("empty subsection name")
        );
    }

    #[test]
    fn integers() {
        assert_eq!(parse_int("10256"), Some(10256));
        assert_eq!(parse_int(" 0x2810 "), Some(0x2810));
        assert_eq!(parse_int("+5"), Some(5));
        assert_eq!(parse_int("-1"), Some(-1));
        assert_eq!(parse_int("1e3"), None);
        assert_eq!(parse_int("0xZZ"), None);
        assert_eq!(parse_int(""), None);
    }

    #[test]
    fn booleans() {
        assert_eq!(parse_bool(None), Some(true));
        assert_eq!(parse_bool(Some("Yes")), Some(true));
        assert_eq!(parse_bool(Some("0")), Some(false));
        assert_eq!(parse_bool(Some("maybe")), None);
    }
}
