//! The whole conformance kit against the transaction-pooling design
//! (`?pool_mode=transaction`) through a real PgBouncer in transaction mode: with short
//! session timeouts and crashable clients, and with the default settings.

use crate::pooler;

mod crashable {
    distlock_conformance::conformance_tests!(async {
        std::sync::Arc::new(super::pooler::XactHarness::crashable())
            as std::sync::Arc<dyn distlock_conformance::Harness>
    });
}

mod defaults {
    distlock_conformance::conformance_tests!(async {
        std::sync::Arc::new(super::pooler::XactHarness::defaults())
            as std::sync::Arc<dyn distlock_conformance::Harness>
    });
}
