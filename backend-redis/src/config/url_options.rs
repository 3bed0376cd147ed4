//! Lock options carried in a Redis URL's query string: `fifo=true|false`,
//! `min_replicas=N` and `replica_timeout=MS`.

use std::time::Duration;

use distlock_api::LockError;

use crate::REDIS_BACKEND;

/// The lock options a URL's query string gave (each `None` when not given).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct UrlOptions {
    /// `fifo=true|false`.
    pub(crate) fifo: Option<bool>,
    /// `min_replicas=N`.
    pub(crate) min_replicas: Option<u32>,
    /// `replica_timeout=MS` (also `…ms` or `…s`).
    pub(crate) replica_timeout: Option<Duration>,
}

/// The parameters [`take_options`] takes out; the rest go to the driver.
const NAMES: [&str; 3] = ["fifo", "min_replicas", "replica_timeout"];

/// Takes the lock options out of `url`'s query string and returns the URL without them
/// (the driver does not know them) and their values. Other parameters and a
/// `#fragment` are kept as they were.
///
/// # Errors
/// [`LockError::Config`] for a parameter given twice, a `fifo` other than `true` or
/// `false`, a `min_replicas` that is not a whole number, and a `replica_timeout` that
/// is not a whole number of milliseconds (or `…ms`, `…s`) above zero.
pub(crate) fn take_options(url: &str) -> Result<(String, UrlOptions), LockError> {
    let (before_fragment, fragment) = match url.split_once('#') {
        Some((before, after)) => (before, Some(after)),
        None => (url, None),
    };
    let Some((base, query)) = before_fragment.split_once('?') else {
        return Ok((url.to_owned(), UrlOptions::default()));
    };
    let mut options = UrlOptions::default();
    let mut seen = Vec::new();
    let mut kept = Vec::new();
    for pair in query.split('&') {
        // `name` alone or `name=…`; `fifo_x=…` is someone else's parameter.
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !NAMES.contains(&name) {
            kept.push(pair);
            continue;
        }
        if seen.contains(&name) {
            return Err(config_error(format!(
                "the URL parameter {name} is given twice"
            )));
        }
        seen.push(name);
        match name {
            "fifo" => options.fifo = Some(parse_fifo(value)?),
            "min_replicas" => options.min_replicas = Some(parse_count(value)?),
            _ => options.replica_timeout = Some(parse_timeout(value)?),
        }
    }
    let mut rebuilt = base.to_owned();
    let kept: Vec<&str> = kept.into_iter().filter(|p| !p.is_empty()).collect();
    if !kept.is_empty() {
        rebuilt.push('?');
        rebuilt.push_str(&kept.join("&"));
    }
    if let Some(fragment) = fragment {
        rebuilt.push('#');
        rebuilt.push_str(fragment);
    }
    Ok((rebuilt, options))
}

fn config_error(message: String) -> LockError {
    LockError::config(REDIS_BACKEND, message)
}

fn parse_fifo(value: &str) -> Result<bool, LockError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(config_error(format!(
            "the URL parameter fifo must be true or false, got {other:?}"
        ))),
    }
}

fn parse_count(value: &str) -> Result<u32, LockError> {
    // Digits only: `u32::from_str` would take a leading `+`.
    value
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| value.parse().ok())
        .flatten()
        .ok_or_else(|| {
            config_error(format!(
                "the URL parameter min_replicas must be a whole number of replicas, got {value:?}"
            ))
        })
}

fn parse_timeout(value: &str) -> Result<Duration, LockError> {
    let (digits, unit_ms) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, 1000)
    } else {
        (value, 1)
    };
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| digits.parse::<u64>().ok())
        .flatten()
        .and_then(|n| n.checked_mul(unit_ms))
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| {
            config_error(format!(
                "the URL parameter replica_timeout must be a whole number of milliseconds above zero (or with ms or s), got {value:?}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(url: &str) -> Result<(String, Option<bool>), LockError> {
        take_options(url).map(|(url, options)| (url, options.fifo))
    }

    #[test]
    fn fifo_is_taken_out() {
        assert_eq!(
            fifo("redis://h:1/2").unwrap(),
            ("redis://h:1/2".into(), None)
        );
        assert_eq!(
            fifo("redis://h:1?fifo=true").unwrap(),
            ("redis://h:1".into(), Some(true))
        );
        assert_eq!(
            fifo("rediss://h:1/0?a=1&fifo=false&b=2#insecure").unwrap(),
            ("rediss://h:1/0?a=1&b=2#insecure".into(), Some(false))
        );
        assert_eq!(
            fifo("redis://h?fifo_x=1").unwrap(),
            ("redis://h?fifo_x=1".into(), None)
        );
    }

    #[test]
    fn replica_options_are_taken_out() {
        let (url, options) =
            take_options("redis://h:1?min_replicas=2&x=1&replica_timeout=250").unwrap();
        assert_eq!(url, "redis://h:1?x=1");
        assert_eq!(options.min_replicas, Some(2));
        assert_eq!(options.replica_timeout, Some(Duration::from_millis(250)));
        for (text, ms) in [("1500ms", 1500), ("2s", 2000), ("1", 1)] {
            let (_, options) = take_options(&format!("redis://h?replica_timeout={text}")).unwrap();
            assert_eq!(options.replica_timeout, Some(Duration::from_millis(ms)));
        }
        let (_, options) = take_options("redis://h?min_replicas=0").unwrap();
        assert_eq!(options.min_replicas, Some(0));
    }

    #[test]
    fn bad_values_are_config_errors() {
        for url in [
            "redis://h?fifo",
            "redis://h?fifo=",
            "redis://h?fifo=yes",
            "redis://h?fifo=TRUE",
            "redis://h?fifo=1",
            "redis://h?fifo=true&fifo=true",
            "redis://h?min_replicas",
            "redis://h?min_replicas=-1",
            "redis://h?min_replicas=+1",
            "redis://h?min_replicas=one",
            "redis://h?min_replicas=99999999999",
            "redis://h?min_replicas=1&min_replicas=1",
            "redis://h?replica_timeout=0",
            "redis://h?replica_timeout=",
            "redis://h?replica_timeout=1.5s",
            "redis://h?replica_timeout=1m",
            "redis://h?replica_timeout=-5",
            "redis://h?replica_timeout=99999999999999999999s",
        ] {
            assert!(
                matches!(take_options(url), Err(LockError::Config { .. })),
                "{url}"
            );
        }
    }
}
