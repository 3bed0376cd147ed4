//! `file://` URLs and the default lock directory.

use std::path::PathBuf;

use distlock_api::LockError;

use crate::FILE_BACKEND;

/// The directory `file://` uses: `/tmp/distlock-<uid>`.
///
/// Fixed, not taken from `TMPDIR` or `XDG_RUNTIME_DIR`, so a cron job, a systemd unit
/// and a login shell of one user all lock in the same place. Private to the user: two
/// users do not share locks through it; name a shared directory explicitly for that.
/// Systems that age out old files in `/tmp` should use a directory that is not cleaned:
/// a lock file deleted while held lets a second process in (see the crate docs).
pub fn default_dir() -> PathBuf {
    PathBuf::from(format!("/tmp/distlock-{}", effective_uid()))
}

#[allow(unsafe_code)] // FFI: see the SAFETY notes
fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// [`default_dir`], created with mode 0700 if missing, and refused if another user
/// owns it or others may write to it (someone could otherwise plant it in `/tmp`).
pub(crate) fn private_default_dir() -> Result<PathBuf, LockError> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let dir = default_dir();
    let fail = |what: String| LockError::config(FILE_BACKEND, what);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(format!("cannot create {}: {e}", dir.display()))),
    }
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| fail(format!("cannot use {}: {e}", dir.display())))?;
    if !meta.is_dir() || meta.uid() != effective_uid() || meta.mode() & 0o022 != 0 {
        return Err(fail(format!(
            "{} is not a directory owned by this user and writable only by it; pass file:///SOME/DIR instead",
            dir.display()
        )));
    }
    Ok(dir)
}

/// A parsed `file://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileUrl {
    /// The lock directory the URL names; `None` for `file://`, the [`default_dir`].
    pub dir: Option<PathBuf>,
}

/// Parses `file://` (the [`default_dir`]) or `file:///ABSOLUTE/DIR` (also
/// `file://localhost/ABSOLUTE/DIR`), with `%xx` escapes decoded in the path.
///
/// # Errors
/// [`LockError::Config`] for another scheme, a relative path, a host other than
/// `localhost`, a query or fragment, or a bad `%`-escape.
pub fn parse_url(url: &str) -> Result<FileUrl, LockError> {
    Ok(FileUrl {
        dir: parse_dir(url)?,
    })
}

/// The directory a `file://` URL names: `None` for the default (`file://`).
fn parse_dir(url: &str) -> Result<Option<PathBuf>, LockError> {
    let usage = "use file:// (the default directory) or file:///ABSOLUTE/DIR";
    let fail = |what: &str| LockError::config(FILE_BACKEND, format!("{what}: {usage}"));
    let rest = url
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("file://"))
        .map(|_| &url[7..])
        .ok_or_else(|| fail("not a file:// URL"))?;
    if rest.contains(['?', '#']) {
        return Err(fail("file:// URLs take no query or fragment"));
    }
    if rest.is_empty() {
        return Ok(None);
    }
    let path = match rest.find('/') {
        Some(0) => rest,
        Some(at) if rest[..at].eq_ignore_ascii_case("localhost") => &rest[at..],
        _ => return Err(fail("the directory must be an absolute path on this host")),
    };
    let decoded = percent_decode(path).ok_or_else(|| fail("bad %-escape in the path"))?;
    Ok(Some(PathBuf::from(decoded)))
}

/// `%xx` escapes decoded to bytes; `None` for a malformed escape or non-UTF-8 result.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.contains('\0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_absolute_directories() {
        assert_eq!(parse_url("file://").expect("default").dir, None);
        assert_eq!(
            parse_url("file:///var/lock/app").expect("absolute").dir,
            Some(PathBuf::from("/var/lock/app"))
        );
        assert_eq!(
            parse_url("FILE://localhost/tmp/a%20b")
                .expect("localhost")
                .dir,
            Some(PathBuf::from("/tmp/a b"))
        );
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for url in [
            "file:",
            "files:///x",
            "file://relative/dir",
            "file://host/dir",
            "file:///x?mode=1",
            "file:///x#y",
            "file:///bad%2",
            "file:///bad%zz",
            "file:///nul%00",
        ] {
            match parse_url(url) {
                Err(LockError::Config { .. }) => {}
                other => panic!("{url}: expected a config error, got {other:?}"),
            }
        }
    }
}
