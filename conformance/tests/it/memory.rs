//! The whole kit against the in-memory reference backend, one test per scenario.

use std::sync::Arc;

use distlock_conformance::{Harness, MemoryHarness};

distlock_conformance::conformance_tests!(async {
    Arc::new(MemoryHarness::new()) as Arc<dyn Harness>
});
