//! Server-sent event framing: where an event ends and what its data lines say.
//!
//! Lines end in `\r\n`, `\n` or `\r` (the SSE spec allows all three); an event
//! ends with a blank line.

use std::borrow::Cow;
use std::ops::Range;

use memchr::memchr2;

/// Where the search for the end of the current event resumes, so that a long
/// event arriving in many chunks is scanned once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scan {
    /// Offset from the start of the event.
    pos: usize,
    /// True when `pos` is at the start of a line.
    line_start: bool,
}

impl Default for Scan {
    fn default() -> Self {
        Self {
            pos: 0,
            line_start: true,
        }
    }
}

/// Returns the length of the event at the start of `buf`, its blank line
/// included, or None when `buf` holds no complete event yet.
///
/// `scan` must be `Scan::default()` for a new event and be kept between calls
/// while the same event grows.
pub fn event_end(buf: &[u8], scan: &mut Scan) -> Option<usize> {
    loop {
        let rest = buf.get(scan.pos..)?;
        let Some(off) = memchr2(b'\r', b'\n', rest) else {
            if !rest.is_empty() {
                scan.line_start = false;
            }
            scan.pos = buf.len();
            return None;
        };
        let at = scan.pos + off;
        let blank = scan.line_start && off == 0;
        let len = if buf.get(at) == Some(&b'\n') {
            1
        } else {
            match buf.get(at + 1) {
                Some(b'\n') => 2,
                Some(_) => 1,
                // A blank line's lone `\r` ends the event now: waiting for a
                // possible `\n` would hold back every event of a `\r\r` stream.
                // A `\n` that follows then reads as an empty event of its own.
                None if blank => 1,
                // A `\r` ending a text line may be the first half of `\r\n`.
                None => {
                    scan.pos = at;
                    scan.line_start = false;
                    return None;
                }
            }
        };
        if blank {
            return Some(at + len);
        }
        scan.pos = at + len;
        scan.line_start = true;
    }
}

/// The lines of an event without their terminators, each with its offset.
pub struct Lines<'a> {
    ev: &'a [u8],
    pos: usize,
}

/// Splits an event (or an unterminated tail) into lines.
#[must_use]
pub fn lines(ev: &[u8]) -> Lines<'_> {
    Lines { ev, pos: 0 }
}

impl<'a> Iterator for Lines<'a> {
    type Item = (usize, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let start = self.pos;
        let rest = self.ev.get(start..).filter(|r| !r.is_empty())?;
        if let Some(off) = memchr2(b'\r', b'\n', rest) {
            let crlf = rest.get(off..off + 2) == Some(b"\r\n");
            self.pos = start + off + if crlf { 2 } else { 1 };
            Some((start, &rest[..off]))
        } else {
            self.pos = self.ev.len();
            Some((start, rest))
        }
    }
}

/// The data of one event: its `data:` lines joined with `\n`.
#[derive(Debug)]
pub struct Data<'a> {
    payload: Cow<'a, [u8]>,
    /// Offset of the payload in the event when there is one data line.
    at: usize,
    /// For several data lines: (offset in payload, offset in event, length).
    pieces: Vec<(usize, usize, usize)>,
}

impl Data<'_> {
    /// The joined payload.
    #[must_use]
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Maps a range of the payload back to the event, when it lies within one line.
    #[must_use]
    pub fn to_event(&self, r: &Range<usize>) -> Option<Range<usize>> {
        if self.pieces.is_empty() {
            return (r.end <= self.payload.len()).then(|| (r.start + self.at)..(r.end + self.at));
        }
        self.pieces
            .iter()
            .find(|&&(p, _, len)| p <= r.start && r.end <= p + len)
            .map(|&(p, e, _)| (r.start - p + e)..(r.end - p + e))
    }
}

/// Collects the data lines of an event; None when it has none.
#[must_use]
pub fn data(ev: &[u8]) -> Option<Data<'_>> {
    let mut first: Option<(usize, &[u8])> = None;
    let mut joined: Option<Data<'_>> = None;
    for (at, line) in lines(ev) {
        let Some((off, value)) = data_value(line) else {
            continue;
        };
        let at = at + off;
        if let Some(d) = joined.as_mut() {
            let buf = d.payload.to_mut();
            buf.push(b'\n');
            d.pieces.push((buf.len(), at, value.len()));
            buf.extend_from_slice(value);
        } else if let Some((first_at, first_value)) = first.take() {
            // Several data lines are rare; only they pay for a copy.
            let mut buf = first_value.to_vec();
            buf.push(b'\n');
            let pieces = vec![
                (0, first_at, first_value.len()),
                (buf.len(), at, value.len()),
            ];
            buf.extend_from_slice(value);
            joined = Some(Data {
                payload: Cow::Owned(buf),
                at: first_at,
                pieces,
            });
        } else {
            first = Some((at, value));
        }
    }
    joined.or_else(|| {
        first.map(|(at, value)| Data {
            payload: Cow::Borrowed(value),
            at,
            pieces: Vec::new(),
        })
    })
}

/// The value of a `data` field line and its offset in the line.
fn data_value(line: &[u8]) -> Option<(usize, &[u8])> {
    let rest = line.strip_prefix(b"data")?;
    match rest.first() {
        None => Some((4, rest)),
        Some(b':') => match rest.get(1) {
            Some(b' ') => Some((6, &rest[2..])),
            _ => Some((5, &rest[1..])),
        },
        // `dataX: ...` is another field.
        Some(_) => None,
    }
}
