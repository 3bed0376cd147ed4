//! Lock options carried in a Redis URL's query string: `?fifo=true|false`.

use distlock_api::LockError;

use crate::REDIS_BACKEND;

/// Takes the `fifo` parameter out of `url`'s query string and returns the URL without
/// it (the driver does not know it) and its value, if given. Other parameters and a
/// `#fragment` are kept as they were.
///
/// # Errors
/// [`LockError::Config`] for a value other than `true` or `false`, or `fifo` given twice.
pub(crate) fn take_fifo(url: &str) -> Result<(String, Option<bool>), LockError> {
    let (before_fragment, fragment) = match url.split_once('#') {
        Some((before, after)) => (before, Some(after)),
        None => (url, None),
    };
    let Some((base, query)) = before_fragment.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut fifo = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let Some(value) = pair.strip_prefix("fifo").and_then(|rest| {
            // `fifo` alone or `fifo=…`; `fifo_x=…` is someone else's parameter.
            if rest.is_empty() {
                Some("")
            } else {
                rest.strip_prefix('=')
            }
        }) else {
            kept.push(pair);
            continue;
        };
        let parsed = match value {
            "true" => true,
            "false" => false,
            other => {
                return Err(LockError::config(
                    REDIS_BACKEND,
                    format!("the URL parameter fifo must be true or false, got {other:?}"),
                ))
            }
        };
        if fifo.replace(parsed).is_some() {
            return Err(LockError::config(
                REDIS_BACKEND,
                "the URL parameter fifo is given twice",
            ));
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
    Ok((rebuilt, fifo))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_is_taken_out() {
        assert_eq!(
            take_fifo("redis://h:1/2").unwrap(),
            ("redis://h:1/2".into(), None)
        );
        assert_eq!(
            take_fifo("redis://h:1?fifo=true").unwrap(),
            ("redis://h:1".into(), Some(true))
        );
        assert_eq!(
            take_fifo("rediss://h:1/0?a=1&fifo=false&b=2#insecure").unwrap(),
            ("rediss://h:1/0?a=1&b=2#insecure".into(), Some(false))
        );
        assert_eq!(
            take_fifo("redis://h?fifo_x=1").unwrap(),
            ("redis://h?fifo_x=1".into(), None)
        );
    }

    #[test]
    fn bad_fifo_values_are_config_errors() {
        for url in [
            "redis://h?fifo",
            "redis://h?fifo=",
            "redis://h?fifo=yes",
            "redis://h?fifo=TRUE",
            "redis://h?fifo=1",
            "redis://h?fifo=true&fifo=true",
        ] {
            assert!(
                matches!(take_fifo(url), Err(LockError::Config { .. })),
                "{url}"
            );
        }
    }
}
