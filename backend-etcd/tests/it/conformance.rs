//! The whole conformance kit against a real single-node etcd (shared by every scenario
//! of this binary), each client behind its own fault proxy.

use crate::common;

distlock_conformance::conformance_tests!(common::harness());
