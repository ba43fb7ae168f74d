//! llmgw's own block keys: a chained hash of each block's token ids.
//!
//! The index keys blocks by these rather than by the engine's hashes so that a
//! change to vLLM's hash algorithm (sha256, `builtin`, cbor...) or to its seed
//! (`PYTHONHASHSEED`) cannot break routing: every engine reports the token ids,
//! and the gateway computes the same keys for a prompt without asking anyone.
//!
//! The function is part of llmgw's contract: keys computed by one process or
//! version must equal those of another (a test pins known values). It is built
//! on the folded 64x64->128 multiply of wyhash and foldhash, on the token ids
//! read as little-endian u32 words:
//!
//! ```text
//! content(t) = len(t) * K0  +  sum over 4-token chunks i of
//!              fold(w0(i) ^ s(i), w1(i) ^ s(i).rotl(32) ^ K5)
//!      where   w0 = t[4i] | t[4i+1] << 32,  w1 = t[4i+2] | t[4i+3] << 32
//!              (a short last chunk is padded with zeros; the length tells it apart)
//!              s(i) = K[i % 4] + i * K4
//! key(parent, t) = parent * K6 + content(t)        (mod 2^64; K6 is odd)
//! root(seed, lora, salt) = fold(fold(seed ^ K0, tag(lora) ^ K1), lora ^ K2)
//!      then, with a salt, fold(root ^ K3, salt ^ K4)
//! fold(a, b)     = low64(a * b) ^ high64(a * b)
//! ```
//!
//! Why this shape: `content` of a block does not depend on its parent, so the
//! CPU overlaps the multiplies of the next block with the chain step of this
//! one, and hashing runs at the rate of the content multiplies. The chain step
//! is a polynomial (Horner) step, one 64-bit multiply and an add: 4 cycles of
//! latency per block against about 6 for the folded multiply it replaced
//! (`fold(parent ^ K6, content ^ K7)`), which was the critical path; a 512-block
//! prompt went from 1.9 to 1.5-1.7 µs on the 2-core bench machine.
//!
//! Collisions. The step is a bijection of the parent for a fixed block (K6 is
//! odd, so invertible mod 2^64) and of the block's content for a fixed parent.
//! So two prompts that agree up to a block and differ in the content hash of
//! exactly one block never share a key at or after it: the difference of their
//! keys is `d * K6^m`, never 0 for `d != 0`. Several differing blocks collide
//! only when their content hashes satisfy one linear relation mod 2^64, which
//! for the folded-multiply content hashes of unrelated blocks is a 2^-64 event;
//! `content` itself is the wyhash-style fold of 64-bit words with per-position
//! secrets. It is not a cryptographic hash: a client who crafts colliding
//! prompts only changes where its own requests are routed.

/// Secrets: the first 64-bit words of the fractional part of pi (wyhash's style
/// of "nothing up my sleeve" constants). Never change them: keys are stable.
const K: [u64; 8] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
    0x4528_21e6_38d0_1377,
    0xbe54_66cf_34e9_0c6c,
    0xc0ac_29b7_c97c_50dd,
    0x3f84_d5b5_b547_0917,
];

/// The 64x64->128 multiply folded back to 64 bits.
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Hash of one block's token ids, independent of its position in the chain.
#[inline]
#[must_use]
pub fn content(tokens: &[u32]) -> u64 {
    // The common block size.
    if let Ok(t) = <&[u32; 16]>::try_from(tokens) {
        return content16(t);
    }
    content_loop(tokens)
}

/// `content` for any length (the 16-token path must agree with it).
pub(crate) fn content_loop(tokens: &[u32]) -> u64 {
    let mut acc = (tokens.len() as u64).wrapping_mul(K[0]);
    let mut chunks = tokens.chunks_exact(4);
    let mut i: u64 = 0;
    for c in &mut chunks {
        acc = acc.wrapping_add(chunk(i, c[0], c[1], c[2], c[3]));
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let t = |j: usize| rest.get(j).copied().unwrap_or(0);
        acc = acc.wrapping_add(chunk(i, t(0), t(1), t(2), t(3)));
    }
    acc
}

#[inline]
fn chunk(i: u64, t0: u32, t1: u32, t2: u32, t3: u32) -> u64 {
    let s = K[(i & 3) as usize].wrapping_add(i.wrapping_mul(K[4]));
    let w0 = u64::from(t0) | (u64::from(t1) << 32);
    let w1 = u64::from(t2) | (u64::from(t3) << 32);
    fold(w0 ^ s, w1 ^ s.rotate_left(32) ^ K[5])
}

/// The key of a block whose parent has key `parent` (or the root): one
/// polynomial step, see the module's notes.
#[inline]
#[must_use]
pub fn chain(parent: u64, content: u64) -> u64 {
    parent.wrapping_mul(K[6]).wrapping_add(content)
}

/// Appends to `out` the keys of `tokens`' full blocks of `bs` tokens, chained
/// from `parent`; returns the last key (`parent` when there is no full block).
///
/// One loop with `content` inlined: the CPU then overlaps one block's content
/// multiplies with the previous block's chain step. Calling `content` per
/// block (it was not inlined) and pushing through a struct field kept 512
/// blocks at about 2.5 µs, twice this.
#[inline]
pub fn extend_keys(parent: u64, tokens: &[u32], bs: usize, out: &mut Vec<u64>) -> u64 {
    // `extend` over an exact-size iterator writes the keys without a capacity
    // check or a store of the length per block.
    let mut k = parent;
    if bs == 16 {
        out.extend(tokens.chunks_exact(16).map(|b| {
            let c = <&[u32; 16]>::try_from(b).map_or_else(|_| content_loop(b), content16);
            k = chain(k, c);
            k
        }));
    } else if bs > 0 {
        out.extend(tokens.chunks_exact(bs).map(|b| {
            k = chain(k, content(b));
            k
        }));
    }
    k
}

/// `content` of a 16-token block, unrolled so that every secret is a constant.
#[inline]
fn content16(t: &[u32; 16]) -> u64 {
    let mut acc = 16u64.wrapping_mul(K[0]);
    for i in 0..4 {
        let j = 4 * i;
        acc = acc.wrapping_add(chunk(i as u64, t[j], t[j + 1], t[j + 2], t[j + 3]));
    }
    acc
}

/// The key the first block of a sequence chains onto: one per seed, `LoRA`
/// adapter and (`SGLang`) cache salt, so that their blocks never match each other.
#[must_use]
pub fn root(seed: u64, lora_id: Option<i64>, salt: Option<u64>) -> u64 {
    let (tag, lora) = match lora_id {
        // The bit pattern of the id; the tag keeps `None` apart from any id.
        Some(id) => (1, u64::from_ne_bytes(id.to_ne_bytes())),
        None => (0, 0),
    };
    let r = fold(fold(seed ^ K[0], tag ^ K[1]), lora ^ K[2]);
    match salt {
        Some(s) => fold(r ^ K[3], s ^ K[4]),
        None => r,
    }
}

/// A 64-bit id for an opaque byte string (engine hashes sent as bytes, salts).
#[must_use]
pub fn bytes(b: &[u8]) -> u64 {
    let mut acc = (b.len() as u64).wrapping_mul(K[1]);
    for (i, c) in b.chunks(16).enumerate() {
        let mut w = [0u8; 16];
        w[..c.len()].copy_from_slice(c);
        let lo = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        let hi = u64::from_le_bytes([w[8], w[9], w[10], w[11], w[12], w[13], w[14], w[15]]);
        let s = K[i & 3].wrapping_add((i as u64).wrapping_mul(K[4]));
        acc = fold(acc ^ lo ^ s, hi ^ K[5]);
    }
    acc
}

/// Spreads an engine hash over the table: engines may send small or patterned
/// integers (Python's `hash()` of small tuples, test ids), which would pile up
/// in a table that trusts the low bits.
#[inline]
#[must_use]
pub fn spread(x: u64) -> u64 {
    fold(x ^ K[2], K[3])
}
