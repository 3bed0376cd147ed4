//! Riding out a run of retryable errors in place, so that a waiter keeps its place in
//! the queue through a member going away or a leader election.

use std::time::Duration;

use distlock_api::LockError;
use tokio::time::Instant;

/// The first pause after an error; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// The longest pause between two looks.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// A waiter's run of retryable errors, ridden out for at most the options' error
/// patience from its first error (an answer ends the run), as the caller's retries
/// are; past that, the error ends the acquire's attempt.
pub(super) struct Interruptions {
    patience: Duration,
    since: Option<Instant>,
    pause: Duration,
}

impl Interruptions {
    /// No error yet; `patience` is the options' error patience.
    pub(super) fn new(patience: Duration) -> Self {
        Interruptions {
            patience,
            since: None,
            pause: FIRST_PAUSE,
        }
    }

    /// etcd answered: the run of errors is over.
    pub(super) fn answered(&mut self) {
        self.since = None;
        self.pause = FIRST_PAUSE;
    }

    /// Pauses before the next look after `error`, or returns it when it is not
    /// retryable or the patience is spent.
    pub(super) async fn ride_out(&mut self, error: LockError) -> Result<(), LockError> {
        if !error.is_retryable() {
            return Err(error);
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        let left = self.patience.saturating_sub(since.elapsed());
        if left.is_zero() {
            return Err(error);
        }
        tracing::debug!(%error, "etcd wait interrupted; looking again");
        tokio::time::sleep(self.pause.min(left)).await;
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn errors_are_ridden_out_for_the_patience_then_returned() {
        let outage = || LockError::connection("etcd", "unavailable");
        let mut run = Interruptions::new(Duration::from_secs(2));
        let started = Instant::now();
        while run.ride_out(outage()).await.is_ok() {}
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        run.answered();
        assert!(
            run.ride_out(outage()).await.is_ok(),
            "an answer ends the run"
        );
        let refused = LockError::config("etcd", "bad credentials");
        assert!(run.ride_out(refused).await.is_err());
        let mut impatient = Interruptions::new(Duration::ZERO);
        assert!(impatient.ride_out(outage()).await.is_err());
    }
}
