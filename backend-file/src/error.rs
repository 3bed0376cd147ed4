//! Mapping file-system errors to [`LockError`].

use std::path::Path;

use distlock_api::LockError;

use crate::FILE_BACKEND;

/// A file-system error on `path`, as a backend error naming the file.
pub(crate) fn io_error(path: &Path, e: std::io::Error) -> LockError {
    LockError::backend_error(FILE_BACKEND, format!("{}: {e}", path.display()))
}
