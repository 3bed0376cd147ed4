//! The conformance kit against the file backend: every client a separate `FileLock` on
//! one temporary directory, as separate processes on one host would be.

use std::sync::Arc;

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, Harness};
use distlock_file::FileLock;

struct FileHarness {
    dir: tempfile::TempDir,
}

#[async_trait]
impl Harness for FileHarness {
    fn name(&self) -> String {
        format!("file://{}", self.dir.path().display())
    }

    async fn client(&self) -> Result<Client, LockError> {
        let lock = FileLock::open(self.dir.path())?;
        Ok(Client::new(lock.client()))
    }
}

distlock_conformance::conformance_tests!(async {
    let dir = tempfile::tempdir().expect("temp dir");
    Arc::new(FileHarness { dir }) as Arc<dyn Harness>
});
