//! One watch per client over the whole prefix, which marks a held lock lost as soon as
//! its key is deleted: its lease expired or was revoked (`etcdctl lease revoke`), or
//! the key was deleted from outside.
//!
//! A watch per held lock would cost a gRPC stream and a server-side watcher per grant
//! (about half the time of an uncontended acquire and release on a loopback server);
//! one watch serves every lock of the client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::LeaseMonitor;
use etcd_client::{Client, EventType, GetOptions, WatchFilterType, WatchOptions};
use tokio::sync::oneshot;

use crate::keys::prefix_end;

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

/// Stops the watch task when dropped (with the client).
#[derive(Debug)]
pub(crate) struct LossWatch {
    pub(crate) watched: Arc<Watched>,
    _stop: oneshot::Sender<()>,
}

impl LossWatch {
    /// Spawns the watch over `prefix/` on the current runtime.
    pub(crate) fn spawn(client: Client, prefix: &str, timeout: Duration) -> LossWatch {
        let watched = Arc::new(Watched::default());
        let (stop, stopped) = oneshot::channel();
        let range = format!("{prefix}/");
        tokio::spawn({
            let watched = watched.clone();
            async move {
                tokio::select! {
                    _ = stopped => {}
                    () = watch_forever(client, range, watched, timeout) => {}
                }
            }
        });
        LossWatch {
            watched,
            _stop: stop,
        }
    }
}

/// Watches every delete under `range`; after each (re)start of the watch, checks that
/// every watched key still exists, so a delete while no watch ran is not missed.
async fn watch_forever(client: Client, range: String, watched: Arc<Watched>, timeout: Duration) {
    let mut pause = Duration::from_millis(50);
    loop {
        let mut watch = client.watch_client();
        let options = WatchOptions::new()
            .with_range(prefix_end(&range))
            .with_filters([WatchFilterType::NoPut]);
        if let Ok(Ok(mut stream)) =
            tokio::time::timeout(timeout, watch.watch(range.as_bytes(), Some(options))).await
        {
            while let Ok(Some(response)) = stream.message().await {
                if response.created() && !catch_up(&client, &range, &watched, timeout).await {
                    break;
                }
                for event in response.events() {
                    if event.event_type() == EventType::Delete {
                        if let Some(kv) = event.kv() {
                            watched.deleted(kv.key());
                        }
                    }
                }
                if response.canceled() {
                    break;
                }
                pause = Duration::from_millis(50);
            }
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
