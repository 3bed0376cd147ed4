//! Replica acknowledgement (`min_replicas`): a `WAIT` sent in one pipeline after each
//! write that grants or extends, and the typed error of too few acknowledgements.
//!
//! `WAIT` counts the replicas that acknowledged every write of the connection it is
//! sent on, so it must follow the write on the same connection: a pipeline does that
//! whatever the deployment (a reconnect in between would lose the write's offset, and a
//! `WAIT` on a fresh connection answers at once). On a Cluster the pipeline goes to the
//! write's slot, since `WAIT` has no key of its own.

use std::fmt;
use std::time::Duration;

use distlock_api::LockError;
use redis::{Pipeline, Value};

use crate::REDIS_BACKEND;

/// How many replicas must acknowledge a write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    /// At least 1 (0 asks for nothing, and no `WAIT` is sent).
    pub(crate) replicas: u32,
    /// Above zero: `WAIT` with 0 would wait for ever.
    pub(crate) timeout: Duration,
}

impl ReplicaWait {
    /// Appends the `WAIT` to a pipeline whose writes it must cover.
    pub(crate) fn append(&self, pipe: &mut Pipeline) {
        let millis = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        pipe.cmd("WAIT").arg(self.replicas).arg(millis);
    }

    /// What the `WAIT` answered: `Ok(None)` when enough replicas acknowledged,
    /// `Ok(Some(error))` when too few did (the caller decides: a grant is released, an
    /// extend is not counted), `Err` for an error reply or an answer of another shape.
    pub(crate) fn shortfall(
        &self,
        address: &str,
        answer: &Value,
    ) -> Result<Option<LockError>, LockError> {
        match answer {
            Value::Int(acknowledged) => {
                let acknowledged = u64::try_from(*acknowledged).unwrap_or(0);
                if acknowledged >= u64::from(self.replicas) {
                    return Ok(None);
                }
                Ok(Some(LockError::transient(
                    REDIS_BACKEND,
                    TooFewReplicas {
                        address: address.to_owned(),
                        acknowledged,
                        required: self.replicas,
                        timeout: self.timeout,
                    },
                )))
            }
            Value::ServerError(error) => Err(crate::error::lock_error(
                address,
                redis::RedisError::from(error.clone()),
            )),
            _ => Err(LockError::backend_error(
                REDIS_BACKEND,
                format!("{address}: unexpected answer to WAIT"),
            )),
        }
    }
}

/// Fewer replicas acknowledged a grant, extend or leadership renewal within the
/// replica timeout than [`crate::RedisConfig::min_replicas`] asks for. It is the
/// source of a [`LockError::Transient`] (retryable: a replica may catch up or come
/// back): a grant was released before the error was returned, an extend was applied on
/// the master but is not counted (the lease keeps its earlier validity). Find it with
/// `std::error::Error::source` and `downcast_ref`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TooFewReplicas {
    /// The master, `host:port`.
    pub address: String,
    /// Replicas that acknowledged the write.
    pub acknowledged: u64,
    /// Replicas required (`min_replicas`).
    pub required: u32,
    /// How long the master waited for them (`replica_timeout`).
    pub timeout: Duration,
}

impl fmt::Display for TooFewReplicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} of the {} replicas required (min_replicas) acknowledged the write within {} ms",
            self.address,
            self.acknowledged,
            self.required,
            self.timeout.as_millis()
        )
    }
}

impl std::error::Error for TooFewReplicas {}
