//! [`FileElection`]: the [`LeaderElection`] over an exclusive `flock(2)` on an election
//! file, with the leader's identity in a leader file beside it.
//!
//! Protocol, per election name `N`:
//! - The **election file** `….election` is a lock file like the mutex's: its leader
//!   holds it exclusive, and its record (the last token and the process that took it)
//!   is the election's term counter. A campaign takes it as the mutex's acquire does
//!   (a non-blocking try, then a thread blocked in `flock` woken by the kernel).
//! - The **leader file** `….leader` holds the leader's record: `{term:020} {pid:010}
//!   {len:03}\n` and the candidate's `len` bytes. Only the holder of the election file
//!   touches it: once it holds the election file and took its term, it opens the leader
//!   file truncated (wiping a dead leader's record), locks it exclusive, and writes
//!   its record; it resigns by deleting the leader file, closing it, then closing the
//!   election file.
//! - A reader opens the leader file and tries a shared lock on it without waiting: if
//!   that succeeds, nobody leads (a leader holds it exclusive from before its record
//!   is written until after it is deleted); if it is refused, the record there is the
//!   current leader's. A record being written reads as incomplete and is read again.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{check_campaign_request, leadership, prelude::*};
use distlock_api::{
    check_ttl, BackendInfo, Candidate, Capability, DistributedLock, ExtendOutcome, FencingToken,
    Leader, LeaderElection, Leadership, Lease, LeaseMonitor, LockError, LockKey, LockOptions,
    OwnerToken, ReleaseOutcome, MAX_CANDIDATE_LEN,
};
use tokio::time::Instant;

use crate::error::io_error;
use crate::held::try_lock_shared;
use crate::lock::NOT_FIFO;
use crate::{keys, lock_file, FileLock, FILE_BACKEND};

/// `{term:020} {pid:010} {len:03}\n`: the fixed header of a leader record.
const HEADER_LEN: usize = 36;
/// How often [`FileElection::leader`] reads a record being written before it gives up.
const READ_ATTEMPTS: usize = 50;
/// The pause between those reads.
const REREAD_PAUSE: Duration = Duration::from_millis(1);

/// A leader-election client of the file backend, made by [`FileLock::election`], for
/// processes on one host.
///
/// - **Leadership** is the exclusive `flock` of the name's election file
///   (`k-NAME.election`: its own file, apart from the mutex's, semaphore's and
///   read-write lock's files of the same name). At most one leader per name among
///   every process using the directory; a waiting campaign blocks in the kernel and is
///   woken when the leader resigns or its process dies, even by `kill -9`.
/// - **Term**: the election file's fencing record, incremented and synced under the
///   lock at each grant as the mutex's token is, so terms rise strictly per name as
///   long as the file is kept.
/// - **Identity**: written by the leader, while it holds the election file, into the
///   leader file `k-NAME.leader`, which it keeps locked exclusive.
///   [`LeaderElection::leader`] reads the record only while that lock is held (a
///   non-blocking shared lock attempt is refused), so a dead leader's record never
///   reads as leader. A resign deletes the leader file; a dead leader's is overwritten
///   by the next one. [`Leader::remaining`] is `None`.
/// - **No TTL expiry**: as the mutex's, the leadership lives until it is resigned or
///   its process exits; the TTL only sets the leader's local validity deadline.
/// - **Observers**: [`LeaderElection::wait_change`] keeps the polling default (every
///   [`distlock_api::OBSERVE_POLL`]): `flock` tells nobody of a change.
///
/// Residue: the election file of every name ever campaigned for stays (it carries
/// the term counter, as mutex lock files do), and the leader file of a leader that
/// died without resigning stays until the next leader. Cloning gives another handle on
/// the same client.
#[derive(Debug, Clone)]
pub struct FileElection {
    locks: FileLock,
    held: Arc<Mutex<HashMap<OwnerToken, Seat>>>,
}

/// The files a leadership keeps locked. Fields drop in order: the leader file closes
/// before the election file, so that whoever takes the election next finds the
/// leader file free.
#[derive(Debug)]
struct Seat {
    leader: File,
    election: File,
}

impl FileElection {
    pub(crate) fn new(locks: FileLock) -> Self {
        FileElection {
            locks,
            held: Arc::default(),
        }
    }

    /// The mutex client whose directory this one uses.
    pub fn client(&self) -> &FileLock {
        &self.locks
    }

    /// The election file of `name`: the mutex's file name of the name with
    /// `.election` in place of `.lock`.
    pub fn election_file_path(&self, name: &LockKey) -> PathBuf {
        self.locks.dir().join(keys::derived_name(name, ".election"))
    }

    /// The leader file of `name`, with `.leader` in place of `.lock`.
    pub fn leader_file_path(&self, name: &LockKey) -> PathBuf {
        self.locks.dir().join(keys::derived_name(name, ".leader"))
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Seat>> {
        // Inserts and removes only: a panic elsewhere cannot leave the map torn.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One campaign without waiting. The file work runs on the blocking pool; if this
    /// future is dropped meanwhile, the files it locked close with the task's result.
    async fn attempt(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, LockError> {
        let requested_at = Instant::now();
        let (election_path, leader_path) =
            (self.election_file_path(name), self.leader_file_path(name));
        let record = candidate.as_bytes().to_vec();
        let seated = blocking(move || {
            let Some(election) = lock_file::open_locked(&election_path, false)
                .map_err(|e| io_error(&election_path, e))?
            else {
                return Ok(None);
            };
            let term =
                lock_file::take_next_token(&election).map_err(|e| io_error(&election_path, e))?;
            let leader = take_seat(&leader_path, term, &record)?;
            Ok(Some((Seat { leader, election }, term)))
        })
        .await?;
        seated
            .map(|(seat, term)| self.leadership(name, candidate, options, seat, term, requested_at))
            .transpose()
    }

    fn leadership(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
        seat: Seat,
        term: FencingToken,
        requested_at: Instant,
    ) -> Result<Leadership, LockError> {
        let owner = OwnerToken::random();
        let lease = Lease::new(name.clone(), owner, Some(term), options.ttl(), requested_at);
        self.held().insert(owner, seat);
        let backend: Arc<dyn LeaderElection> = Arc::new(self.clone());
        leadership(
            lease,
            LeaseMonitor::new(requested_at + options.ttl()),
            backend,
            options.auto_renew(),
            candidate.clone(),
        )
    }

    /// Whether someone else holds the election file of `name` (a shared lock attempt
    /// is refused).
    fn held_by_other(&self, name: &LockKey) -> Result<bool, LockError> {
        let path = self.election_file_path(name);
        match File::open(&path) {
            Ok(file) => Ok(!try_lock_shared(&file).map_err(|e| io_error(&path, e))?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error(&path, e)),
        }
    }
}

/// Runs file work on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, LockError> + Send + 'static,
) -> Result<T, LockError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LockError::backend_error(FILE_BACKEND, format!("the file task failed: {e}")))?
}

/// With the election file held: opens the leader file truncated (a dead leader's
/// record goes), locks it exclusive and writes this leader's record.
fn take_seat(path: &Path, term: FencingToken, candidate: &[u8]) -> Result<File, LockError> {
    let seat = || -> io::Result<File> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        // Only readers take it, and only for a moment: this waits for them at most.
        file.lock()?;
        let mut record = format!(
            "{:020} {:010} {:03}\n",
            term.get(),
            std::process::id(),
            candidate.len()
        )
        .into_bytes();
        record.extend_from_slice(candidate);
        file.write_all_at(&record, 0)?;
        Ok(file)
    };
    seat().map_err(|e| io_error(path, e))
}

/// What a leader file says, read without its lock.
enum Record {
    Leader(Leader),
    /// Empty or short: being written.
    Incomplete,
}

fn read_record(file: &File) -> io::Result<Record> {
    let mut buf = vec![0u8; HEADER_LEN + MAX_CANDIDATE_LEN + 1];
    let mut len = 0;
    while len < buf.len() {
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let invalid = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "not a distlock leader file (`<20-digit term> <10-digit pid> <3-digit length>` and the identity)",
        )
    };
    if len < HEADER_LEN {
        return Ok(Record::Incomplete);
    }
    let header = std::str::from_utf8(&buf[..HEADER_LEN]).map_err(|_| invalid())?;
    let fields: Vec<&str> = header
        .strip_suffix('\n')
        .ok_or_else(invalid)?
        .split(' ')
        .collect();
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let [term, pid, size] = fields[..] else {
        return Err(invalid());
    };
    if !digits(term, 20) || !digits(pid, 10) || !digits(size, 3) {
        return Err(invalid());
    }
    let term: u64 = term.parse().map_err(|_| invalid())?;
    let size: usize = size.parse().map_err(|_| invalid())?;
    if len < HEADER_LEN + size {
        return Ok(Record::Incomplete);
    }
    if len > HEADER_LEN + size {
        return Err(invalid());
    }
    let candidate = Candidate::new(&buf[HEADER_LEN..len]).map_err(|_| invalid())?;
    Ok(Record::Leader(Leader::new(
        candidate,
        FencingToken::new(term),
    )))
}

/// One look at the leader file: `None` when nobody holds it, the record otherwise.
fn look(path: &Path) -> io::Result<Option<Record>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if try_lock_shared(&file)? {
        // Free: whatever it says is a dead leader's (closing the file unlocks it).
        return Ok(None);
    }
    read_record(&file).map(Some)
}

#[async_trait]
impl LeaderElection for FileElection {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.locks)
    }

    async fn try_campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, LockError> {
        check_campaign_request(FILE_BACKEND, options, Capability::Unsupported(NOT_FIFO))?;
        self.attempt(name, candidate, options).await
    }

    /// A campaign that finds a leader waits in a thread blocked in `flock`, as the
    /// mutex's acquire does (see the crate's caveats), and is marked
    /// [`Leadership::contended`].
    async fn campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        check_campaign_request(FILE_BACKEND, options, Capability::Unsupported(NOT_FIFO))?;
        let started = Instant::now();
        if let Some(won) = self.attempt(name, candidate, options).await? {
            return Ok(won);
        }
        let timeout = || LockError::Timeout {
            backend: FILE_BACKEND,
            key: name.clone(),
            waited: started.elapsed(),
        };
        let deadline = options.wait().deadline_from(started);
        if deadline.is_some_and(|d| d <= started) {
            return Err(timeout());
        }
        let election_path = self.election_file_path(name);
        let queued = self
            .locks
            .waiters()
            .wait(election_path.clone())
            .map_err(|e| io_error(&election_path, e))?;
        let received = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, queued)
                .await
                .map_err(|_| timeout())?,
            None => queued.await,
        };
        let granted = received.map_err(|_| {
            LockError::backend_error(FILE_BACKEND, "the waiting thread ended without an answer")
        })?;
        let (election, term) = granted.map_err(|e| io_error(&election_path, e))?;
        // The wait counts as part of the request: the lease starts at the grant.
        let granted_at = Instant::now();
        let (leader_path, record) = (self.leader_file_path(name), candidate.as_bytes().to_vec());
        let leader = blocking(move || take_seat(&leader_path, term, &record)).await?;
        let won = self.leadership(
            name,
            candidate,
            options,
            Seat { leader, election },
            term,
            granted_at,
        )?;
        Ok(distlock_api::backend::mark_contended(won, true))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let seat = self.held().remove(&lease.owner());
        if let Some(seat) = seat {
            let (election_path, leader_path) = (
                self.election_file_path(lease.key()),
                self.leader_file_path(lease.key()),
            );
            // The record goes before the lock: nobody reads it once we resign.
            if lock_file::is_current(&seat.leader, &leader_path)
                .map_err(|e| io_error(&leader_path, e))?
            {
                match std::fs::remove_file(&leader_path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_error(&leader_path, e)),
                }
            }
            // `Released` says nobody else led meanwhile: only true if our locked
            // election file is still the one at the path.
            let current = lock_file::is_current(&seat.election, &election_path)
                .map_err(|e| io_error(&election_path, e))?;
            drop(seat);
            if current {
                return Ok(ReleaseOutcome::Released);
            }
        }
        Ok(if self.held_by_other(lease.key())? {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(FILE_BACKEND, e))?;
        let requested_at = Instant::now();
        let election_path = self.election_file_path(lease.key());
        let mut held = self.held();
        if let Some(seat) = held.get(&lease.owner()) {
            if !lock_file::is_current(&seat.election, &election_path)
                .map_err(|e| io_error(&election_path, e))?
            {
                // The election file was deleted or replaced: our lock guards nothing.
                held.remove(&lease.owner());
                return Ok(ExtendOutcome::Expired);
            }
            let valid_until = requested_at
                .checked_add(ttl)
                .ok_or_else(|| LockError::config(FILE_BACKEND, "ttl overflows the clock"))?;
            return Ok(ExtendOutcome::Extended { valid_until });
        }
        drop(held);
        Ok(if self.held_by_other(lease.key())? {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }

    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        let path = self.leader_file_path(name);
        for _ in 0..READ_ATTEMPTS {
            match look(&path).map_err(|e| io_error(&path, e))? {
                None => return Ok(None),
                Some(Record::Leader(leader)) => return Ok(Some(leader)),
                // Locked, record on its way: the new leader writes it right away.
                Some(Record::Incomplete) => tokio::time::sleep(REREAD_PAUSE).await,
            }
        }
        Err(io_error(
            &path,
            io::Error::other(format!(
                "locked with an incomplete leader record for {READ_ATTEMPTS} reads"
            )),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("k-x.leader");
        let file = take_seat(&path, FencingToken::new(7), "host é".as_bytes()).expect("seats");
        match read_record(&file).expect("reads") {
            Record::Leader(l) => {
                assert_eq!(l.term.get(), 7);
                assert_eq!(l.candidate.as_bytes(), "host é".as_bytes());
            }
            Record::Incomplete => panic!("a written record reads incomplete"),
        }
        // Held: a look reads it; closed: nobody leads.
        assert!(matches!(
            look(&path).expect("looks"),
            Some(Record::Leader(_))
        ));
        drop(file);
        assert!(look(&path).expect("looks").is_none());

        std::fs::write(&path, b"").expect("writes");
        let empty = File::open(&path).expect("opens");
        assert!(matches!(read_record(&empty), Ok(Record::Incomplete)));
        std::fs::write(&path, format!("{:020} {:010} {:03}\nab", 1, 2, 5)).expect("writes");
        let short = File::open(&path).expect("opens");
        assert!(matches!(read_record(&short), Ok(Record::Incomplete)));
        std::fs::write(&path, b"hello, this is not a leader record at all\n").expect("writes");
        let bad = File::open(&path).expect("opens");
        let err = read_record(&bad).err().expect("garbage is refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
