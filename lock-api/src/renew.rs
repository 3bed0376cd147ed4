//! The renewal watchdog behind [`crate::AutoRenew`].

use std::sync::Arc;

use tokio::time::{sleep, Instant};
use tracing::Instrument as _;

use crate::lease_backend::LeaseBackend;
use crate::{AutoRenew, ExtendOutcome, Lease, LeaseMonitor, LeaseState, MIN_TTL};

/// Extends `lease` every interval until the task is aborted (on release or drop), the
/// lease is lost, or `max_hold` runs out. Failed renewals mark the lease suspect and are
/// retried at a shorter period until the validity deadline, which then marks it lost.
pub(crate) async fn renew_until_stopped(
    backend: Arc<dyn LeaseBackend>,
    lease: Lease,
    monitor: LeaseMonitor,
    policy: AutoRenew,
) {
    let name = backend.name();
    let ttl = lease.ttl();
    let interval = policy.interval_for(ttl);
    let hold_until = policy
        .max_hold
        .and_then(|max| lease.acquired_at().checked_add(max));
    let mut pause = interval;
    loop {
        sleep(pause).await;
        if monitor.state() == LeaseState::Lost {
            return;
        }
        let now = Instant::now();
        let extension = match hold_until {
            Some(cap) => ttl.min(cap.saturating_duration_since(now)),
            None => ttl,
        };
        if extension < MIN_TTL {
            tracing::debug!(key = %lease.key(), "max hold time reached; renewal stops");
            return;
        }
        let turn = monitor.renewal_turn().await;
        let span = tracing::debug_span!("renew", backend = name, key = %lease.key(), extension = ?extension);
        let outcome = backend.extend(&lease, extension).instrument(span).await;
        drop(turn);
        crate::metrics::renewal(name, matches!(outcome, Ok(ExtendOutcome::Extended { .. })));
        match outcome {
            Ok(ExtendOutcome::Extended { valid_until }) => {
                if !monitor.apply_renewal(valid_until) {
                    tracing::warn!(key = %lease.key(), "renewal landed after the lease ran out; lock lost");
                    let _ = backend.release(&lease).await;
                    return;
                }
                pause = interval;
            }
            Ok(outcome) => {
                tracing::warn!(key = %lease.key(), ?outcome, "renewal refused; lock lost");
                monitor.set_lost();
                return;
            }
            Err(error) if !error.is_retryable() => {
                // Retrying cannot fix it (the backend refused for good): the lease will
                // not be renewed, so say so now rather than at its deadline.
                tracing::warn!(key = %lease.key(), %error, "renewal failed for good; lock lost");
                monitor.set_lost();
                return;
            }
            Err(error) => {
                monitor.mark_suspect();
                if Instant::now() >= monitor.valid_until() {
                    tracing::warn!(key = %lease.key(), %error, "renewals failed until the lease ran out; lock lost");
                    monitor.set_lost();
                    return;
                }
                tracing::warn!(key = %lease.key(), %error, "renewal failed; lease suspect, retrying");
                pause = (interval / 3).max(MIN_TTL);
            }
        }
    }
}
