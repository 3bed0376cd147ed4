//! [`MemoryHarness`]: the kit's harness for the in-memory reference backend.

use std::sync::Arc;

use async_trait::async_trait;
use distlock_api::memory::MemoryStore;
use distlock_api::{LockError, MemoryLock};

use crate::{Client, ClientFaults, Harness, UrlConnector};

/// Clients of one shared [`MemoryStore`], each crashable.
#[derive(Clone)]
pub struct MemoryHarness {
    store: Arc<MemoryStore>,
    url_connector: Option<UrlConnector>,
}

impl Default for MemoryHarness {
    fn default() -> Self {
        MemoryHarness::with_store(MemoryStore::new())
    }
}

impl MemoryHarness {
    /// A harness over a fresh store.
    pub fn new() -> Self {
        MemoryHarness::default()
    }

    /// A harness over `store` (for example `MemoryStore::named`, which `memory://` uses).
    pub fn with_store(store: Arc<MemoryStore>) -> Self {
        MemoryHarness {
            store,
            url_connector: None,
        }
    }

    /// Lets the URL scenarios run through `connector`.
    pub fn with_url_connector(mut self, connector: UrlConnector) -> Self {
        self.url_connector = Some(connector);
        self
    }
}

struct CrashMemoryClient(MemoryLock);

#[async_trait]
impl ClientFaults for CrashMemoryClient {
    async fn crash(&self) -> Result<(), LockError> {
        self.0.simulate_crash();
        Ok(())
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    fn name(&self) -> String {
        "memory".to_owned()
    }

    async fn client(&self) -> Result<Client, LockError> {
        let lock = MemoryLock::with_store(self.store.clone());
        Ok(Client::new(lock.client()).with_faults(Arc::new(CrashMemoryClient(lock))))
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        self.url_connector.clone()
    }
}
