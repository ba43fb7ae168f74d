//! The stream tap: relays an upstream SSE body and extracts what it reports.
//!
//! Bytes are relayed as received; the only changes are dropping the usage-only
//! chunk (when asked) and splicing a renamed `model` value into a frame. Only
//! complete events are released, so a frame is always changed whole.

pub mod json;
pub mod sse;

#[cfg(test)]
mod tests;

use std::ops::Range;

pub use json::{inspect, splice, Answer, Rename, Usage};

/// What the stream reported so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Data events with a JSON object payload (`[DONE]` not counted).
    pub chunks: u64,
    /// Events that carried generated output.
    pub content_chunks: u64,
    /// True once `data: [DONE]` was seen.
    pub done: bool,
    /// The last non-null `finish_reason`.
    pub finish_reason: Option<String>,
    /// Token counts of the last `usage` object.
    pub usage: Usage,
    /// The message of the last error event.
    pub error: Option<String>,
}

impl Summary {
    /// True once an event carried generated output.
    #[must_use]
    pub fn has_token(&self) -> bool {
        self.content_chunks > 0
    }

    fn record(&mut self, frame: &json::Frame<'_>) {
        self.chunks += 1;
        if let Some(c) = &frame.choices {
            if let Some(reason) = c.finish_reason.as_deref() {
                if self.finish_reason.as_deref() != Some(reason) {
                    self.finish_reason = Some(reason.to_owned());
                }
            }
            if c.output {
                self.content_chunks += 1;
            }
        }
        if let Some(u) = frame.usage {
            self.usage = u;
        }
        if frame.error.is_some() {
            self.error = frame.error_message();
        }
    }
}

/// What to do with one event.
enum Action {
    Keep,
    Drop,
    /// Replace this range of the event with the alias.
    Rename(Range<usize>),
}

/// A piece of output: a range of the source, or the alias.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Span {
    Src(Range<usize>),
    Alias,
}

/// The bytes one call releases, described without copying them.
pub struct Out<'a> {
    src: &'a [u8],
    spans: &'a [Span],
    alias: &'a [u8],
    whole: bool,
}

impl Out<'_> {
    /// True when the output is exactly the chunk that was fed.
    #[must_use]
    pub fn is_whole(&self) -> bool {
        self.whole
    }

    /// The output length.
    pub fn len(&self) -> usize {
        self.pieces().map(<[u8]>::len).sum()
    }

    /// True when nothing is released.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the output into `dst`, which must be `len()` bytes long.
    pub fn write_to(&self, dst: &mut [u8]) {
        let mut at = 0;
        for piece in self.pieces() {
            if let Some(d) = dst.get_mut(at..at + piece.len()) {
                d.copy_from_slice(piece);
            }
            at += piece.len();
        }
    }

    /// The output as a vector.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        self.pieces().collect::<Vec<_>>().concat()
    }

    fn pieces(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.spans.iter().map(|s| match s {
            Span::Src(r) => self.src.get(r.clone()).unwrap_or_default(),
            Span::Alias => self.alias,
        })
    }
}

/// Relays one SSE body; see the module doc.
#[derive(Debug, Default)]
pub struct Tap {
    strip_usage: bool,
    rename: Option<Rename>,
    summary: Summary,
    /// The incomplete event held back.
    buf: Vec<u8>,
    scan: sse::Scan,
    /// A dropped event ended the last chunk with a lone `\r`: a `\n` starting
    /// the next one completes its `\r\n` and is dropped with it.
    skip_lf: bool,
    /// Reused between calls to spare an allocation per chunk.
    spans: Vec<Span>,
}

impl Tap {
    /// A tap that drops the usage-only chunk when `strip_usage` and renames the
    /// model `from` into `to` when `rename` is `Some((from, to))`.
    #[must_use]
    pub fn new(strip_usage: bool, rename: Option<(&str, &str)>) -> Self {
        Self {
            strip_usage,
            rename: rename
                .filter(|(from, to)| from != to)
                .map(|(from, to)| Rename::new(from, to)),
            ..Self::default()
        }
    }

    /// What the stream reported so far.
    #[must_use]
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// Bytes of an incomplete event held back. The caller bounds it: an
    /// upstream that never ends an event would otherwise grow it without end.
    #[must_use]
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Consumes one chunk and hands what to send now to `emit`.
    pub fn feed<R>(&mut self, chunk: &[u8], emit: impl FnOnce(Out<'_>) -> R) -> R {
        let mut spans = std::mem::take(&mut self.spans);
        spans.clear();
        let skip =
            !chunk.is_empty() && std::mem::take(&mut self.skip_lf) && chunk.first() == Some(&b'\n');
        let chunk = if skip {
            chunk.get(1..).unwrap_or_default()
        } else {
            chunk
        };
        let r = if self.buf.is_empty() {
            let (used, changed) = relay(self, chunk, &mut spans);
            let whole = !skip && !changed && used == chunk.len();
            let alias = self.rename.as_ref().map_or(&[][..], Rename::to_json);
            let r = emit(Out {
                src: chunk,
                spans: &spans,
                alias,
                whole,
            });
            self.buf
                .extend_from_slice(chunk.get(used..).unwrap_or_default());
            r
        } else {
            let mut buf = std::mem::take(&mut self.buf);
            buf.extend_from_slice(chunk);
            let (used, _) = relay(self, &buf, &mut spans);
            let alias = self.rename.as_ref().map_or(&[][..], Rename::to_json);
            let r = emit(Out {
                src: &buf,
                spans: &spans,
                alias,
                whole: false,
            });
            buf.drain(..used);
            self.buf = buf;
            r
        };
        self.spans = spans;
        r
    }

    /// Hands the held-back tail (an unterminated last event) to `emit` and
    /// empties the buffer; the tail is processed like any event.
    pub fn finish<R>(&mut self, emit: impl FnOnce(Out<'_>) -> R) -> R {
        let mut spans = std::mem::take(&mut self.spans);
        spans.clear();
        let mut tail = std::mem::take(&mut self.buf);
        if !tail.is_empty() {
            match self.event(&tail) {
                Action::Keep => spans.push(Span::Src(0..tail.len())),
                Action::Drop => {}
                Action::Rename(r) => {
                    spans.extend([
                        Span::Src(0..r.start),
                        Span::Alias,
                        Span::Src(r.end..tail.len()),
                    ]);
                }
            }
        }
        let alias = self.rename.as_ref().map_or(&[][..], Rename::to_json);
        let r = emit(Out {
            src: &tail,
            spans: &spans,
            alias,
            whole: false,
        });
        tail.clear();
        self.buf = tail;
        self.scan = sse::Scan::default();
        self.skip_lf = false;
        self.spans = spans;
        r
    }

    /// Records what one event reports and decides what to do with it.
    fn event(&mut self, ev: &[u8]) -> Action {
        let Some(data) = sse::data(ev) else {
            return Action::Keep;
        };
        let payload = data.payload();
        if payload.trim_ascii() == b"[DONE]" {
            self.summary.done = true;
            return Action::Keep;
        }
        let Some(frame) = json::parse(payload) else {
            return Action::Keep;
        };
        self.summary.record(&frame);
        if self.strip_usage && frame.is_usage_only() {
            return Action::Drop;
        }
        self.rename
            .as_ref()
            .and_then(|r| r.span(payload, &frame))
            .and_then(|r| data.to_event(&r))
            .map_or(Action::Keep, Action::Rename)
    }
}

/// Processes the complete events at the start of `src`, describing the output
/// in `spans`; returns how many bytes they took and whether any changed.
fn relay(tap: &mut Tap, src: &[u8], spans: &mut Vec<Span>) -> (usize, bool) {
    let mut start = 0;
    let mut run = 0;
    let mut changed = false;
    let mut scan = tap.scan;
    while let Some(len) = sse::event_end(src.get(start..).unwrap_or_default(), &mut scan) {
        let end = start + len;
        match tap.event(src.get(start..end).unwrap_or_default()) {
            Action::Keep => {}
            Action::Drop => {
                push(spans, run..start);
                run = end;
                changed = true;
                tap.skip_lf = end == src.len() && src.last() == Some(&b'\r');
            }
            Action::Rename(r) => {
                push(spans, run..start + r.start);
                spans.push(Span::Alias);
                run = start + r.end;
                changed = true;
            }
        }
        start = end;
        scan = sse::Scan::default();
    }
    push(spans, run..start);
    tap.scan = scan;
    (start, changed)
}

fn push(spans: &mut Vec<Span>, r: Range<usize>) {
    if !r.is_empty() {
        spans.push(Span::Src(r));
    }
}
