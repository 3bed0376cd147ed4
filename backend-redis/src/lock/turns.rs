//! Fair hand-off among the waiters of one client: per key, they line up first come,
//! first served, and only the one at the front retries on the server.
//!
//! Without it, every local waiter of a key wakes on each release and they race: grants
//! per task spread widely (2.4× max/min on a hot key) and the server sees a retry per
//! waiter per release. With it, a release wakes the one waiter at the front (the only
//! one that marked the key as waited on and listens), which is granted or goes on
//! waiting; the others wait in the client. A waiter that arrives while others of the
//! client wait for the key lines up behind them without trying first, so it cannot
//! overtake them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Mutex as FairMutex, OwnedMutexGuard};
use tokio::time::Instant;

/// The lines of one client, by lock key name. A key has an entry only while some
/// waiter of this client is in its line.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    lines: Mutex<HashMap<String, Arc<Members>>>,
}

/// One key's line: every waiter in it holds the `Arc`, so its count is the line's
/// length (plus the map's).
#[derive(Debug, Default)]
struct Members {
    front: Arc<FairMutex<()>>,
}

/// A waiter's place in a key's line; dropping it leaves the line (and removes the
/// key's entry when it was the last).
pub(crate) struct Line<'a> {
    turns: &'a Turns,
    key: &'a str,
    members: Arc<Members>,
}

/// The turn to retry on the server: held by the waiter at the front of the line and
/// passed to the next in arrival order when dropped (tokio's mutex is fair).
pub(crate) type Turn = OwnedMutexGuard<()>;

impl Turns {
    fn lines(&self) -> MutexGuard<'_, HashMap<String, Arc<Members>>> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether waiters of this client are lined up for `key`.
    pub(crate) fn busy(&self, key: &str) -> bool {
        self.lines().contains_key(key)
    }

    /// Joins the line for `key`.
    pub(crate) fn join<'a>(&'a self, key: &'a str) -> Line<'a> {
        let members = self.lines().entry(key.to_owned()).or_default().clone();
        Line {
            turns: self,
            key,
            members,
        }
    }

    /// How many waiters are in `key`'s line, the front included.
    pub(crate) fn in_line(&self, key: &str) -> usize {
        self.lines()
            .get(key)
            .map_or(0, |members| Arc::strong_count(members) - 1)
    }

    /// Keys with a line (a test hook for leaks).
    pub(crate) fn len(&self) -> usize {
        self.lines().len()
    }
}

impl Line<'_> {
    /// Waits until this waiter is at the front, or `None` when `deadline` passes first.
    pub(crate) async fn turn(&self, deadline: Option<Instant>) -> Option<Turn> {
        let waiting = self.members.front.clone().lock_owned();
        match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, waiting).await.ok(),
            None => Some(waiting.await),
        }
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        let mut lines = self.turns.lines();
        // The map's handle and ours only: nobody else is in the line. (The caller drops
        // its turn before its place in the line.)
        if Arc::strong_count(&self.members) == 2 {
            lines.remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::future::poll_immediate;

    use super::*;

    #[tokio::test]
    async fn turns_pass_in_arrival_order_and_lines_clean_up() {
        let turns = Turns::default();
        {
            let (first, second, third) = (turns.join("k"), turns.join("k"), turns.join("k"));
            assert!(turns.busy("k"));
            assert_eq!(turns.in_line("k"), 3);
            let turn = first.turn(None).await.expect("no deadline");
            let far = Some(Instant::now() + Duration::from_secs(5));
            let (second_turn, third_turn) = (second.turn(far), third.turn(far));
            tokio::pin!(second_turn, third_turn);
            // Both are queued in order; the front passes its turn on.
            assert!(poll_immediate(second_turn.as_mut()).await.is_none());
            assert!(poll_immediate(third_turn.as_mut()).await.is_none());
            drop(turn);
            assert!(poll_immediate(third_turn.as_mut()).await.is_none());
            let turn = second_turn.await.expect("second's turn");
            drop(turn);
            let turn = third_turn.await.expect("third's turn");
            drop(turn);
        }
        assert!(!turns.busy("k"));
        assert_eq!(turns.len(), 0);
    }

    #[tokio::test]
    async fn a_turn_not_reached_by_the_deadline_is_none() {
        let turns = Turns::default();
        let first = turns.join("k");
        let _turn = first.turn(None).await;
        let second = turns.join("k");
        let soon = Some(Instant::now() + Duration::from_millis(20));
        assert!(second.turn(soon).await.is_none());
    }
}
