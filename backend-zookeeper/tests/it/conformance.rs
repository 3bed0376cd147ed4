//! The whole conformance kit against a real standalone ZooKeeper server (shared by
//! every scenario of this binary).

use crate::common;

/// Each client behind its own fault proxy, with a 2 s session, so the crash scenarios
/// run too.
mod standalone {
    distlock_conformance::conformance_tests!(super::common::harness());
}

/// Each client a plain `ZooKeeperLock::connect(url)` with the default settings, as the
/// `distlock conformance --backend zookeeper://…` runner makes them (no fault hooks).
mod by_url {
    distlock_conformance::conformance_tests!(super::common::url_harness());
}
