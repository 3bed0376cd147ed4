//! One watch per client over the whole prefix, which marks a held lock lost as soon as
//! its key is deleted (its lease expired or was revoked (`etcdctl lease revoke`), or
//! the key was deleted from outside), and feeds the client's waiters the deletions
//! they count down (see [`crate::ahead`]).
//!
//! A watch per held lock would cost a gRPC stream and a server-side watcher per grant
//! (about half the time of an uncontended acquire and release on a loopback server);
//! one watch serves every lock of the client. A watch per wait cost the same, and every
//! deletion in a lock's range went out once per waiter as well as once per client.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::LeaseMonitor;
use etcd_client::{Client, EventType, GetOptions, WatchFilterType, WatchOptions};
use tokio::sync::{broadcast, oneshot, watch};

use crate::error::Fail;
use crate::keys::prefix_end;

/// How many watch answers a waiter may fall behind before it must read again.
const FEED_CAPACITY: usize = 1024;

/// The held keys of a client and their monitors.
#[derive(Debug, Default)]
pub(crate) struct Watched(Mutex<HashMap<Vec<u8>, LeaseMonitor>>);

impl Watched {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, LeaseMonitor>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches `key` for `monitor` until [`Watched::forget`].
    pub(crate) fn watch(&self, key: &str, monitor: LeaseMonitor) {
        self.map().insert(key.as_bytes().to_vec(), monitor);
    }

    /// Stops watching `key`; `true` if it was watched and no deletion of it was seen.
    pub(crate) fn forget(&self, key: &str) -> bool {
        self.map().remove(key.as_bytes()).is_some()
    }

    /// Marks the lock of `key` lost, if it is watched.
    fn deleted(&self, key: &[u8]) {
        if let Some(monitor) = self.map().remove(key) {
            monitor.mark_lost();
        }
    }

    /// Marks lost every watched key that is not in `present`.
    fn missing(&self, present: &[Vec<u8>]) {
        self.map().retain(|key, monitor| {
            let here = present.iter().any(|p| p == key);
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

/// What the watch passes on to waiters.
#[derive(Debug, Clone)]
pub(crate) enum Seen {
    /// The keys one watch answer saw deleted.
    Deleted(Arc<[Vec<u8>]>),
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
    fn passed(&self, revision: i64, deleted: Vec<Vec<u8>>) {
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
    /// The keys of the next watch answer with deletions.
    ///
    /// # Errors
    /// When the watch listened to broke, or this listener fell too far behind: some
    /// deletion may not be told, and the waiter must read again.
    pub(crate) async fn next(&mut self) -> Result<Arc<[Vec<u8>]>, Fail> {
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
                let deleted: Vec<Vec<u8>> = response
                    .events()
                    .iter()
                    .filter(|event| event.event_type() == EventType::Delete)
                    .filter_map(|event| event.kv().map(|kv| kv.key().to_vec()))
                    .collect();
                for key in &deleted {
                    watched.deleted(key);
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

/// Marks lost every watched key that is gone; `false` if etcd could not be asked.
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
            let present: Vec<Vec<u8>> = found.kvs().iter().map(|kv| kv.key().to_vec()).collect();
            watched.missing(&present);
            true
        }
        _ => false,
    }
}
