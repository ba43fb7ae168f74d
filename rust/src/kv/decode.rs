//! Decoding of vLLM's (and `SGLang`'s) KV-event batches from msgpack.
//!
//! The payload is `[ts, [event...], data_parallel_rank?]`; each event is either
//! a map with a `"type"` key (vLLM after PR #42892, `SGLang`) or a positional
//! array with the tag first (older vLLM, shorter still in the first releases).
//! Values are read straight from the byte slice into reusable buffers: no value
//! tree is built, so a batch costs no allocation once the buffers have grown.

use rmp::Marker;

use super::hash;
use super::msgpack::Reader;

/// Why a payload could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// What was wrong, as a short lowercase phrase.
    pub what: &'static str,
    /// Byte offset in the payload where it was noticed.
    pub at: usize,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kv event batch: {} at byte {}", self.what, self.at)
    }
}

impl std::error::Error for DecodeError {}

/// A run of items in one of the batch's shared buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// First item.
    pub start: u32,
    /// One past the last item.
    pub end: u32,
}

impl Span {
    /// The items of `buf` this span covers.
    #[must_use]
    pub fn of<T>(self, buf: &[T]) -> &[T] {
        buf.get(self.start as usize..self.end as usize)
            .unwrap_or_default()
    }
}

/// One decoded event; block hashes and token ids live in the `Batch` buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Full blocks were stored; `tokens` holds `block_size` ids per hash.
    Stored {
        /// Engine hashes of the blocks, in chain order.
        hashes: Span,
        /// Engine hash of the block the first one chains onto; `None` = root.
        parent: Option<u64>,
        /// All the blocks' token ids, concatenated.
        tokens: Span,
        /// Tokens per block.
        block_size: u32,
        /// The `LoRA` adapter the blocks were computed with.
        lora_id: Option<i64>,
        /// `SGLang`'s `cache_salt`, hashed: salted blocks only match salted requests.
        salt: Option<u64>,
        /// vLLM's KV-cache group (hybrid models), when sent.
        group: Option<u32>,
        /// False when `kv_cache_spec_kind` says the group is not full attention.
        full_attention: bool,
    },
    /// Blocks were evicted (by engine hash).
    Removed {
        /// Engine hashes of the blocks.
        hashes: Span,
        /// vLLM's KV-cache group (hybrid models), when sent.
        group: Option<u32>,
    },
    /// The engine dropped its whole cache.
    Cleared,
    /// An event type this version does not know (counted, then ignored).
    Unknown,
}

/// A decoded batch; reuse one across calls to keep its buffers.
#[derive(Debug, Default)]
pub struct Batch {
    /// The publisher's timestamp.
    pub ts: f64,
    /// `data_parallel_rank`, when the batch carries one.
    pub dp_rank: Option<i64>,
    /// The events, in order.
    pub events: Vec<Event>,
    /// Engine hashes referenced by the events' spans.
    pub hashes: Vec<u64>,
    /// Token ids referenced by the events' spans.
    pub tokens: Vec<u32>,
}

impl Batch {
    /// Decodes `payload` into this batch, replacing what it held.
    ///
    /// # Errors
    /// When the payload is not a well-formed event batch; the batch is then
    /// left in an unspecified (but valid) state.
    pub fn decode(&mut self, payload: &[u8]) -> Result<(), DecodeError> {
        self.events.clear();
        self.hashes.clear();
        self.tokens.clear();
        self.dp_rank = None;
        let mut r = Reader {
            buf: payload,
            pos: 0,
        };
        let n = r.array_len()?;
        if n < 2 {
            return Err(r.err("batch array shorter than [ts, events]"));
        }
        self.ts = r.number()?;
        let events = r.array_len()?;
        for _ in 0..events {
            let ev = self.event(&mut r)?;
            self.events.push(ev);
        }
        if n >= 3 {
            self.dp_rank = r.opt_int()?;
        }
        for _ in 3..n {
            r.skip(0)?;
        }
        if r.pos != payload.len() {
            return Err(r.err("trailing bytes after the batch"));
        }
        Ok(())
    }

    fn event(&mut self, r: &mut Reader<'_>) -> Result<Event, DecodeError> {
        match r.marker()? {
            Marker::FixMap(n) => self.map_event(r, u32::from(n)),
            Marker::Map16 => {
                let n = r.be16()?;
                self.map_event(r, u32::from(n))
            }
            Marker::Map32 => {
                let n = r.be32()?;
                self.map_event(r, n)
            }
            m => {
                let n = r.array_len_after(m)?;
                self.array_event(r, n)
            }
        }
    }

    /// `{"type": "BlockStored", "block_hashes": [...], ...}`, keys in any order.
    fn map_event(&mut self, r: &mut Reader<'_>, n: u32) -> Result<Event, DecodeError> {
        let mut f = Fields::default();
        let mut kind = None;
        for _ in 0..n {
            let key = r.str()?;
            match key {
                b"type" => kind = Some(Kind::of(r.str()?)),
                b"block_hashes" => f.hashes = Some(self.hash_list(r)?),
                b"parent_block_hash" => f.parent = r.opt_engine_hash()?,
                b"token_ids" => f.tokens = Some(self.token_list(r)?),
                b"block_size" => f.block_size = Some(r.uint()?),
                b"lora_id" => f.lora_id = r.opt_int()?,
                b"cache_salt" => f.salt = r.opt_bytes()?.map(hash::bytes),
                b"group_idx" => f.group = r.opt_uint()?,
                b"kv_cache_spec_kind" => f.spec_kind(r.opt_bytes()?),
                _ => r.skip(0)?,
            }
        }
        let kind = kind.ok_or_else(|| r.err("map event without \"type\""))?;
        f.into_event(kind, r)
    }

    /// `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
    /// lora_id, medium, lora_name, extra_keys, ...]` and the shorter forms.
    fn array_event(&mut self, r: &mut Reader<'_>, n: u32) -> Result<Event, DecodeError> {
        if n == 0 {
            return Err(r.err("empty event array"));
        }
        let kind = Kind::of(r.str()?);
        let mut f = Fields::default();
        for i in 1..n {
            match (kind, i) {
                (Kind::Stored | Kind::Removed, 1) => f.hashes = Some(self.hash_list(r)?),
                (Kind::Stored, 2) => f.parent = r.opt_engine_hash()?,
                (Kind::Stored, 3) => f.tokens = Some(self.token_list(r)?),
                (Kind::Stored, 4) => f.block_size = Some(r.uint()?),
                (Kind::Stored, 5) => f.lora_id = r.opt_int()?,
                (Kind::Stored, 9) | (Kind::Removed, 3) => f.group = r.opt_uint()?,
                (Kind::Stored, 10) => f.spec_kind(r.opt_bytes()?),
                _ => r.skip(0)?,
            }
        }
        f.into_event(kind, r)
    }

    fn hash_list(&mut self, r: &mut Reader<'_>) -> Result<Span, DecodeError> {
        let n = r.array_len()?;
        let start = span_index(self.hashes.len(), r)?;
        self.hashes.reserve(n as usize);
        for _ in 0..n {
            let h = r.engine_hash()?;
            self.hashes.push(h);
        }
        Ok(Span {
            start,
            end: span_index(self.hashes.len(), r)?,
        })
    }

    fn token_list(&mut self, r: &mut Reader<'_>) -> Result<Span, DecodeError> {
        let n = r.array_len()?;
        let start = span_index(self.tokens.len(), r)?;
        self.tokens.reserve(n as usize);
        // `uint`'s short forms, inlined here with a local cursor: the general
        // call per token (it writes `r.pos` back each time) was a tenth of
        // ingest. Anything else falls back to it.
        let mut at = r.pos;
        for _ in 0..n {
            let rest = r.buf.get(at..).unwrap_or_default();
            let (token, len) = match *rest {
                // u16 and u32 ids are about equally common with a large
                // vocabulary, so a branch on which one mispredicted every
                // other token: read four bytes and pick without one.
                [tag @ (0xcd | 0xce), b0, b1, b2, b3, ..] => {
                    let w = u32::from_be_bytes([b0, b1, b2, b3]);
                    let wide = tag == 0xce;
                    (if wide { w } else { w >> 16 }, if wide { 5 } else { 3 })
                }
                [b0 @ 0..=0x7f, ..] => (u32::from(b0), 1),
                [0xcd, b0, b1, ..] => (u32::from(u16::from_be_bytes([b0, b1])), 3),
                _ => {
                    r.pos = at;
                    let token = r.uint()?;
                    (token, r.pos - at)
                }
            };
            at += len;
            self.tokens.push(token);
        }
        r.pos = at;
        Ok(Span {
            start,
            end: span_index(self.tokens.len(), r)?,
        })
    }
}

fn span_index(len: usize, r: &Reader<'_>) -> Result<u32, DecodeError> {
    u32::try_from(len).map_err(|_| r.err("batch too large"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
    Unknown,
}

impl Kind {
    fn of(tag: &[u8]) -> Self {
        match tag {
            b"BlockStored" => Self::Stored,
            b"BlockRemoved" => Self::Removed,
            b"AllBlocksCleared" => Self::Cleared,
            _ => Self::Unknown,
        }
    }
}

/// The fields an event may carry, whichever encoding brought them.
#[derive(Default)]
struct Fields {
    hashes: Option<Span>,
    parent: Option<u64>,
    tokens: Option<Span>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    salt: Option<u64>,
    group: Option<u32>,
    not_full: bool,
}

impl Fields {
    fn spec_kind(&mut self, kind: Option<&[u8]>) {
        self.not_full = kind.is_some_and(|k| k != b"full_attention");
    }

    fn into_event(self, kind: Kind, r: &Reader<'_>) -> Result<Event, DecodeError> {
        Ok(match kind {
            Kind::Stored => Event::Stored {
                hashes: self
                    .hashes
                    .ok_or_else(|| r.err("BlockStored without block_hashes"))?,
                parent: self.parent,
                tokens: self
                    .tokens
                    .ok_or_else(|| r.err("BlockStored without token_ids"))?,
                block_size: self
                    .block_size
                    .ok_or_else(|| r.err("BlockStored without block_size"))?,
                lora_id: self.lora_id,
                salt: self.salt,
                group: self.group,
                full_attention: !self.not_full,
            },
            Kind::Removed => Event::Removed {
                hashes: self
                    .hashes
                    .ok_or_else(|| r.err("BlockRemoved without block_hashes"))?,
                group: self.group,
            },
            Kind::Cleared => Event::Cleared,
            Kind::Unknown => Event::Unknown,
        })
    }
}
