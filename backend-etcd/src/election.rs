//! Leader election ([`EtcdLock::election`]) in the key layout of etcd's own
//! `concurrency.Election` (behind `etcdctl elect`): reading the leader and waiting for
//! it to change.
//!
//! It is the mutex's recipe in the election's range, with the candidate's identity as
//! the contender key's value: the same leases, queue, loss watch, release, extend and
//! clean-up ([`EtcdLock::contend`] and its kin).

use std::time::Duration;

use distlock_api::{Candidate, FencingToken, Leader, LockError, LockKey};
use etcd_client::{EventType, WatchOptions, WatchStream};
use tokio::time::{timeout_at, Instant};

use crate::error::{sent, within, Fail};
use crate::keys::prefix_end;
use crate::{EtcdLock, ETCD_BACKEND};

/// How long a broken watch of an election waits before it is made again.
const REWATCH_PAUSE: Duration = Duration::from_millis(20);

impl EtcdLock {
    /// The leader of the election `name`: the oldest key of its range, with its value
    /// (the identity), create revision (the term) and lease's remaining TTL, as
    /// `concurrency.Election.Leader` reads it.
    pub(crate) async fn read_leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        self.look(&self.election_prefix(name)).await
    }

    /// The oldest key of the election's `range`, as a leader.
    async fn look(&self, range: &str) -> Result<Option<Leader>, LockError> {
        let oldest = self
            .requests()
            .oldest(range)
            .await
            .map_err(|f| self.connection_error(f))?;
        oldest
            .map(|(kv, _, remaining)| {
                leader_of(kv.key(), kv.value(), kv.create_revision(), remaining)
            })
            .transpose()
    }

    /// A watch of every change in `range` from now, once etcd has created it.
    async fn watch(&self, range: &str) -> Result<WatchStream, Fail> {
        let requests = self.requests();
        let options = WatchOptions::new().with_range(prefix_end(range));
        let mut stream = sent(requests.timeout, || {
            let (mut watch, options) = (requests.client.watch_client(), options.clone());
            async move { watch.watch(range, Some(options)).await }
        })
        .await?;
        loop {
            match within(requests.timeout, stream.message()).await? {
                Some(response) if response.created() => return Ok(stream),
                Some(response) if !response.canceled() => continue,
                _ => {
                    return Err(Fail::Etcd(etcd_client::Error::WatchError(
                        "etcd refused the watch of the election".into(),
                    )))
                }
            }
        }
    }
}

/// The leader that `key` (the oldest of its range) with `value`, created at `revision`,
/// stands for, its lease having `remaining` seconds left (when known).
fn leader_of(
    key: &[u8],
    value: &[u8],
    revision: i64,
    remaining: Option<i64>,
) -> Result<Leader, LockError> {
    let term = u64::try_from(revision).map_err(|_| {
        LockError::backend_error(
            ETCD_BACKEND,
            format!("etcd gave a negative create revision {revision}"),
        )
    })?;
    // A foreign candidate without a usable value (a Go `Campaign(ctx, "")`) is known
    // by its key, which etcd never leaves empty.
    let candidate = Candidate::new(value)
        .or_else(|_| Candidate::new(key))
        .map_err(|e| {
            LockError::backend_error(
                ETCD_BACKEND,
                format!("the leader's key names no usable identity: {e}"),
            )
        })?;
    let remaining = remaining
        .and_then(|secs| u64::try_from(secs).ok())
        .map(Duration::from_secs);
    Ok(Leader::new(candidate, FencingToken::new(term)).with_remaining(remaining))
}

impl EtcdLock {
    /// Waits until the leadership of `name` differs from `seen`, or `patience` has
    /// passed, on an etcd watch of the election's range instead of polling: it is made
    /// before the look, so no change between the two is missed. Only a deletion can end
    /// a leadership (and only a put start one while nobody leads): other events do not
    /// make it look again.
    pub(crate) async fn wait_leader_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        let deadline = Instant::now() + patience;
        let range = self.election_prefix(name);
        loop {
            let mut stream = self
                .watch(&range)
                .await
                .map_err(|f| self.connection_error(f))?;
            let mut now = self.look(&range).await?;
            loop {
                if now.as_ref().map(|l| l.term) != seen || Instant::now() >= deadline {
                    return Ok(now);
                }
                let message = match timeout_at(deadline, stream.message()).await {
                    Err(_) => return self.look(&range).await,
                    Ok(message) => message,
                };
                match message {
                    Ok(Some(response)) if !response.canceled() => {
                        let events = response.events();
                        if events.iter().any(|e| {
                            e.event_type() == EventType::Delete
                                || (seen.is_none() && e.event_type() == EventType::Put)
                        }) {
                            now = self.look(&range).await?;
                        }
                    }
                    // The watch broke (a member went away): make another.
                    _ => {
                        tokio::time::sleep(REWATCH_PAUSE).await;
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_without_a_usable_value_is_known_by_its_key() {
        let key = b"distlock/+election/jobs/694d7a1b";
        let read = leader_of(key, b"host-a", 7, Some(5)).expect("a leader");
        assert_eq!(read.candidate.as_bytes(), b"host-a");
        assert_eq!(read.term, FencingToken::new(7));
        assert_eq!(read.remaining, Some(Duration::from_secs(5)));
        let long = vec![b'x'; distlock_api::MAX_CANDIDATE_LEN + 1];
        for foreign in [&b""[..], &long] {
            let read = leader_of(key, foreign, 7, Some(-1)).expect("a leader");
            assert_eq!(read.candidate.as_bytes(), key);
            assert_eq!(read.remaining, None);
        }
        assert!(leader_of(key, b"a", -1, None).is_err());
    }
}
