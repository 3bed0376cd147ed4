//! The whole conformance kit against a real MariaDB server: with short session
//! timeouts and crashable clients, and with the default settings as the CLI runs it.

use crate::common;

mod crashable {
    distlock_conformance::conformance_tests!(super::common::harness());
}

mod defaults {
    distlock_conformance::conformance_tests!(super::common::default_harness());
}
