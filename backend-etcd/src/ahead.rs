//! Waiting for a turn by watching every contender ahead of ours, so that the deletion
//! that makes the turn ours is seen in the watch event itself, with no read after it:
//! a hand-off is then the releaser's write and the event, as in etcd's own v3lock
//! service, where a waiter wakes inside the server.
//!
//! The recipe's waiter watches only the contender just before its own and reads the
//! range again when it goes (to find any older one still there). That read is a round
//! trip on the path of every hand-off. Here the waiter reads, once, every contender
//! older than its own, then counts their deletions in a watch of the whole range. The
//! count is exact: no contender older than ours can appear later (create revisions only
//! rise), and the watch is in place before the read, so a deletion is either already
//! missing from the read or delivered after it. Each waiter then hears every deletion
//! in the range (puts are filtered out by etcd), not only its predecessor's; past
//! [`WATCHED_AHEAD`] older contenders the waiter waits the recipe's way instead until
//! the queue ahead is shorter, so a long queue does not make every waiter read it
//! whole.

use std::collections::HashSet;

use etcd_client::{EventType, WatchOptions};

use crate::error::{within, Fail};
use crate::keys::prefix_end;
use crate::recipe::{Requests, Rule, Turn};

/// The most older contenders a waiter reads and counts down.
const WATCHED_AHEAD: usize = 64;

impl Requests {
    /// Whether [`Requests::watch_turn`] serves a `rule` contender with `key`: when our
    /// key is in the blocking range (all but a reader of the read-write lock), and the
    /// room is within what a waiter counts down.
    pub(crate) fn watches_ahead(rule: &Rule, key: &str) -> bool {
        key.starts_with(&rule.blocking) && rule.room <= WATCHED_AHEAD
    }

    /// Waits until fewer of `rule.blocking`'s contenders than its room are older than
    /// ours (`key`, create revision `revision`), reading etcd at revision `seen` or
    /// later: [`Turn::Ours`] or [`Turn::Gone`] as soon as a watch event shows it, or,
    /// with more than [`WATCHED_AHEAD`] older contenders, [`Turn::After`] with the
    /// youngest of them, to be waited for the recipe's way. Errors when the watch
    /// cannot be made or breaks.
    pub(crate) async fn watch_turn(
        &self,
        rule: &Rule,
        key: &str,
        revision: i64,
        seen: i64,
    ) -> Result<Turn, Fail> {
        let options = WatchOptions::new().with_range(prefix_end(&rule.blocking));
        let mut stream = self
            .watch_deletions(rule.blocking.as_bytes(), options)
            .await?;
        let watched_from = loop {
            match within(self.timeout, stream.message()).await? {
                Some(response) if response.created() => {
                    break response.header().map_or(0, |h| h.revision())
                }
                Some(_) => {}
                None => return Err(stream_ended()),
            }
        };
        let mut older = match self
            .ahead(rule, key, revision, seen.max(watched_from))
            .await?
        {
            Ok(older) => older,
            Err(turn) => return Ok(turn),
        };
        while older.len() >= rule.room {
            let Some(response) = stream.message().await.map_err(Fail::Etcd)? else {
                return Err(stream_ended());
            };
            if response.canceled() {
                return Err(Fail::Etcd(etcd_client::Error::WatchError(
                    "etcd cancelled the watch of the contenders ahead".into(),
                )));
            }
            for event in response.events() {
                let Some(kv) = event
                    .kv()
                    .filter(|_| event.event_type() == EventType::Delete)
                else {
                    continue;
                };
                if kv.key() == key.as_bytes() {
                    return Ok(Turn::Gone);
                }
                older.remove(kv.key());
            }
        }
        Ok(Turn::Ours)
    }

    /// The keys of the contenders older than ours, read at revision `at` or later; or
    /// the turn itself when that settles it (our key gone, or too many ahead).
    async fn ahead(
        &self,
        rule: &Rule,
        key: &str,
        revision: i64,
        at: i64,
    ) -> Result<Result<HashSet<Vec<u8>>, Turn>, Fail> {
        Ok(
            match self
                .older_than_ours(rule, key, revision, WATCHED_AHEAD, at)
                .await?
            {
                Err(gone) => Err(gone),
                Ok((mut older, true)) => {
                    older.truncate(rule.room);
                    Err(Turn::After(older))
                }
                Ok((older, false)) => Ok(older.into_iter().collect()),
            },
        )
    }
}

fn stream_ended() -> Fail {
    Fail::Etcd(etcd_client::Error::WatchError(
        "the watch stream ended".into(),
    ))
}
