//! Leader election: an exclusive `flock(2)` on an election file, with the leader's
//! identity in a leader file beside it.
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

use distlock_api::backend::prelude::*;
use distlock_api::backend::{Grant, Request};
use distlock_api::{
    Candidate, ExtendOutcome, FencingToken, Leader, Lease, LeaseMonitor, LockError, LockKey,
    OwnerToken, ReleaseOutcome, MAX_CANDIDATE_LEN,
};
use tokio::time::Instant;

use crate::error::{blocking, io_error};
use crate::held::try_lock_shared;
use crate::waiter::Waiters;
use crate::{keys, lock_file, FILE_BACKEND};

/// `{term:020} {pid:010} {len:03}\n`: the fixed header of a leader record.
const HEADER_LEN: usize = 36;
/// How often [`leader`] reads a record being written before it gives up.
const READ_ATTEMPTS: usize = 50;
/// The pause between those reads.
const REREAD_PAUSE: Duration = Duration::from_millis(1);

/// The election file of `name` in `dir`: the mutex's file name of the name with
/// `.election` in place of `.lock`.
pub(crate) fn election_path(dir: &Path, name: &LockKey) -> PathBuf {
    dir.join(keys::derived_name(name, ".election"))
}

/// The leader file of `name` in `dir`, with `.leader` in place of `.lock`.
pub(crate) fn leader_path(dir: &Path, name: &LockKey) -> PathBuf {
    dir.join(keys::derived_name(name, ".leader"))
}

/// The leaderships one client holds, across names.
#[derive(Debug, Default)]
pub(crate) struct Elections {
    seats: Mutex<HashMap<OwnerToken, Seat>>,
}

/// The files a leadership keeps locked. Fields drop in order: the leader file closes
/// before the election file, so that whoever takes the election next finds the
/// leader file free.
#[derive(Debug)]
struct Seat {
    leader: File,
    election: File,
}

impl Elections {
    fn seats(&self) -> MutexGuard<'_, HashMap<OwnerToken, Seat>> {
        // Inserts and removes only: a panic elsewhere cannot leave the map torn.
        self.seats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The leadership of `request.key` for `candidate`: a non-blocking try, then, if
    /// the request waits, a place in `waiters`' thread blocked in `flock` on the
    /// election file, as the mutex's acquire waits. `None` when another leads at the
    /// deadline. The lease's fencing token is the term. A dropped future leaves nothing
    /// locked: files taken meanwhile close with the task's result or the channel.
    pub(crate) async fn acquire(
        &self,
        dir: &Path,
        waiters: &Arc<Waiters>,
        request: &Request<'_>,
        candidate: &Candidate,
    ) -> Result<Option<Grant>, LockError> {
        let requested_at = Instant::now();
        let (election_path, leader_path) = (
            election_path(dir, request.key),
            leader_path(dir, request.key),
        );
        let record = candidate.as_bytes().to_vec();
        let tried = {
            let (election, leader) = (election_path.clone(), leader_path.clone());
            let record = record.clone();
            blocking(move || try_seat(&election, &leader, &record)).await?
        };
        if let Some((seat, term)) = tried {
            return Ok(Some(self.grant(request, seat, term, requested_at)));
        }
        request.saw_held();
        if !request.waits() || request.deadline_passed() {
            return Ok(None);
        }
        let Some((election, term)) = waiters.take(&election_path, request.deadline).await? else {
            return Ok(None);
        };
        // The wait counts as part of the request: the lease starts at the grant.
        let granted_at = Instant::now();
        let leader = blocking(move || take_seat(&leader_path, term, &record)).await?;
        let seat = Seat { leader, election };
        Ok(Some(self.grant(request, seat, term, granted_at)))
    }

    fn grant(
        &self,
        request: &Request<'_>,
        seat: Seat,
        term: FencingToken,
        requested_at: Instant,
    ) -> Grant {
        let (owner, ttl) = (OwnerToken::random(), request.options.ttl());
        let lease = Lease::new(request.key.clone(), owner, Some(term), ttl, requested_at);
        self.seats().insert(owner, seat);
        Grant::new(lease, LeaseMonitor::new(requested_at + ttl))
    }

    /// Resigns `lease`: deletes the leader record, then unlocks. `Released` only if
    /// the election file is still the one at its path.
    pub(crate) fn release(&self, dir: &Path, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let (election_path, leader_path) = (
            election_path(dir, lease.key()),
            leader_path(dir, lease.key()),
        );
        let seat = self.seats().remove(&lease.owner());
        if let Some(seat) = seat {
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
        Ok(if held_by_other(&election_path)? {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// Pushes a held leadership's local deadline to `ttl` from now, once its election
    /// file is checked to be still the one at its path.
    pub(crate) fn extend(
        &self,
        dir: &Path,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let requested_at = Instant::now();
        let election_path = election_path(dir, lease.key());
        let mut seats = self.seats();
        if let Some(seat) = seats.get(&lease.owner()) {
            if !lock_file::is_current(&seat.election, &election_path)
                .map_err(|e| io_error(&election_path, e))?
            {
                // The election file was deleted or replaced: our lock guards nothing.
                seats.remove(&lease.owner());
                return Ok(ExtendOutcome::Expired);
            }
            let valid_until = requested_at
                .checked_add(ttl)
                .ok_or_else(|| LockError::config(FILE_BACKEND, "ttl overflows the clock"))?;
            return Ok(ExtendOutcome::Extended { valid_until });
        }
        drop(seats);
        Ok(if held_by_other(&election_path)? {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }
}

/// One campaign without waiting, on the blocking pool: the election file and its next
/// term, then the seat in the leader file.
fn try_seat(
    election_path: &Path,
    leader_path: &Path,
    record: &[u8],
) -> Result<Option<(Seat, FencingToken)>, LockError> {
    let Some(election) =
        lock_file::open_locked(election_path, false).map_err(|e| io_error(election_path, e))?
    else {
        return Ok(None);
    };
    let term = lock_file::take_next_token(&election).map_err(|e| io_error(election_path, e))?;
    let leader = take_seat(leader_path, term, record)?;
    Ok(Some((Seat { leader, election }, term)))
}

/// Whether someone else holds the election file at `path` (a shared lock attempt is
/// refused).
fn held_by_other(path: &Path) -> Result<bool, LockError> {
    match File::open(path) {
        Ok(file) => Ok(!try_lock_shared(&file).map_err(|e| io_error(path, e))?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error(path, e)),
    }
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

/// The current leader of `name` in `dir`, read from its leader file while the leader
/// holds it locked. [`Leader::remaining`] is `None`: a leadership has no expiry.
///
/// # Errors
/// [`LockError::Backend`] naming the file for file-system errors, a file that is not a
/// leader record, or a record still incomplete after [`READ_ATTEMPTS`] reads.
pub(crate) async fn leader(dir: &Path, name: &LockKey) -> Result<Option<Leader>, LockError> {
    let path = leader_path(dir, name);
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
