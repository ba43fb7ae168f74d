//! A cursor over msgpack bytes: just what event decoding needs, read in place.

use rmp::Marker;

use super::decode::DecodeError;
use super::hash;

/// Deepest nesting of values that `skip` follows; msgspec never nests unknown
/// fields this deep, and a bound keeps a hostile payload off the stack.
const MAX_DEPTH: u32 = 32;

/// A cursor over a msgpack byte slice; rmp classifies the markers.
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn err(&self, what: &'static str) -> DecodeError {
        DecodeError { what, at: self.pos }
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| self.err("truncated payload"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(super) fn marker(&mut self) -> Result<Marker, DecodeError> {
        let b = self.peek().ok_or_else(|| self.err("truncated payload"))?;
        self.pos += 1;
        Ok(Marker::from_u8(b))
    }

    pub(super) fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn be16(&mut self) -> Result<u16, DecodeError> {
        self.be().map(u16::from_be_bytes)
    }

    pub(super) fn be32(&mut self) -> Result<u32, DecodeError> {
        self.be().map(u32::from_be_bytes)
    }

    pub(super) fn be64(&mut self) -> Result<u64, DecodeError> {
        self.be().map(u64::from_be_bytes)
    }

    pub(super) fn array_len(&mut self) -> Result<u32, DecodeError> {
        let m = self.marker()?;
        self.array_len_after(m)
    }

    pub(super) fn array_len_after(&mut self, m: Marker) -> Result<u32, DecodeError> {
        match m {
            Marker::FixArray(n) => Ok(u32::from(n)),
            Marker::Array16 => self.be16().map(u32::from),
            Marker::Array32 => self.be32(),
            _ => Err(self.err("expected an array")),
        }
    }

    /// Any integer, as its 64-bit two's-complement pattern plus whether it was negative.
    pub(super) fn int_bits(&mut self, m: Marker) -> Result<(u64, bool), DecodeError> {
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
    pub(super) fn uint(&mut self) -> Result<u32, DecodeError> {
        // Token ids come in msgpack's shortest form (msgspec, `SGLang`), and
        // with a 150k vocabulary most take 3 or 5 bytes: read those four forms
        // in place. Going through `Marker` and `int_bits` for them was a fifth
        // of ingest time.
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let (v, n) = match *rest {
            [b @ 0..=0x7f, ..] => (u32::from(b), 1),
            [0xcc, b, ..] => (u32::from(b), 2),
            [0xcd, a, b, ..] => (u32::from(u16::from_be_bytes([a, b])), 3),
            [0xce, a, b, c, d, ..] => (u32::from_be_bytes([a, b, c, d]), 5),
            _ => return self.uint_slow(),
        };
        self.pos += n;
        Ok(v)
    }

    fn uint_slow(&mut self) -> Result<u32, DecodeError> {
        let m = self.marker()?;
        match self.int_bits(m)? {
            (v, false) => u32::try_from(v).map_err(|_| self.err("integer out of u32 range")),
            (_, true) => Err(self.err("negative integer where an id was expected")),
        }
    }

    pub(super) fn opt_uint(&mut self) -> Result<Option<u32>, DecodeError> {
        if self.peek() == Some(0xc0) {
            self.pos += 1;
            return Ok(None);
        }
        self.uint().map(Some)
    }

    pub(super) fn opt_int(&mut self) -> Result<Option<i64>, DecodeError> {
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
    pub(super) fn engine_hash(&mut self) -> Result<u64, DecodeError> {
        // vLLM's 64-bit hashes are almost all 9-byte u64 or i64: in place.
        if let [0xcf | 0xd3, a, b, c, d, e, f, g, h, ..] =
            *self.buf.get(self.pos..).unwrap_or_default()
        {
            self.pos += 9;
            return Ok(u64::from_be_bytes([a, b, c, d, e, f, g, h]));
        }
        let m = self.marker()?;
        match self.bytes_after(m)? {
            Some(b) => Ok(hash::bytes(b)),
            None => self.int_bits(m).map(|(v, _)| v),
        }
    }

    pub(super) fn opt_engine_hash(&mut self) -> Result<Option<u64>, DecodeError> {
        if self.peek() == Some(0xc0) {
            self.pos += 1;
            return Ok(None);
        }
        self.engine_hash().map(Some)
    }

    /// The body of a str or bin value, or `None` when `m` is neither.
    pub(super) fn bytes_after(&mut self, m: Marker) -> Result<Option<&'a [u8]>, DecodeError> {
        let n = match m {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 | Marker::Bin8 => usize::from(self.be::<1>()?[0]),
            Marker::Str16 | Marker::Bin16 => usize::from(self.be16()?),
            Marker::Str32 | Marker::Bin32 => self.be32()? as usize,
            _ => return Ok(None),
        };
        self.take(n).map(Some)
    }

    pub(super) fn str(&mut self) -> Result<&'a [u8], DecodeError> {
        let m = self.marker()?;
        self.bytes_after(m)?
            .ok_or_else(|| self.err("expected a string"))
    }

    pub(super) fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        let m = self.marker()?;
        if m == Marker::Null {
            return Ok(None);
        }
        self.bytes_after(m)?
            .map(Some)
            .ok_or_else(|| self.err("expected a string or bytes"))
    }

    /// A float or an integer (the timestamp).
    pub(super) fn number(&mut self) -> Result<f64, DecodeError> {
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
    pub(super) fn skip(&mut self, depth: u32) -> Result<(), DecodeError> {
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
