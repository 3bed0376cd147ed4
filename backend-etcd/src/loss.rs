//! One watch per client over the whole prefix, which marks a held lock lost as soon as
//! its key is deleted (its lease expired or was revoked (`etcdctl lease revoke`), or
//! the key was deleted from outside), and feeds the client's waiters the deletions
//! they count down (see [`crate::ahead`]).
//!
//! A watch per held lock would cost a gRPC stream and a server-side watcher per grant
//! (about half the time of an uncontended acquire and release on a loopback server);
//! one watch serves every lock of the client. A watch per wait cost the same, and every
//! deletion in a lock's range went out once per waiter as well as once per client.
//!
//! Key names are reused (see `lock::names`), so a deletion is matched to an incarnation
//! of a name by revision: a deletion at revision `D` ends the key created at `C` only
//! if `C < D` (the watch may pass on the deletion of a name's former key after its
//! next key was put), and a key read back with another create revision than ours means
//! ours is gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::LeaseMonitor;
use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchFilterType, WatchOptions};
use tokio::sync::{broadcast, oneshot, watch};

use crate::error::Fail;
use crate::keys::prefix_end;

/// How many watch answers a waiter may fall behind before it must read again.
const FEED_CAPACITY: usize = 1024;

/// The held keys of a client, with their create revisions, and their monitors.
#[derive(Debug, Default)]
pub(crate) struct Watched(Mutex<HashMap<Vec<u8>, (i64, LeaseMonitor)>>);

impl Watched {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, (i64, LeaseMonitor)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches `key`, created at `revision`, for `monitor` until [`Watched::forget`].
    pub(crate) fn watch(&self, key: &str, revision: i64, monitor: LeaseMonitor) {
        self.map()
            .insert(key.as_bytes().to_vec(), (revision, monitor));
    }

    /// Stops watching `key` created at `revision`; `true` if it was watched and no
    /// deletion of it was seen.
    pub(crate) fn forget(&self, key: &str, revision: i64) -> bool {
        let mut map = self.map();
        match map.get(key.as_bytes()) {
            Some((created, _)) if *created == revision => map.remove(key.as_bytes()).is_some(),
            _ => false,
        }
    }

    /// Marks the lock of `deleted.key` lost, if it is watched and was created before
    /// that deletion.
    fn deleted(&self, deleted: &Deletion) {
        let mut map = self.map();
        if map
            .get(&deleted.key)
            .is_some_and(|(created, _)| deleted.ends(*created))
        {
            if let Some((_, monitor)) = map.remove(&deleted.key) {
                monitor.mark_lost();
            }
        }
    }

    /// Marks lost every watched key that is not in `present` (keys and their create
    /// revisions) with its create revision.
    fn missing(&self, present: &[(Vec<u8>, i64)]) {
        self.map().retain(|key, (created, monitor)| {
            let here = present.iter().any(|(p, at)| p == key && at == created);
            if !here {
                monitor.mark_lost();
            }
            here
        });
    }

    fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}

/// A key's deletion, seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deletion {
    pub(crate) key: Vec<u8>,
    /// The revision of the deletion.
    pub(crate) at: i64,
}

impl Deletion {
    /// Whether this deletion ends the key of its name created at `created`: one
    /// created before it (a later one of the same name is another incarnation).
    pub(crate) fn ends(&self, created: i64) -> bool {
        created < self.at
    }
}

/// What the watch passes on to waiters.
#[derive(Debug, Clone)]
pub(crate) enum Seen {
    /// The keys one watch answer saw deleted.
    Deleted(Arc<[Deletion]>),
    /// The watch of this generation broke: deletions after it may not be passed on.
    Broke(u64),
}

/// The deletions under the prefix, passed on to the waiters listening.
#[derive(Debug)]
pub(crate) struct Feed {
    deletions: broadcast::Sender<Seen>,
    /// The generation of the watch in place (counted from 1), or 0 while none is.
    live: watch::Sender<u64>,
    /// The revision up to which the watch in place has passed on every deletion.
    progress: AtomicI64,
}

/// A waiter's view of the feed: every deletion the watch saw after [`Feed::listen`].
pub(crate) struct Listener {
    deletions: broadcast::Receiver<Seen>,
    generation: u64,
    /// A read at this revision or later misses nothing the listener will not be told.
    pub(crate) from: i64,
}

impl Feed {
    fn new() -> Feed {
        Feed {
            deletions: broadcast::channel(FEED_CAPACITY).0,
            live: watch::channel(0).0,
            progress: AtomicI64::new(0),
        }
    }

    /// Starts listening, once a watch is in place (waiting up to `timeout` for one).
    ///
    /// # Errors
    /// [`Fail::TimedOut`] when no watch is in place by then.
    pub(crate) async fn listen(&self, timeout: Duration) -> Result<Listener, Fail> {
        // Subscribed before the generation and the progress are read: the watch task
        // records both before it passes an answer on, so whatever this listener misses
        // is at or below `from`, and a break after it is told.
        let deletions = self.deletions.subscribe();
        let mut live = self.live.subscribe();
        let generation = match tokio::time::timeout(timeout, live.wait_for(|g| *g != 0)).await {
            Ok(Ok(generation)) => *generation,
            _ => return Err(Fail::TimedOut(timeout)),
        };
        Ok(Listener {
            deletions,
            generation,
            from: self.progress.load(Ordering::SeqCst),
        })
    }

    /// A watch of `generation` is in place from `revision` on.
    fn started(&self, generation: u64, revision: i64) {
        self.progress.store(revision, Ordering::SeqCst);
        self.live.send_replace(generation);
    }

    /// Passes on the deletions of an answer at `revision`.
    fn passed(&self, revision: i64, deleted: Vec<Deletion>) {
        self.progress.fetch_max(revision, Ordering::SeqCst);
        if !deleted.is_empty() && self.deletions.receiver_count() > 0 {
            let _ = self.deletions.send(Seen::Deleted(deleted.into()));
        }
    }

    /// The watch of `generation` ended.
    fn broke(&self, generation: u64) {
        self.live.send_replace(0);
        let _ = self.deletions.send(Seen::Broke(generation));
    }
}

impl Listener {
    /// The deletions of the next watch answer with any.
    ///
    /// # Errors
    /// When the watch listened to broke, or this listener fell too far behind: some
    /// deletion may not be told, and the waiter must read again.
    pub(crate) async fn next(&mut self) -> Result<Arc<[Deletion]>, Fail> {
        loop {
            match self.deletions.recv().await {
                Ok(Seen::Deleted(keys)) => return Ok(keys),
                Ok(Seen::Broke(generation)) if generation != self.generation => {}
                Ok(Seen::Broke(_)) | Err(broadcast::error::RecvError::Closed) => {
                    return Err(watch_failed("the client's watch of its prefix broke"))
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    return Err(watch_failed(
                        "a waiter fell behind the client's watch of its prefix",
                    ))
                }
            }
        }
    }
}

fn watch_failed(what: &str) -> Fail {
    Fail::Etcd(etcd_client::Error::WatchError(what.into()))
}

/// Stops the watch task when dropped (with the client).
#[derive(Debug)]
pub(crate) struct LossWatch {
    pub(crate) watched: Arc<Watched>,
    pub(crate) feed: Arc<Feed>,
    _stop: oneshot::Sender<()>,
}

impl LossWatch {
    /// Spawns the watch over `prefix/` on the current runtime.
    pub(crate) fn spawn(client: Client, prefix: &str, timeout: Duration) -> LossWatch {
        let watched = Arc::new(Watched::default());
        let feed = Arc::new(Feed::new());
        let (stop, stopped) = oneshot::channel();
        let range = format!("{prefix}/");
        tokio::spawn({
            let (watched, feed) = (watched.clone(), feed.clone());
            async move {
                tokio::select! {
                    _ = stopped => {}
                    () = watch_forever(client, range, (&watched, &feed), timeout) => {}
                }
            }
        });
        LossWatch {
            watched,
            feed,
            _stop: stop,
        }
    }
}

/// Watches every delete under `range`; after each (re)start of the watch, checks that
/// every watched key still exists, so a delete while no watch ran is not missed.
/// Passes the deletions on to `feed` while a watch is in place.
async fn watch_forever(
    client: Client,
    range: String,
    (watched, feed): (&Watched, &Feed),
    timeout: Duration,
) {
    let mut pause = Duration::from_millis(50);
    let mut generation = 0;
    loop {
        let mut watch = client.watch_client();
        let options = WatchOptions::new()
            .with_range(prefix_end(&range))
            .with_filters([WatchFilterType::NoPut]);
        if let Ok(Ok(mut stream)) =
            tokio::time::timeout(timeout, watch.watch(range.as_bytes(), Some(options))).await
        {
            generation += 1;
            while let Ok(Some(response)) = stream.message().await {
                let revision = response.header().map_or(0, |h| h.revision());
                if response.created() {
                    if !catch_up(&client, &range, watched, timeout).await {
                        break;
                    }
                    feed.started(generation, revision);
                }
                let deleted: Vec<Deletion> = response
                    .events()
                    .iter()
                    .filter(|event| event.event_type() == EventType::Delete)
                    .filter_map(|event| event.kv().map(deletion))
                    .collect();
                for deletion in &deleted {
                    watched.deleted(deletion);
                }
                feed.passed(revision, deleted);
                if response.canceled() {
                    break;
                }
                pause = Duration::from_millis(50);
            }
            feed.broke(generation);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// The deletion a delete event's key records (etcd sets a deleted key's mod revision
/// to the deletion's revision).
pub(crate) fn deletion(kv: &KeyValue) -> Deletion {
    Deletion {
        key: kv.key().to_vec(),
        at: kv.mod_revision(),
    }
}

/// Marks lost every watched key that is gone (or there as another incarnation);
/// `false` if etcd could not be asked.
async fn catch_up(client: &Client, range: &str, watched: &Watched, timeout: Duration) -> bool {
    if watched.is_empty() {
        return true;
    }
    let mut kv = client.kv_client();
    let options = GetOptions::new()
        .with_range(prefix_end(range))
        .with_keys_only();
    match tokio::time::timeout(timeout, kv.get(range.as_bytes(), Some(options))).await {
        Ok(Ok(found)) => {
            let present: Vec<(Vec<u8>, i64)> = found
                .kvs()
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.create_revision()))
                .collect();
            watched.missing(&present);
            true
        }
        _ => false,
    }
}
