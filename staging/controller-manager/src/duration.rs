//! Go `time.Duration` strings (`10s`, `5m0s`, `1h30m`, `1.5s`, `250ms`), as every Kubernetes
//! duration flag takes them.

use std::time::Duration;

/// Parses a Go duration string. Negative durations are rejected.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let input = s.trim();
    if input == "0" {
        return Ok(Duration::ZERO);
    }
    if input.is_empty() {
        return Err(format!("invalid duration {s:?}: empty"));
    }
    if input.starts_with('-') {
        return Err(format!("invalid duration {s:?}: must not be negative"));
    }
    let rest = input.strip_prefix('+').unwrap_or(input);
    let mut total = 0f64;
    let mut chars = rest.char_indices().peekable();
    let bytes = rest.as_bytes();
    let mut any = false;
    while let Some(&(start, _)) = chars.peek() {
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_digit() || bytes[end] == b'.') {
            end += 1;
        }
        if end == start {
            return Err(format!(
                "invalid duration {s:?}: expected a number at {:?}",
                &rest[start..]
            ));
        }
        let number: f64 = rest[start..end]
            .parse()
            .map_err(|_| format!("invalid duration {s:?}: bad number {:?}", &rest[start..end]))?;
        let mut unit_end = end;
        while unit_end < bytes.len() && !(bytes[unit_end].is_ascii_digit() || bytes[unit_end] == b'.') {
            unit_end += 1;
        }
        let unit = &rest[end..unit_end];
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => {
                return Err(format!(
                    "invalid duration {s:?}: missing unit (use ns, us, ms, s, m or h)"
                ));
            }
            other => return Err(format!("invalid duration {s:?}: unknown unit {other:?}")),
        };
        total += number * scale;
        any = true;
        while chars.peek().is_some_and(|&(i, _)| i < unit_end) {
            chars.next();
        }
    }
    if !any {
        return Err(format!("invalid duration {s:?}"));
    }
    // Go's durations are int64 nanoseconds (about 292 years); Go rejects longer ones too.
    // (Found by the `provider_ids` fuzz target: `Duration::from_secs_f64` panicked on them.)
    const GO_MAX_SECONDS: f64 = i64::MAX as f64 / 1e9;
    if !total.is_finite() || total > GO_MAX_SECONDS {
        return Err(format!(
            "invalid duration {s:?}: out of range (at most 2562047h47m16.854775807s)"
        ));
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Formats like Go's `Duration.String()` for whole seconds (`5m0s`, `10s`, `1h0m0s`), or with
/// milliseconds when needed (`1.5s`, `200ms`).
pub fn format_go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs();
    let frac = d.subsec_millis();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let s = if frac > 0 {
        format!("{s}.{frac:03}").trim_end_matches('0').to_string()
    } else {
        s.to_string()
    };
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_go_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_go_duration("5m0s").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_go_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_go_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_go_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_go_duration("12h0m0s").unwrap(), Duration::from_secs(43200));
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_go_duration("10").unwrap_err().contains("missing unit"));
        assert!(parse_go_duration("-1s").unwrap_err().contains("negative"));
        assert!(parse_go_duration("5x").unwrap_err().contains("unknown unit"));
        assert!(parse_go_duration("").is_err());
        // Longer than Go's int64 nanoseconds: an error, never a panic (a fuzzer's find).
        let huge = format!("{}1h23.5s", "3".repeat(41));
        assert!(parse_go_duration(&huge).unwrap_err().contains("out of range"));
        assert!(
            parse_go_duration("2562048h")
                .unwrap_err()
                .contains("out of range")
        );
        assert_eq!(
            parse_go_duration("2562047h").unwrap(),
            Duration::from_secs(2562047 * 3600)
        );
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_go_duration(Duration::from_secs(15)), "15s");
        assert_eq!(format_go_duration(Duration::from_secs(43200)), "12h0m0s");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
    }
}
