//! The whole conformance kit against a real single redis-server and a 3-node Redlock.

use crate::common;

mod single_node {
    distlock_conformance::conformance_tests!(super::common::harness(1));
}

mod redlock {
    distlock_conformance::conformance_tests!(super::common::harness(3));
}
