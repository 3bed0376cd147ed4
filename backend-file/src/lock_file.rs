//! One lock file: its OS lock, and the record inside it (the last fencing token handed
//! out for the key, and the process that took it).

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;

use distlock_api::FencingToken;

/// `{token:020} {pid:010}\n`: fixed width, so an update is one write at offset 0.
const RECORD_LEN: usize = 32;

/// What a lock file says about its last grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// The last fencing token handed out for the key.
    pub(crate) token: FencingToken,
    /// The process that took it.
    pub(crate) pid: u32,
}

/// Opens (creating it if needed) the lock file at `path` for reading and writing. A
/// symlink planted at `path` is refused rather than followed.
pub(crate) fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// How often [`open_locked`] reopens a lock file that was replaced while it locked it.
const MAX_REOPENS: usize = 16;

/// Opens `path` and takes its exclusive lock, blocking or not; `None` when `block` is
/// false and another open file holds it.
///
/// After locking, checks the path still names the locked file: a lock on a file that
/// was deleted or replaced meanwhile guards nothing, so it is dropped and the new file
/// is locked instead.
pub(crate) fn open_locked(path: &Path, block: bool) -> io::Result<Option<File>> {
    for _ in 0..MAX_REOPENS {
        let file = open(path)?;
        if block {
            file.lock()?;
        } else if !try_lock(&file)? {
            return Ok(None);
        }
        if is_current(&file, path)? {
            return Ok(Some(file));
        }
    }
    Err(io::Error::other(
        "the lock file was replaced every time it was locked",
    ))
}

/// Whether `path` still names `file` (same device and inode).
pub(crate) fn is_current(file: &File, path: &Path) -> io::Result<bool> {
    let held = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Unlocks `file` before it is closed. Closing alone is not enough: a child process
/// forked meanwhile by any thread of this process shares the open file until it execs,
/// and kept the lock held that long after the release returned. A failed unlock leaves
/// the close to do it.
pub(crate) fn unlock(file: &File) {
    let _ = file.unlock();
}

/// Takes the exclusive OS lock without blocking; `false` if another open file holds it.
///
/// `flock(2)` locks belong to the open file, not the process: two clients in one
/// process exclude each other, and the kernel drops the lock when the holder's last
/// descriptor closes, also when the process dies.
pub(crate) fn try_lock(file: &File) -> io::Result<bool> {
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// The record in `file`; `None` for a new, empty file.
pub(crate) fn read_record(file: &File) -> io::Result<Option<Record>> {
    // Positioned reads: the file's cursor is shared with nothing and never moves.
    let mut buf = [0u8; RECORD_LEN + 1];
    let mut len = 0;
    while len < buf.len() {
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if len == 0 {
        return Ok(None);
    }
    parse(&buf[..len]).map(Some).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "not a distlock lock file (its record is not `<20-digit token> <10-digit pid>`)",
        )
    })
}

fn parse(bytes: &[u8]) -> Option<Record> {
    let text = std::str::from_utf8(bytes).ok()?;
    let line = text.strip_suffix('\n')?;
    let (token, pid) = line.split_once(' ')?;
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(token, 20) || !digits(pid, 10) {
        return None;
    }
    Some(Record {
        token: FencingToken::new(token.parse().ok()?),
        pid: pid.parse().ok()?,
    })
}

/// With the OS lock held: hands out the token after the file's last one, records it
/// with our pid, and syncs it, so the counter survives the process and the host.
pub(crate) fn take_next_token(file: &File) -> io::Result<FencingToken> {
    let last = read_record(file)?.map_or(0, |r| r.token.get());
    let next = last.checked_add(1).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the fencing counter is exhausted",
        )
    })?;
    let record = format!("{next:020} {:010}\n", std::process::id());
    file.write_all_at(record.as_bytes(), 0)?;
    file.sync_data()?;
    Ok(FencingToken::new(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = open(&dir.path().join("k.lock")).expect("opens");
        assert_eq!(read_record(&file).expect("reads"), None);
        assert_eq!(take_next_token(&file).expect("token").get(), 1);
        assert_eq!(take_next_token(&file).expect("token").get(), 2);
        let record = read_record(&open(&dir.path().join("k.lock")).expect("opens"))
            .expect("reads")
            .expect("a record");
        assert_eq!(record.token.get(), 2);
        assert_eq!(record.pid, std::process::id());

        std::fs::write(dir.path().join("bad.lock"), b"hello\n").expect("writes");
        let bad = open(&dir.path().join("bad.lock")).expect("opens");
        let err = take_next_token(&bad).expect_err("garbage is refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_replaced_lock_file_is_not_trusted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("k.lock");
        let first = open_locked(&path, false).expect("locks").expect("free");
        assert!(is_current(&first, &path).expect("checks"));
        std::fs::remove_file(&path).expect("deletes");
        assert!(!is_current(&first, &path).expect("checks"));
        // A new file at the path is a new lock, which the old holder can detect.
        let second = open_locked(&path, false).expect("locks").expect("free");
        assert!(is_current(&second, &path).expect("checks"));
        assert!(!is_current(&first, &path).expect("checks"));
    }

    #[test]
    fn symlinks_are_not_followed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"precious").expect("writes");
        let link = dir.path().join("k.lock");
        std::os::unix::fs::symlink(&target, &link).expect("links");
        assert!(open(&link).is_err(), "opened a planted symlink");
        assert_eq!(std::fs::read(&target).expect("reads"), b"precious");
    }

    #[test]
    fn two_open_files_in_one_process_exclude_each_other() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("k.lock");
        let (a, b) = (open(&path).expect("opens"), open(&path).expect("opens"));
        assert!(try_lock(&a).expect("locks"));
        assert!(!try_lock(&b).expect("reports held"));
        drop(a);
        assert!(try_lock(&b).expect("free after close"));
    }
}
