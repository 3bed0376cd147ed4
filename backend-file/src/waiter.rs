//! Waiting without polling: per client and key, one thread blocked in `flock(2)`, which
//! the kernel wakes when the holder unlocks or dies.
//!
//! A blocked `flock` cannot be cancelled, so waiters that give up leave the thread
//! blocked until the lock frees; it then hands the lock to the next waiter still
//! waiting, or, with none left, unlocks at once and ends. Sharing the thread bounds
//! them to one per key being waited on, however many acquires time out.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use distlock_api::{FencingToken, LockError};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::io_error;
use crate::{lock_file, FILE_BACKEND};

/// A lock taken for a waiter: the locked file and the token recorded in it.
type Taken = io::Result<(File, FencingToken)>;

/// The waiters of one client, per lock file.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    queues: Mutex<HashMap<PathBuf, VecDeque<oneshot::Sender<Taken>>>>,
}

impl Waiters {
    fn queues(&self) -> MutexGuard<'_, HashMap<PathBuf, VecDeque<oneshot::Sender<Taken>>>> {
        // Every update is a push or pop under the lock: a panic cannot leave it torn.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for `path`'s exclusive lock, in the key's blocked thread, until `deadline`
    /// (`None`: until granted): the locked file with its new token, or `None` at the
    /// deadline. Dropping the future gives up the place; a lock handed over meanwhile
    /// closes (and unlocks) with the channel.
    ///
    /// # Errors
    /// [`LockError::Backend`] naming the file when the thread cannot start, the lock
    /// or its counter fails, or the thread ended without an answer.
    pub(crate) async fn take(
        self: &Arc<Self>,
        path: &Path,
        deadline: Option<Instant>,
    ) -> Result<Option<(File, FencingToken)>, LockError> {
        let queued = self.wait(path.to_owned()).map_err(|e| io_error(path, e))?;
        let received = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, queued).await {
                Ok(received) => received,
                Err(_) => return Ok(None),
            },
            None => queued.await,
        };
        let taken = received.map_err(|_| {
            LockError::backend_error(FILE_BACKEND, "the waiting thread ended without an answer")
        })?;
        taken.map(Some).map_err(|e| io_error(path, e))
    }

    /// Queues a waiter for `path`, starting the key's blocked thread if none runs.
    /// Dropping the receiver gives up the place.
    fn wait(self: &Arc<Self>, path: PathBuf) -> io::Result<oneshot::Receiver<Taken>> {
        let (sender, receiver) = oneshot::channel();
        let mut queues = self.queues();
        match queues.entry(path.clone()) {
            Entry::Occupied(mut queue) => {
                // Forget waiters that gave up, so retries on a long-held key do not pile up.
                queue.get_mut().retain(|waiter| !waiter.is_closed());
                queue.get_mut().push_back(sender);
            }
            Entry::Vacant(slot) => {
                let waiters = Arc::clone(self);
                std::thread::Builder::new()
                    .name("distlock-file-wait".into())
                    .spawn(move || waiters.block_and_hand_over(path))?;
                slot.insert(VecDeque::from([sender]));
            }
        }
        Ok(receiver)
    }

    /// The blocked thread: takes the lock, hands it to the first waiter still waiting,
    /// and goes on while others wait.
    fn block_and_hand_over(&self, path: PathBuf) {
        loop {
            let grant = lock_file::open_locked(&path, true).and_then(|file| {
                let file = file.ok_or_else(|| io::Error::other("a blocking lock returned busy"))?;
                let token = lock_file::take_next_token(&file)?;
                Ok((file, token))
            });
            let mut queues = self.queues();
            let Some(queue) = queues.get_mut(&path) else {
                return;
            };
            match grant {
                Ok(grant) => {
                    let mut unclaimed: Taken = Ok(grant);
                    while let Some(waiter) = queue.pop_front() {
                        match waiter.send(unclaimed) {
                            Ok(()) => break,
                            // That waiter gave up; try the next.
                            Err(returned) => unclaimed = returned,
                        }
                    }
                    // Unclaimed: dropped here, which closes the file and unlocks it.
                }
                Err(e) => {
                    for waiter in queue.drain(..) {
                        let _ = waiter.send(Err(io::Error::new(e.kind(), e.to_string())));
                    }
                }
            }
            if queue.is_empty() {
                queues.remove(&path);
                return;
            }
        }
    }
}
