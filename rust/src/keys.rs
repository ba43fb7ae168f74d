//! API keys on the gateway's request path: the keyed hash a key is stored under, and
//! the table from those hashes to whatever the caller keeps per key.
//!
//! The hash is `BLAKE2b-256` in its keyed mode, exactly `hashlib.blake2b(key,
//! key=hash_key, digest_size=32)` (`llmgw.secrets.keys.key_hash`), so the control plane's
//! stored hashes are looked up as they are. Keyed `BLAKE2b` compresses the hash key,
//! padded to a block, before the message: that block is compressed once per table, and
//! a lookup copies the state after it and compresses only the key's own block. (The
//! `Blake2bMac` wrapper keeps the hash key's block buffered until the message comes,
//! so it compressed both on every lookup.)

use std::collections::HashMap;
use std::fmt;

use blake2::digest::core_api::{Block, Buffer, UpdateCore, VariableOutputCore};
use blake2::digest::Output;
use blake2::Blake2bVarCore;

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
    /// BLAKE2b-256's state once the hash key's block is compressed.
    keyed: Blake2bVarCore,
    /// Its state before, and the hash key's block: for an empty message, where that block
    /// is the last and is compressed as such.
    unkeyed: Blake2bVarCore,
    key_block: Option<Block<Blake2bVarCore>>,
    /// `aHash` rather than `SipHash`: its keys are keyed hashes already, which no client can
    /// aim at a bucket without the hash key.
    by_hash: HashMap<KeyHash, V, ahash::RandomState>,
    skipped: usize,
}

/// The longest hash key `BLAKE2b` takes (its parameter block has room for 64 bytes).
const MAX_HASH_KEY: usize = 64;

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
        if hash_key.len() > MAX_HASH_KEY {
            return Err(HashKeyLength(hash_key.len()));
        }
        let unkeyed = Blake2bVarCore::new_with_params(&[], &[], hash_key.len(), 32);
        let mut keyed = unkeyed.clone();
        let key_block = (!hash_key.is_empty()).then(|| {
            let mut block = Block::<Blake2bVarCore>::default();
            block[..hash_key.len()].copy_from_slice(hash_key);
            keyed.update_blocks(&[block]);
            block
        });
        let mut by_hash = HashMap::with_hasher(ahash::RandomState::new());
        let mut skipped = 0;
        for (hex, value) in entries {
            match parse_hex(&hex) {
                Some(hash) => {
                    by_hash.insert(hash, value);
                }
                None => skipped += 1,
            }
        }
        Ok(Self { keyed, unkeyed, key_block, by_hash, skipped })
    }

    /// Entries left out because their hash was not 64 hexadecimal digits.
    #[must_use]
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// The keyed hash of `key`.
    #[must_use]
    pub fn hash(&self, key: &str) -> KeyHash {
        let mut buffer = Buffer::<Blake2bVarCore>::default();
        let mut core;
        match self.key_block {
            Some(block) if key.is_empty() => {
                core = self.unkeyed.clone();
                buffer.digest_blocks(&block, |_| {});
            }
            _ => {
                core = self.keyed.clone();
                // Lazy: every block but the last is compressed here; the last one at
                // finalizing, flagged as the last (no message at all is one block of zeros).
                buffer.digest_blocks(key.as_bytes(), |blocks| core.update_blocks(blocks));
            }
        }
        let mut full = Output::<Blake2bVarCore>::default();
        core.finalize_variable_core(&mut buffer, &mut full);
        let mut out = [0u8; 32];
        out.copy_from_slice(&full[..32]);
        out
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
    fn hashes_keys_of_any_length_as_the_keyed_mac_does() {
        use blake2::digest::consts::U32;
        use blake2::digest::{Digest, KeyInit, Mac};
        use blake2::{Blake2b, Blake2bMac};

        for hash_key in [&[7u8; 32][..], &[1u8; 64], &[9u8; 1], &[]] {
            let table = KeyTable::<u8>::new(hash_key, []).ok().unwrap_or_else(|| unreachable!());
            for len in [0, 1, 49, 127, 128, 129, 256, 300] {
                let key = "k".repeat(len);
                let want: KeyHash = if hash_key.is_empty() {
                    // hashlib's blake2b with key=b"" is the unkeyed hash (the MAC wrapper
                    // would hash a block of zeros first).
                    Blake2b::<U32>::digest(key.as_bytes()).into()
                } else {
                    let mut mac = <Blake2bMac<U32> as KeyInit>::new_from_slice(hash_key)
                        .unwrap_or_else(|_| unreachable!());
                    mac.update(key.as_bytes());
                    mac.finalize().into_bytes().into()
                };
                assert_eq!(table.hash(&key), want, "hash key {} bytes, key {len} bytes", hash_key.len());
            }
        }
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
