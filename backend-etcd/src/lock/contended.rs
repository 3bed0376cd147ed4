//! Which keys this client last had to wait for: a hint that the next acquire of one
//! will wait too (see [`super::EtcdLock::contend`]).

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// How many ranges are remembered; past it they are all forgotten at once (a
/// forgotten key only loses the hint).
const REMEMBERED: usize = 4096;

/// The ranges (a key's, for one primitive) whose last acquire by this client waited.
#[derive(Debug, Default)]
pub(super) struct Contended(Mutex<HashSet<String>>);

impl Contended {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the last acquire of `range` found it held.
    pub(super) fn expects(&self, range: &str) -> bool {
        self.set().contains(range)
    }

    /// Records whether an acquire of `range` found it held.
    pub(super) fn record(&self, range: &str, held: bool) {
        let mut set = self.set();
        if !held {
            set.remove(range);
        } else if !set.contains(range) {
            if set.len() >= REMEMBERED {
                set.clear();
            }
            set.insert(range.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_held_ranges_until_one_is_found_free() {
        let contended = Contended::default();
        assert!(!contended.expects("a/"));
        contended.record("a/", true);
        contended.record("a/", true);
        assert!(contended.expects("a/"));
        contended.record("a/", false);
        assert!(!contended.expects("a/"));
        for i in 0..=REMEMBERED {
            contended.record(&format!("k{i}/"), true);
        }
        assert!(contended.set().len() <= REMEMBERED);
        assert!(contended.expects(&format!("k{REMEMBERED}/")));
    }
}
