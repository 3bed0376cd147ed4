//! Redis Cluster hash slots, and the one fencing counter each slot gets.
//!
//! A mutex grant's fencing token is the next value of its slot's counter (see
//! [`crate::KeyNames::fence`]): one counter per slot rises for every key of the slot
//! at once, so tokens rise per key, and the counter lives in the key's slot, so on a
//! Cluster it is on the lock's node and moves with the slot. The counter's name needs
//! a hash tag that hashes to that slot: the shortest decimal number that does, found
//! once per process for all 16384 slots.

use std::sync::LazyLock;

/// Slots of a Redis Cluster (a single server has them all too: names are hashed the
/// same way whatever the deployment, so one layout serves every topology).
pub(crate) const SLOTS: usize = 16384;

/// The suffix of a slot counter's name, after its hash tag.
pub(crate) const FENCE_SUFFIX: &str = ":distlock-fence";

/// CRC16/XMODEM, the checksum Redis Cluster hashes names with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `name`, by Redis Cluster's rule: the part between the first `{` and
/// the first `}` after it when that is not empty, else the whole name.
pub(crate) fn key_slot(name: &str) -> u16 {
    let bytes = name.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        match rest.iter().position(|&b| b == b'}') {
            Some(0) | None => None,
            Some(len) => Some(&rest[..len]),
        }
    });
    crc16(tagged.unwrap_or(bytes)) % SLOTS as u16
}

/// For each slot, the smallest number whose decimal form hashes to it.
static TAGS: LazyLock<Vec<u32>> = LazyLock::new(|| {
    let mut tags = vec![u32::MAX; SLOTS];
    let mut missing = SLOTS;
    let mut n: u32 = 0;
    while missing > 0 {
        let slot = usize::from(crc16(n.to_string().as_bytes()) % SLOTS as u16);
        if tags[slot] == u32::MAX {
            tags[slot] = n;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

/// The name of the fencing counter of the slot `name` hashes to:
/// `{<n>}:distlock-fence`, `n` the smallest number hashing to that slot.
pub(crate) fn fence_of(name: &str) -> String {
    let tag = TAGS[usize::from(key_slot(name))];
    ["{", &tag.to_string(), "}", FENCE_SUFFIX].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_match_redis() {
        // The check value of CRC16/XMODEM, and slots Redis's CLUSTER KEYSLOT gives.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("{}x"), key_slot("{}x"));
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn every_slot_has_a_counter_in_it() {
        for slot in 0..SLOTS {
            let tag = TAGS[slot];
            assert_eq!(usize::from(key_slot(&tag.to_string())), slot);
        }
        for name in ["{orders/42}", "{\0x}}x}", "{k}", "{a}b}"] {
            let fence = fence_of(name);
            assert_eq!(key_slot(&fence), key_slot(name), "{name:?}");
            assert!(fence.ends_with(FENCE_SUFFIX));
        }
    }
}
