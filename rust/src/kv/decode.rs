//! Decoding of vLLM's (and `SGLang`'s) KV-event batches from msgpack.
//!
//! The payload is `[ts, [event...], data_parallel_rank?]`; each event is either
//! a map with a `"type"` key (vLLM after PR #42892, `SGLang`) or a positional
//! array with the tag first (older vLLM, shorter still in the first releases).
//! Values are read straight from the byte slice into reusable buffers: no value
//! tree is built, so a batch costs no allocation once the buffers have grown.

use rmp::Marker;

use super::hash;

/// Deepest nesting of values that `skip` follows; msgspec never nests unknown
/// fields this deep, and a bound keeps a hostile payload off the stack.
const MAX_DEPTH: u32 = 32;

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
        let mut r = Reader { buf: payload, pos: 0 };
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
        Ok(Span { start, end: span_index(self.hashes.len(), r)? })
    }

    fn token_list(&mut self, r: &mut Reader<'_>) -> Result<Span, DecodeError> {
        let n = r.array_len()?;
        let start = span_index(self.tokens.len(), r)?;
        self.tokens.reserve(n as usize);
        for _ in 0..n {
            let t = r.uint()?;
            self.tokens.push(t);
        }
        Ok(Span { start, end: span_index(self.tokens.len(), r)? })
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
                hashes: self.hashes.ok_or_else(|| r.err("BlockStored without block_hashes"))?,
                parent: self.parent,
                tokens: self.tokens.ok_or_else(|| r.err("BlockStored without token_ids"))?,
                block_size: self
                    .block_size
                    .ok_or_else(|| r.err("BlockStored without block_size"))?,
                lora_id: self.lora_id,
                salt: self.salt,
                group: self.group,
                full_attention: !self.not_full,
            },
            Kind::Removed => Event::Removed {
                hashes: self.hashes.ok_or_else(|| r.err("BlockRemoved without block_hashes"))?,
                group: self.group,
            },
            Kind::Cleared => Event::Cleared,
            Kind::Unknown => Event::Unknown,
        })
    }
}

/// A cursor over a msgpack byte slice; rmp classifies the markers.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, what: &'static str) -> DecodeError {
        DecodeError { what, at: self.pos }
    }

    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| self.err("truncated payload"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn marker(&mut self) -> Result<Marker, DecodeError> {
        let b = self.peek().ok_or_else(|| self.err("truncated payload"))?;
        self.pos += 1;
        Ok(Marker::from_u8(b))
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn be16(&mut self) -> Result<u16, DecodeError> {
        self.be().map(u16::from_be_bytes)
    }

    fn be32(&mut self) -> Result<u32, DecodeError> {
        self.be().map(u32::from_be_bytes)
    }

    fn be64(&mut self) -> Result<u64, DecodeError> {
        self.be().map(u64::from_be_bytes)
    }

    fn array_len(&mut self) -> Result<u32, DecodeError> {
        let m = self.marker()?;
        self.array_len_after(m)
    }

    fn array_len_after(&mut self, m: Marker) -> Result<u32, DecodeError> {
        match m {
            Marker::FixArray(n) => Ok(u32::from(n)),
            Marker::Array16 => self.be16().map(u32::from),
            Marker::Array32 => self.be32(),
            _ => Err(self.err("expected an array")),
        }
    }

    /// Any integer, as its 64-bit two's-complement pattern plus whether it was negative.
    fn int_bits(&mut self, m: Marker) -> Result<(u64, bool), DecodeError> {
        let neg = |v: i64| (u64::from_ne_bytes(v.to_ne_bytes()), v < 0);
        Ok(match m {
            Marker::FixPos(v) => (u64::from(v), false),
            Marker::FixNeg(v) => neg(i64::from(v)),
            Marker::U8 => (u64::from(self.be::<1>()?[0]), false),
            Marker::U16 => (u64::from(self.be16()?), false),
            Marker::U32 => (u64::from(self.be32()?), false),
            Marker::U64 => (self.be64()?, false),
            Marker::I8 => neg(i64::from(i8::from_be_bytes(self.be()?))),
            Marker::I16 => neg(i64::from(i16::from_be_bytes(self.be()?))),
            Marker::I32 => neg(i64::from(i32::from_be_bytes(self.be()?))),
            Marker::I64 => neg(i64::from_be_bytes(self.be()?)),
            _ => return Err(self.err("expected an integer")),
        })
    }

    /// A non-negative integer that fits in u32 (token ids, block sizes).
    fn uint(&mut self) -> Result<u32, DecodeError> {
        // Token ids are almost always positive fixints or u16/u32: the fast path.
        if let Some(b @ 0..=0x7f) = self.peek() {
            self.pos += 1;
            return Ok(u32::from(b));
        }
        let m = self.marker()?;
        match self.int_bits(m)? {
            (v, false) => u32::try_from(v).map_err(|_| self.err("integer out of u32 range")),
            (_, true) => Err(self.err("negative integer where an id was expected")),
        }
    }

    fn opt_uint(&mut self) -> Result<Option<u32>, DecodeError> {
        if self.peek() == Some(0xc0) {
            self.pos += 1;
            return Ok(None);
        }
        self.uint().map(Some)
    }

    fn opt_int(&mut self) -> Result<Option<i64>, DecodeError> {
        let m = self.marker()?;
        if m == Marker::Null {
            return Ok(None);
        }
        match self.int_bits(m)? {
            (v, true) => Ok(Some(i64::from_ne_bytes(v.to_ne_bytes()))),
            (v, false) => i64::try_from(v)
                .map(Some)
                .map_err(|_| self.err("integer out of i64 range")),
        }
    }

    /// An engine block hash: an integer of either sign (its bit pattern) or
    /// bytes / a string (hashed to 64 bits). Engines differ; all are opaque ids.
    fn engine_hash(&mut self) -> Result<u64, DecodeError> {
        let m = self.marker()?;
        match self.bytes_after(m)? {
            Some(b) => Ok(hash::bytes(b)),
            None => self.int_bits(m).map(|(v, _)| v),
        }
    }

    fn opt_engine_hash(&mut self) -> Result<Option<u64>, DecodeError> {
        if self.peek() == Some(0xc0) {
            self.pos += 1;
            return Ok(None);
        }
        self.engine_hash().map(Some)
    }

    /// The body of a str or bin value, or `None` when `m` is neither.
    fn bytes_after(&mut self, m: Marker) -> Result<Option<&'a [u8]>, DecodeError> {
        let n = match m {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 | Marker::Bin8 => usize::from(self.be::<1>()?[0]),
            Marker::Str16 | Marker::Bin16 => usize::from(self.be16()?),
            Marker::Str32 | Marker::Bin32 => self.be32()? as usize,
            _ => return Ok(None),
        };
        self.take(n).map(Some)
    }

    fn str(&mut self) -> Result<&'a [u8], DecodeError> {
        let m = self.marker()?;
        self.bytes_after(m)?
            .ok_or_else(|| self.err("expected a string"))
    }

    fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        let m = self.marker()?;
        if m == Marker::Null {
            return Ok(None);
        }
        self.bytes_after(m)?
            .map(Some)
            .ok_or_else(|| self.err("expected a string or bytes"))
    }

    /// A float or an integer (the timestamp).
    fn number(&mut self) -> Result<f64, DecodeError> {
        match self.marker()? {
            Marker::F64 => Ok(f64::from_bits(self.be64()?)),
            Marker::F32 => Ok(f64::from(f32::from_bits(self.be32()?))),
            m => {
                let (v, neg) = self.int_bits(m)?;
                let v = if neg {
                    i64::from_ne_bytes(v.to_ne_bytes()) as f64
                } else {
                    v as f64
                };
                Ok(v)
            }
        }
    }

    /// Steps over one value of any type.
    fn skip(&mut self, depth: u32) -> Result<(), DecodeError> {
        if depth > MAX_DEPTH {
            return Err(self.err("values nested too deep"));
        }
        let m = self.marker()?;
        if self.bytes_after(m)?.is_some() {
            return Ok(());
        }
        let (items, n) = match m {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                return Ok(())
            }
            Marker::U8 | Marker::I8 => (0, 1),
            Marker::U16 | Marker::I16 | Marker::FixExt1 => (0, 2),
            Marker::U32 | Marker::I32 | Marker::F32 => (0, 4),
            Marker::U64 | Marker::I64 | Marker::F64 => (0, 8),
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                (u64::from(self.array_len_after(m)?), 0)
            }
            Marker::FixMap(n) => (2 * u64::from(n), 0),
            Marker::Map16 => (2 * u64::from(self.be16()?), 0),
            Marker::Map32 => (2 * u64::from(self.be32()?), 0),
            Marker::FixExt2 => (0, 3),
            Marker::FixExt4 => (0, 5),
            Marker::FixExt8 => (0, 9),
            Marker::FixExt16 => (0, 17),
            Marker::Ext8 => (0, 1 + usize::from(self.be::<1>()?[0])),
            Marker::Ext16 => (0, 1 + usize::from(self.be16()?)),
            Marker::Ext32 => (0, 1 + self.be32()? as usize),
            _ => return Err(self.err("reserved msgpack marker")),
        };
        self.take(n)?;
        for _ in 0..items {
            self.skip(depth + 1)?;
        }
        Ok(())
    }
}
