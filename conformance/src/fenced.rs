//! [`FencedStore`]: a resource that honours fencing tokens.

use std::sync::{Mutex, PoisonError};

use distlock_api::FencingToken;

/// A write refused because its token is below the highest one the store has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale write refused: token {token} is below the highest seen, {highest}")]
#[non_exhaustive]
pub struct StaleWrite {
    /// The refused write's token.
    pub token: FencingToken,
    /// The highest token accepted so far.
    pub highest: FencingToken,
}

/// A single value guarded by fencing tokens, like a storage service that checks them.
///
/// A write carrying a token lower than the highest accepted so far is refused; equal
/// tokens are accepted (the same holder writing twice).
#[derive(Debug, Default)]
pub struct FencedStore<T> {
    state: Mutex<(Option<FencingToken>, T)>,
}

impl<T: Clone> FencedStore<T> {
    /// A store holding `value`, having seen no token.
    pub fn new(value: T) -> Self {
        FencedStore {
            state: Mutex::new((None, value)),
        }
    }

    /// Writes `value` if `token` is not below the highest seen.
    ///
    /// # Errors
    /// [`StaleWrite`] otherwise; the value is unchanged.
    pub fn write(&self, token: FencingToken, value: T) -> Result<(), StaleWrite> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(highest) = state.0.filter(|h| token < *h) {
            return Err(StaleWrite { token, highest });
        }
        *state = (Some(token), value);
        Ok(())
    }

    /// The current value.
    pub fn read(&self) -> T {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }
}
