//! [`fault_conformance_tests!`](crate::fault_conformance_tests): one `#[tokio::test]`
//! per fault scenario.

/// Generates one `#[tokio::test]` per fault scenario of the kit, for any backend.
///
/// The first argument is an expression evaluating to a future of
/// `Arc<dyn FaultHarness>`, evaluated afresh in every test (so each scenario gets
/// fresh servers). `must_pass = [..]` names the scenarios that must pass on this
/// backend rather than skip. A test fails when its scenario fails (a violation of a
/// claimed guarantee, a hang, a panic) or when a `must_pass` scenario skips or only
/// shows violations (a skip because the servers' provider lacks an action, such as
/// pausing a container, is allowed); it passes, printing why, when the scenario skips or shows
/// violations the backend does not claim to prevent. The generated tests of one
/// test binary run one at a time: fault scenarios measure timing and would disturb
/// each other.
///
/// ```no_run
/// use std::sync::Arc;
/// use distlock_conformance::MemoryHarness;
/// use distlock_conformance_faults::FaultHarness;
///
/// // In a test file of your backend's crate, with your own harness in place of this one:
/// distlock_conformance_faults::fault_conformance_tests!(
///     async { Arc::new(MemoryHarness::new()) as Arc<dyn FaultHarness> },
///     must_pass = [paused_holder_wakes_to_a_refused_write]
/// );
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! fault_conformance_tests {
    ($harness:expr) => {
        $crate::fault_conformance_tests!($harness, must_pass = []);
    };
    ($harness:expr, must_pass = [$($must:ident),* $(,)?]) => {
        $crate::__fault_conformance_tests!($harness; [$(stringify!($must)),*];
            partitioned_holder_is_fenced_off,
            paused_holder_wakes_to_a_refused_write,
            paused_permit_holders_free_their_permits,
            paused_writer_frees_the_key_for_readers,
            paused_leader_wakes_to_a_refused_write,
            partitioned_leader_is_fenced_off,
            server_paused_during_acquire,
            server_paused_during_campaign,
            lost_reply_after_applied_acquire,
            lost_reply_after_applied_campaign,
            server_restart_while_held_and_waited,
            server_restart_while_leading_and_campaigning,
            redlock_minority_then_majority_loss,
            ensemble_leader_loss,
            election_through_ensemble_leader_loss,
            master_failover_while_held_and_waited,
            election_through_master_failover,
            terminated_session_fires_lost,
            terminated_leader_session_fires_lost,
            crashed_clients_do_not_stall_the_fifo_queue,
            contention_under_random_faults,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __fault_conformance_tests {
    ($harness:expr; $must:tt; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let _one_at_a_time = $crate::serial().await;
                let must_pass: &[&str] = &$must;
                $crate::run_fault_scenario_test(
                    stringify!($name),
                    $harness.await,
                    must_pass.contains(&stringify!($name)),
                )
                .await;
            }
        )+

        #[test]
        fn every_fault_scenario_has_a_test() {
            let generated = [$(stringify!($name)),+];
            let listed: Vec<&str> = $crate::FAULT_SCENARIOS.iter().map(|s| s.name).collect();
            assert_eq!(generated.as_slice(), listed.as_slice());
            let must_pass: &[&str] = &$must;
            for name in must_pass {
                assert!(listed.contains(name), "must_pass names no fault scenario: {name}");
            }
        }
    };
}
