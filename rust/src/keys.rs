//! API keys on the gateway's request path: the keyed hash a key is stored under, and
//! the table from those hashes to whatever the caller keeps per key.
//!
//! The hash is `BLAKE2b-256` in its keyed mode, exactly `hashlib.blake2b(key,
//! key=hash_key, digest_size=32)` (`llmgw.secrets.key_hash`), so the control plane's
//! stored hashes are looked up as they are. The state after the hash key's block is
//! made once per table and cloned per lookup.

use std::collections::HashMap;
use std::fmt;

use blake2::digest::consts::U32;
use blake2::digest::{KeyInit, Mac};
use blake2::Blake2bMac;

/// A keyed hash: 32 bytes.
pub type KeyHash = [u8; 32];

/// `BLAKE2b` takes a hash key of at most 64 bytes: this one had the length given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashKeyLength(pub usize);

impl fmt::Display for HashKeyLength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the key-hash key is {} bytes; BLAKE2b takes at most 64", self.0)
    }
}

/// Keyed hashes of API keys -> `V`.
pub struct KeyTable<V> {
    keyed: Blake2bMac<U32>,
    by_hash: HashMap<KeyHash, V>,
    skipped: usize,
}

impl<V> KeyTable<V> {
    /// A table of `(hex hash, value)` pairs under `hash_key`. A pair whose hash is not 64
    /// hexadecimal digits can match no key: it is left out and counted (`skipped`), so one
    /// bad row does not cost every other key its table.
    ///
    /// # Errors
    /// A hash key of more than 64 bytes.
    pub fn new(
        hash_key: &[u8],
        entries: impl IntoIterator<Item = (String, V)>,
    ) -> Result<Self, HashKeyLength> {
        let keyed = <Blake2bMac<U32> as KeyInit>::new_from_slice(hash_key)
            .map_err(|_| HashKeyLength(hash_key.len()))?;
        let mut by_hash = HashMap::new();
        let mut skipped = 0;
        for (hex, value) in entries {
            match parse_hex(&hex) {
                Some(hash) => {
                    by_hash.insert(hash, value);
                }
                None => skipped += 1,
            }
        }
        Ok(Self { keyed, by_hash, skipped })
    }

    /// Entries left out because their hash was not 64 hexadecimal digits.
    #[must_use]
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// The keyed hash of `key`.
    #[must_use]
    pub fn hash(&self, key: &str) -> KeyHash {
        let mut mac = self.keyed.clone();
        mac.update(key.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The value stored under `key`'s hash.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&V> {
        self.by_hash.get(&self.hash(key))
    }

    /// How many hashes the table holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether it holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

fn parse_hex(hex: &str) -> Option<KeyHash> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // From Python: hashlib.blake2b(b"sk-llmgw-abc", key=bytes([7] * 32), digest_size=32).hexdigest()
    const KNOWN: &str = "07d8678717dcb385214f4a756313ffa8b5d43fa6fa175c37576d614eac46cea3";

    #[test]
    fn hashes_as_pythons_keyed_blake2b_and_finds_the_entry() {
        let table = KeyTable::new(&[7u8; 32], [(KNOWN.to_owned(), 1), ("ab".repeat(32), 2)]);
        let table = table.ok().unwrap_or_else(|| unreachable!());
        assert_eq!(table.get("sk-llmgw-abc"), Some(&1));
        assert_eq!(table.get("sk-llmgw-abd"), None);
        // The cloned state is not used up by a lookup.
        assert_eq!(table.get("sk-llmgw-abc"), Some(&1));
        assert_eq!(table.len(), 2);
        let upper = KeyTable::new(&[7u8; 32], [(KNOWN.to_uppercase(), 1)]);
        assert_eq!(upper.map(|t| t.get("sk-llmgw-abc").copied()), Ok(Some(1)));
    }

    #[test]
    fn leaves_out_what_is_not_a_hash_and_refuses_a_long_hash_key() {
        let bad = ["", "ab", &"g".repeat(64), &"a".repeat(63), &"a".repeat(65), "é".repeat(32).as_str()]
            .map(|h| (h.to_owned(), 0));
        let table = KeyTable::new(&[7u8; 32], bad.into_iter().chain([(KNOWN.to_owned(), 1)]));
        let got = table.map(|t| (t.len(), t.skipped(), t.get("sk-llmgw-abc").copied()));
        assert_eq!(got, Ok((1, 6, Some(1))));
        let got = KeyTable::<u8>::new(&[0u8; 65], []).map(|t| t.len());
        assert_eq!(got, Err(HashKeyLength(65)));
    }
}
