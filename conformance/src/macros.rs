//! [`conformance_tests!`](crate::conformance_tests): one `#[tokio::test]` per scenario.

/// Generates one `#[tokio::test]` per scenario of the kit, for any backend.
///
/// The argument is an expression evaluating to a future of `Arc<dyn Harness>`; it is
/// evaluated afresh in every test. A test fails with the scenario's reason when the
/// scenario fails, and passes, printing why, when it is skipped by a capability.
///
/// ```no_run
/// use std::sync::Arc;
/// use distlock_conformance::{Harness, MemoryHarness};
///
/// // In a test file of your backend's crate, with your own harness in place of this one:
/// distlock_conformance::conformance_tests!(async {
///     Arc::new(MemoryHarness::new()) as Arc<dyn Harness>
/// });
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_tests!($harness;
            mutual_exclusion_under_contention,
            try_acquire_on_held_key_returns_held,
            release_by_non_owner_is_refused,
            late_release_after_expiry_keeps_new_holder,
            release_racing_expiry_keeps_new_holder,
            late_extend_after_expiry_fails_as_lost,
            fencing_token_iff_fencing_supported,
            fencing_tokens_strictly_increase,
            fenced_store_rejects_stale_holder,
            different_keys_are_independent,
            release_frees_key_at_once,
            inspect_reports_held_then_free,
            waiter_acquires_promptly_after_release,
            waiters_are_granted_in_arrival_order,
            wait_timeout_is_honoured,
            crashed_holder_frees_within_lease,
            abandoned_waiter_does_not_delay_the_next,
            cancelled_acquire_leaks_nothing,
            dropped_guard_frees_quickly,
            unrenewed_lease_expires_after_ttl,
            extend_pushes_expiry_out,
            auto_renew_holds_past_five_ttls,
            auto_renew_stops_at_max_hold,
            contended_reports_a_wait_on_a_held_key,
            lost_fires_when_lease_lost,
            lost_fires_when_renewal_fails,
            bad_keys_are_typed_errors,
            bad_options_are_typed_errors,
            zero_and_enormous_waits,
            release_twice_is_a_typed_outcome,
            invalid_urls_are_config_errors,
            semaphore_grants_exactly_max,
            semaphore_never_admits_more_than_max,
            semaphore_dropped_permit_is_freed,
            semaphore_crashed_holder_is_freed,
            semaphore_cancelled_acquire_leaks_nothing,
            semaphore_bad_counts_are_typed_errors,
            rw_readers_overlap,
            rw_reader_and_writer_never_overlap,
            rw_waiting_writer_is_not_starved,
            rw_cancelled_acquire_leaks_nothing,
            rw_bad_options_are_typed_errors,
            election_one_leader_at_a_time,
            election_leader_reads_identity_and_term,
            election_resign_hands_over_promptly,
            election_crashed_leader_is_replaced_within_lease,
            election_observer_sees_changes_in_order,
            election_cancelled_campaign_leaves_nothing,
            election_lost_fires_by_deadline,
            election_bad_input_is_typed,
            every_primitive_keeps_its_fifo_claim,
            every_primitive_keeps_its_fencing_claim,
            every_primitive_keeps_its_extend_claim,
            multi_key_overlapping_sets_never_deadlock,
            multi_key_timeout_leaves_nothing_held,
            multi_key_lost_part_fires_lost,
            scheduled_firings_run_once_under_skew,
            scheduled_firing_of_a_dead_runner_waits_at_most_for,
            unoffered_primitives_are_refused,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($harness:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::run_scenario_test(stringify!($name), $harness.await).await;
            }
        )+

        #[test]
        fn every_scenario_has_a_test() {
            let generated = [$(stringify!($name)),+];
            let listed: Vec<&str> = $crate::SCENARIOS.iter().map(|s| s.name).collect();
            assert_eq!(generated.as_slice(), listed.as_slice());
        }
    };
}
