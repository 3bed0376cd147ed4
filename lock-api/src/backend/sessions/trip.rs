//! [`Trip`]: one statement's round trip, timed against the session's leases.

use std::future::Future;
use std::time::Duration;

use tokio::time::{sleep, timeout_at, Instant};

use super::leases::Leases;

/// The result of one round trip.
#[derive(Debug)]
pub enum Trip<T, E> {
    /// The server answered.
    Done(T),
    /// The server refused the statement; the session is fine.
    Refused(E),
    /// The session is unusable; the message says why.
    Broken(String),
}

impl<T, E> Trip<T, E> {
    /// The answer mapped by `f`; a refusal or a break as it is.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Trip<U, E> {
        match self {
            Trip::Done(value) => Trip::Done(f(value)),
            Trip::Refused(e) => Trip::Refused(e),
            Trip::Broken(why) => Trip::Broken(why),
        }
    }
}

impl<X> Leases<X> {
    /// Runs `statement` for at most `limit`: [`Trip::Broken`] if no answer comes in
    /// time, or its error ends the session (`ends_session`), else the answer or the
    /// refusal, either of which proves the session alive as of the start. While the
    /// reply is later than `suspect_after`, every held lease is marked suspect.
    pub async fn trip<T, E>(
        &mut self,
        suspect_after: Duration,
        limit: Duration,
        statement: impl Future<Output = Result<T, E>>,
        ends_session: impl FnOnce(&E) -> bool,
    ) -> Trip<T, E>
    where
        E: std::fmt::Display,
    {
        let started = Instant::now();
        let suspect_after = suspect_after.min(limit);
        let result = {
            tokio::pin!(statement);
            let early = tokio::select! {
                result = &mut statement => Some(result),
                _ = sleep(suspect_after) => None,
            };
            match early {
                Some(result) => result,
                None => {
                    self.suspect_all();
                    match timeout_at(started + limit, statement).await {
                        Ok(result) => result,
                        Err(_) => {
                            return Trip::Broken(format!(
                                "the server did not answer within {limit:?}"
                            ))
                        }
                    }
                }
            }
        };
        match result {
            Ok(value) => {
                self.note_proof(started);
                Trip::Done(value)
            }
            Err(e) if ends_session(&e) => Trip::Broken(format!("the session ended: {e}")),
            Err(e) => {
                // The server answered: the session is alive.
                self.note_proof(started);
                Trip::Refused(e)
            }
        }
    }
}
