//! Human-readable durations for flags: `500ms`, `30s`, `2m`, `1h`, `1m30s`.

use std::time::Duration;

/// Parses one or more `<integer><unit>` parts, unit one of `ms`, `s`, `m`, `h`, summed:
/// `500ms`, `30s`, `2m`, `1h30m`. `0` alone is accepted as zero.
///
/// # Errors
/// A one-line message for clap when a number or unit is missing, unknown or too large.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration; use for example 500ms, 30s, 2m or 1h".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "invalid duration {text:?}: expected a number, as in 500ms, 30s, 2m or 1h"
            ));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Some(Duration::from_millis(value)),
            "s" => Some(Duration::from_secs(value)),
            "m" => value.checked_mul(60).map(Duration::from_secs),
            "h" => value.checked_mul(3600).map(Duration::from_secs),
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit (ms, s, m or h), as in 30s"
                ))
            }
            other => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {other:?}; use ms, s, m or h"
                ))
            }
        };
        total = part
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| format!("invalid duration {text:?}: too large"))?;
    }
    Ok(total)
}

/// Formats a duration for humans, the way [`parse`] reads it where exact (`1.234s`
/// otherwise).
pub fn format(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.3}s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_bad_input_with_a_message() {
        for bad in [
            "",
            "30",
            "s",
            "1.5s",
            "3d",
            "-1s",
            "99999999999999999999s",
            "1 s",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains("duration"), "{bad}: {err}");
            assert!(!err.contains('\n'));
        }
        assert!(parse(&format!("{}h", u64::MAX / 60)).is_err());
    }

    #[test]
    fn formats_short_and_long() {
        assert_eq!(format(Duration::from_millis(12)), "12ms");
        assert_eq!(format(Duration::from_millis(1234)), "1.234s");
    }
}
