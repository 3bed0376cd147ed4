//! Waiting for a turn by watching every contender ahead of ours, so that the deletion
//! that makes the turn ours is seen in the watch event itself, with no read after it:
//! a hand-off is then the releaser's write and the event, as in etcd's own v3lock
//! service, where a waiter wakes inside the server.
//!
//! The recipe's waiter watches only the contender just before its own and reads the
//! range again when it goes (to find any older one still there). That read is a round
//! trip on the path of every hand-off. Here the waiter learns, once, every contender
//! older than its own (from the transaction that put its key, which reads them when
//! the waiter listens before it, else in one read), then counts their deletions as the
//! client's watch of its prefix passes them on ([`crate::loss::Feed`]). The count is
//! exact: no contender older than ours can appear later (create revisions only rise),
//! and the waiter listens before the read, at or after the revision the watch has
//! passed on up to, so a deletion is either already missing from the read or passed
//! on after it. etcd sends each deletion (puts are filtered out) once per client, not
//! once per waiter, and a wait opens no watch of its own; each waiter then hears every
//! deletion under the prefix, not only its predecessor's, a check in memory. Past
//! [`WATCHED_AHEAD`] older contenders the waiter waits the recipe's way instead until
//! the queue ahead is shorter, so a long queue does not make every waiter read it
//! whole.
//!
//! Key names are reused (see `lock::names`), so the count matches each deletion to the
//! incarnation it ends by revision ([`crate::loss::Deletion::ends`]): the feed may pass
//! on the deletion of a name's former key after the read that found its next one.

use crate::error::Fail;
use crate::loss::Listener;
use crate::recipe::{Ahead, Requests, Rule, Turn, WATCHED_AHEAD};

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
    /// youngest of them, to be waited for the recipe's way. With a `head_start` (a
    /// listener started before our key's put, and the older contenders that put's
    /// transaction read, by create revision), the count starts from it, with no read of
    /// its own. Errors when no watch of the prefix is in place within the request
    /// timeout, or when it breaks.
    pub(crate) async fn watch_turn(
        &self,
        rule: &Rule,
        key: &str,
        revision: i64,
        seen: i64,
        head_start: Option<(Listener, Ahead)>,
    ) -> Result<Turn, Fail> {
        let (mut listener, mut older) = match head_start {
            Some(started) => started,
            None => {
                let listener = self.feed.listen(self.timeout).await?;
                match self
                    .ahead(rule, key, revision, seen.max(listener.from))
                    .await?
                {
                    Ok(older) => (listener, older),
                    Err(turn) => return Ok(turn),
                }
            }
        };
        while older.len() >= rule.room {
            for deleted in listener.next().await?.iter() {
                if deleted.key == key.as_bytes() && deleted.ends(revision) {
                    return Ok(Turn::Gone);
                }
                if older
                    .get(&deleted.key)
                    .is_some_and(|created| deleted.ends(*created))
                {
                    older.remove(&deleted.key);
                }
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
    ) -> Result<Result<Ahead, Turn>, Fail> {
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
