//! [`UrlHarness`]: a conformance harness for any backend URL `distlock::connect` takes.

use std::sync::Arc;

use distlock::{async_trait, LockError};
use distlock_conformance::{Client, Harness, UrlConnector};

/// Each client is a fresh [`distlock::connect`] of one URL: every primitive over one
/// connection, as an application's client has. It has no fault hooks, so the scenarios that need to crash a client are
/// skipped.
pub struct UrlHarness {
    url: String,
}

impl UrlHarness {
    /// A harness for `url`. Nothing is connected until a scenario asks for a client.
    pub fn new(url: impl Into<String>) -> Self {
        UrlHarness { url: url.into() }
    }
}

/// A connector that is [`distlock::connect`].
pub fn connector() -> UrlConnector {
    Arc::new(|url: String| Box::pin(async move { distlock::connect(&url).await }))
}

/// `url` with any password replaced by `***`, for reports.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
        None => url.to_owned(),
    }
}

#[async_trait]
impl Harness for UrlHarness {
    fn name(&self) -> String {
        redact(&self.url)
    }

    async fn client(&self) -> Result<Client, LockError> {
        Ok(Client::new(distlock::connect(&self.url).await?))
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        Some(connector())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/locks?sslmode=require"),
            "postgres://app:***@db:5432/locks?sslmode=require"
        );
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("redis://user@h"), "redis://user@h");
        assert_eq!(redact("memory://x"), "memory://x");
        assert_eq!(redact("no-scheme"), "no-scheme");
    }

    #[tokio::test]
    async fn clients_are_fresh_connects_sharing_the_url() {
        use std::time::Duration;

        use distlock::{LockKey, LockOptions, WaitPolicy};

        let harness = UrlHarness::new("memory://url-harness-test");
        let key = LockKey::new("url-harness/k").unwrap();
        let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait);
        let a = harness.client().await.unwrap();
        let b = harness.client().await.unwrap();
        assert!(a.faults.is_none());
        let _held = a.lock().acquire(&key, &options).await.unwrap();
        assert!(b
            .lock()
            .try_acquire(&key, &options)
            .await
            .unwrap()
            .is_none());
        let connect = harness.url_connector().unwrap();
        assert!(matches!(
            connect("bogus".to_owned()).await,
            Err(LockError::Config { .. })
        ));
        let c = connect("memory://url-harness-test".to_owned())
            .await
            .unwrap();
        assert!(c
            .lock()
            .try_acquire(&key, &options)
            .await
            .unwrap()
            .is_none());
    }
}
