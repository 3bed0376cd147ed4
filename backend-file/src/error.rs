//! Mapping file-system errors, and failures of file work on the blocking pool, to
//! [`LockError`].

use std::path::Path;

use distlock_api::LockError;

use crate::FILE_BACKEND;

/// A file-system error on `path`, as a backend error naming the file.
pub(crate) fn io_error(path: &Path, e: std::io::Error) -> LockError {
    LockError::backend_error(FILE_BACKEND, format!("{}: {e}", path.display()))
}

/// Runs file work on the blocking pool. Dropping the future leaves the work to finish
/// and drops its result, so files it locked close (and unlock) then.
///
/// # Errors
/// `work`'s error, or [`LockError::Backend`] when the task panicked or was cancelled.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, LockError> + Send + 'static,
) -> Result<T, LockError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LockError::backend_error(FILE_BACKEND, format!("the file task failed: {e}")))?
}
