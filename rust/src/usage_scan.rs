//! A gateway's usage post (`llmgw.protocol.wire.UsageBatch` as JSON) read on the control plane
//! without building a record per request.
//!
//! The ingest needs little of each finished request: its id (to count it once), when it
//! started, its tenancy and model, whether it failed and its two token counts (the
//! rollups), and the row itself, stored as posted. `scan` validates every row in one pass,
//! sums the rows by rollup group and keeps the posted array's bytes, so a batch of
//! thousands of rows costs the control plane a few objects, not thousands of Structs.
//!
//! It is sound, not complete: it accepts only rows that msgspec also decodes into
//! `UsageRow` (same types and bounds, well-formed JSON, no NUL or lone surrogate in a
//! string), and it declines anything else: kept bodies, object-shaped finals, unknown
//! keys, rows shorter than the gateway writes them. A declined post is decoded by msgspec
//! instead, which either takes it or answers the operator with its own words.

use std::borrow::Cow;

use ahash::{AHashMap, AHashSet};

/// Why a post was declined (for tests and logs; msgspec gives the operator's message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declined(pub &'static str);

type Res<T> = Result<T, Declined>;

/// Seconds in an hour, as the store's rollups bucket them.
const HOUR: f64 = 3600.0;
/// The bounds of `llmgw.protocol.wire`'s annotated numbers.
const TALLY_MAX: u64 = 1 << 53;
const INSTANT_MAX: f64 = 1e11;
const MILLIS_MAX: f64 = 1e12;
/// Fields of a row as a gateway writes it; the last two (bodies) may be left out.
const ROW_FIELDS: usize = 23;
const ROW_FIELDS_MIN: usize = 21;
/// Nesting allowed inside a row's route (the router writes two levels).
const MAX_DEPTH: usize = 64;

/// One rollup group's sums: requests, errors, prompt and completion tokens.
pub type Sums = [u64; 4];

/// (hour start in seconds, org, team, project, user, key, model); '' for a missing id.
pub type GroupKey<'a> = (i64, [Cow<'a, str>; 5], Cow<'a, str>);

/// What `scan` found in one post.
#[derive(Debug, Default)]
pub struct Scan<'a> {
    pub gateway_id: Cow<'a, str>,
    /// The `opens` value's bytes, for msgspec (few per post), when present.
    pub opens: Option<&'a [u8]>,
    /// The `key_last_used` value's bytes, for msgspec, when present.
    pub key_last_used: Option<&'a [u8]>,
    /// The `rows` array as posted (`[...]`); empty when the post has none.
    pub rows: &'a [u8],
    /// Rows posted, repeats of a request id included.
    pub rows_posted: usize,
    /// Request ids in the order posted, each once (the first row of an id is the one counted).
    pub ids: Vec<Cow<'a, str>>,
    /// Where the row of each id lies in the input.
    pub spans: Vec<(usize, usize)>,
    /// The latest `started_at` of the rows (0 when none).
    pub started_max: f64,
    /// The counted rows summed by rollup group, in the order groups first appear.
    pub groups: Vec<(GroupKey<'a>, Sums)>,
}

/// Reads one usage post, or declines it (see the module's note).
///
/// # Errors
/// `Declined` when the post is not JSON this reader takes; msgspec then decides.
pub fn scan(input: &[u8]) -> Res<Scan<'_>> {
    // Valid UTF-8 once for the whole body: every slice taken at an ASCII byte is then
    // valid too (escapes are checked where strings are read).
    let Ok(text) = std::str::from_utf8(input) else {
        return Err(Declined("not UTF-8"));
    };
    let mut r = Reader {
        s: text,
        b: input,
        i: 0,
        nul_ok: false,
    };
    let mut out = Scan::default();
    let mut seen: [bool; 5] = [false; 5];
    let mut groups: AHashMap<GroupKey<'_>, usize> = AHashMap::new();
    // Sized for the rows a post of this length holds (a row is 300 bytes or more), so the
    // set is not rebuilt as it grows.
    let mut ids: AHashSet<Cow<'_, str>> = AHashSet::with_capacity(input.len() / 300);
    r.ws();
    r.expect(b'{')?;
    r.ws();
    if !r.eat(b'}') {
        loop {
            r.ws();
            let key = r.string()?;
            r.ws();
            r.expect(b':')?;
            r.ws();
            let slot = match &*key {
                "gateway_id" => 0,
                "opens" => 1,
                "finals" => 2,
                "rows" => 3,
                "key_last_used" => 4,
                _ => return Err(Declined("unknown key")),
            };
            if std::mem::replace(&mut seen[slot], true) {
                return Err(Declined("repeated key"));
            }
            match slot {
                0 => out.gateway_id = r.string()?,
                1 => out.opens = Some(r.raw(0)?),
                2 => {
                    // Object-shaped finals come from gateways older than rows: msgspec's.
                    r.expect(b'[')?;
                    r.ws();
                    r.expect(b']')?;
                }
                3 => r.rows(&mut out, &mut ids, &mut groups)?,
                _ => out.key_last_used = Some(r.raw(0)?),
            }
            r.ws();
            if r.eat(b'}') {
                break;
            }
            r.expect(b',')?;
        }
    }
    r.ws();
    if r.i != input.len() {
        return Err(Declined("trailing bytes"));
    }
    if !seen[0] {
        return Err(Declined("no gateway_id"));
    }
    Ok(out)
}

struct Reader<'a> {
    /// The input, known to be UTF-8: strings are sliced from it, not checked again.
    s: &'a str,
    b: &'a [u8],
    i: usize,
    /// Whether a `\\u0000` escape is taken: in a row's route, stored as the JSON it is;
    /// not in a string the store keeps as text (msgspec's path replaces it there).
    nul_ok: bool,
}

/// The bytes a string's plain run stops at: a quote, a backslash, a control character.
const STOPS: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// One row's fields that the ingest needs.
struct Fields<'a> {
    id: Cow<'a, str>,
    model: Cow<'a, str>,
    ok: bool,
    prompt: u64,
    completion: u64,
    started: f64,
    tenancy: [Cow<'a, str>; 5],
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> Res<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(Declined("unexpected byte"))
        }
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    fn null(&mut self) -> bool {
        self.literal(b"null")
    }

    fn boolean(&mut self) -> Res<bool> {
        if self.literal(b"true") {
            Ok(true)
        } else if self.literal(b"false") {
            Ok(false)
        } else {
            Err(Declined("not a bool"))
        }
    }

    /// A JSON string, unescaped only when it holds escapes.
    fn string(&mut self) -> Res<Cow<'a, str>> {
        self.expect(b'"')?;
        let start = self.i;
        self.plain_run();
        match self.peek() {
            Some(b'"') => {
                let s = self.text(start, self.i);
                self.i += 1;
                Ok(Cow::Borrowed(s))
            }
            Some(b'\\') => self.escaped(start).map(Cow::Owned),
            Some(_) => Err(Declined("control character in a string")),
            None => Err(Declined("unterminated string")),
        }
    }

    /// Moves past string bytes that need no attention (not a quote, backslash or control).
    fn plain_run(&mut self) {
        let rest = &self.b[self.i..];
        self.i += rest
            .iter()
            .position(|&c| STOPS[usize::from(c)])
            .unwrap_or(rest.len());
    }

    fn text(&self, from: usize, to: usize) -> &'a str {
        // Both ends sit at ASCII bytes of the UTF-8 input, so this cannot fail; an empty
        // string stands in if it ever did.
        self.s.get(from..to).unwrap_or_default()
    }

    /// The rest of a string that holds an escape; `start` is just after its opening quote.
    fn escaped(&mut self, start: usize) -> Res<String> {
        let mut s = String::from(self.text(start, self.i));
        loop {
            let run = self.i;
            self.plain_run();
            s.push_str(self.text(run, self.i));
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(s);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = self.peek().ok_or(Declined("unterminated escape"))?;
                    self.i += 1;
                    s.push(match c {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode()?,
                        _ => return Err(Declined("bad escape")),
                    });
                }
                _ => return Err(Declined("control character or end in a string")),
            }
        }
    }

    /// After `\u`: one character, a surrogate pair taking two escapes. No NUL (the
    /// store cannot hold it; msgspec's path replaces it) and no lone surrogate.
    fn unicode(&mut self) -> Res<char> {
        let hi = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&hi) {
            if !(self.literal(b"\\u")) {
                return Err(Declined("lone surrogate"));
            }
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(Declined("lone surrogate"));
            }
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else {
            hi
        };
        match char::from_u32(code) {
            Some('\0') if !self.nul_ok => Err(Declined("NUL")),
            Some(c) => Ok(c),
            None => Err(Declined("lone surrogate")),
        }
    }

    fn hex4(&mut self) -> Res<u32> {
        let digits = self.b.get(self.i..self.i + 4).ok_or(Declined("short \\u escape"))?;
        let mut v = 0;
        for &d in digits {
            v = v * 16 + char::from(d).to_digit(16).ok_or(Declined("bad \\u escape"))?;
        }
        self.i += 4;
        Ok(v)
    }

    fn opt_string(&mut self) -> Res<Option<Cow<'a, str>>> {
        if self.null() {
            Ok(None)
        } else {
            self.string().map(Some)
        }
    }

    /// The bytes of one JSON number token, checked against JSON's grammar.
    fn number(&mut self) -> Res<&'a str> {
        let start = self.i;
        self.eat(b'-');
        let digits = |r: &mut Self| {
            let n = r.b[r.i..].iter().take_while(|c| c.is_ascii_digit()).count();
            r.i += n;
            n
        };
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(Declined("not a number")),
        }
        if self.eat(b'.') && digits(self) == 0 {
            return Err(Declined("bad fraction"));
        }
        if self.eat(b'e') || self.eat(b'E') {
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            if digits(self) == 0 {
                return Err(Declined("bad exponent"));
            }
        }
        Ok(self.text(start, self.i))
    }

    /// A non-negative integer token (no fraction or exponent) of at most `max`.
    fn uint(&mut self, max: u64) -> Res<u64> {
        let tok = self.number()?;
        if tok.len() > 16 || !tok.bytes().all(|c| c.is_ascii_digit()) {
            return Err(Declined("not a small non-negative integer"));
        }
        match tok.parse::<u64>() {
            Ok(v) if v <= max => Ok(v),
            _ => Err(Declined("integer out of bounds")),
        }
    }

    /// A number (integer or not) within [0, max].
    fn float(&mut self, max: f64) -> Res<f64> {
        match self.number()?.parse::<f64>() {
            Ok(v) if v.is_finite() && (0.0..=max).contains(&v) => Ok(v),
            _ => Err(Declined("number out of bounds")),
        }
    }

    /// A duration in milliseconds, within [0, 1e12]; null when `nullable`. Its value is not
    /// needed: a plain decimal of at most 12 integer digits is within bounds unparsed.
    fn millis(&mut self, nullable: bool) -> Res<()> {
        if nullable && self.null() {
            return Ok(());
        }
        let tok = self.number()?;
        let int_digits = tok.bytes().take_while(u8::is_ascii_digit).count();
        let plain = tok.bytes().all(|c| c.is_ascii_digit() || c == b'.');
        if plain && int_digits <= 12 {
            return Ok(());
        }
        match tok.parse::<f64>() {
            Ok(v) if v.is_finite() && (0.0..=MILLIS_MAX).contains(&v) => Ok(()),
            _ => Err(Declined("number out of bounds")),
        }
    }

    /// Any one JSON value, checked; returns its bytes.
    fn raw(&mut self, depth: usize) -> Res<&'a [u8]> {
        if depth > MAX_DEPTH {
            return Err(Declined("nested too deeply"));
        }
        let start = self.i;
        match self.peek() {
            Some(b'"') => {
                self.string()?;
            }
            Some(b'{') => {
                self.i += 1;
                self.ws();
                if !self.eat(b'}') {
                    loop {
                        self.ws();
                        self.string()?;
                        self.ws();
                        self.expect(b':')?;
                        self.ws();
                        self.raw(depth + 1)?;
                        self.ws();
                        if self.eat(b'}') {
                            break;
                        }
                        self.expect(b',')?;
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                self.ws();
                if !self.eat(b']') {
                    loop {
                        self.ws();
                        self.raw(depth + 1)?;
                        self.ws();
                        if self.eat(b']') {
                            break;
                        }
                        self.expect(b',')?;
                    }
                }
            }
            Some(b't' | b'f') => {
                self.boolean()?;
            }
            Some(b'n') => {
                if !self.null() {
                    return Err(Declined("bad literal"));
                }
            }
            _ => {
                self.number()?;
            }
        }
        Ok(&self.b[start..self.i])
    }

    /// Reads the next row element: `,` before every element but the first.
    fn next(&mut self, first: bool) -> Res<()> {
        self.ws();
        if !first {
            self.expect(b',')?;
            self.ws();
        }
        Ok(())
    }

    /// One row: `[request_id, model, ..., org_id(, request_body, response_body)]`.
    fn row(&mut self) -> Res<Fields<'a>> {
        self.expect(b'[')?;
        self.next(true)?;
        let id = self.string()?;
        self.next(false)?;
        let model = self.string()?;
        self.next(false)?;
        self.string()?; // upstream_model
        self.next(false)?;
        self.opt_string()?; // replica
        self.next(false)?;
        let status = self.string()?;
        self.next(false)?;
        self.uint(999)?; // http_status
        self.next(false)?;
        self.boolean()?; // stream
        self.next(false)?;
        let prompt = self.uint(TALLY_MAX)?;
        self.next(false)?;
        let completion = self.uint(TALLY_MAX)?;
        self.next(false)?;
        self.boolean()?; // usage_estimated
        self.next(false)?;
        self.millis(true)?; // ttft_ms
        self.next(false)?;
        self.millis(false)?; // duration_ms
        self.next(false)?;
        self.opt_string()?; // finish_reason
        self.next(false)?;
        self.uint(TALLY_MAX)?; // retries
        self.next(false)?;
        let started = self.float(INSTANT_MAX)?;
        self.next(false)?;
        self.nul_ok = true;
        self.raw(0)?; // route
        self.nul_ok = false;
        let mut tenancy: [Cow<'a, str>; 5] = Default::default();
        // Posted key, user, project, team, org; the rollup key orders them org first.
        for k in [4, 3, 2, 1, 0] {
            self.next(false)?;
            tenancy[k] = self.opt_string()?.unwrap_or_default();
        }
        let mut fields = ROW_FIELDS_MIN;
        loop {
            self.ws();
            if self.eat(b']') {
                break;
            }
            if fields == ROW_FIELDS {
                return Err(Declined("row too long"));
            }
            self.next(false)?;
            // Kept bodies need msgspec (the response body is base64): declined.
            if !self.null() {
                return Err(Declined("row with a kept body"));
            }
            fields += 1;
        }
        Ok(Fields {
            id,
            model,
            ok: status == "ok",
            prompt,
            completion,
            started,
            tenancy,
        })
    }

    fn rows(
        &mut self,
        out: &mut Scan<'a>,
        ids: &mut AHashSet<Cow<'a, str>>,
        groups: &mut AHashMap<GroupKey<'a>, usize>,
    ) -> Res<()> {
        let start = self.i;
        let mut last = 0;
        self.expect(b'[')?;
        self.ws();
        if !self.eat(b']') {
            loop {
                self.ws();
                let from = self.i;
                let f = self.row()?;
                out.rows_posted += 1;
                if ids.insert(f.id.clone()) {
                    out.ids.push(f.id);
                    out.spans.push((from, self.i));
                    out.started_max = out.started_max.max(f.started);
                    let key = (hour_start(f.started), f.tenancy, f.model);
                    // Most rows of a post fall in the group of the row before: no hashing.
                    let at = match out.groups.get(last) {
                        Some((k, _)) if *k == key => last,
                        _ => *groups.entry(key).or_insert_with_key(|k| {
                            out.groups.push((k.clone(), [0; 4]));
                            out.groups.len() - 1
                        }),
                    };
                    last = at;
                    let sums = &mut out.groups[at].1;
                    sums[0] += 1;
                    sums[1] += u64::from(!f.ok);
                    sums[2] += f.prompt;
                    sums[3] += f.completion;
                }
                self.ws();
                if self.eat(b']') {
                    break;
                }
                self.expect(b',')?;
            }
        }
        out.rows = &self.b[start..self.i];
        Ok(())
    }
}

/// The start of the hour `started` falls in, in seconds, as the store's Python computes it
/// (`int(started // 3600) * 3600`, with the float floor division of `CPython`).
#[must_use]
pub fn hour_start(started: f64) -> i64 {
    let rem = started % HOUR;
    let div = (started - rem) / HOUR;
    let mut floor = div.floor();
    if div - floor > 0.5 {
        floor += 1.0;
    }
    // Instants are within [0, 1e11]: the hour count fits an i64 exactly.
    (floor as i64) * 3600
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]
mod tests {
    use super::*;

    const ROW: &str = r#"["rid1","m","up","r1","ok",200,true,12,3,false,0.812,1500.0,null,1,1764000000.5,{"policy":"kv","c":[1,2]},"key_1",null,"proj","team","org",null,null]"#;

    fn post(rows: &[&str]) -> String {
        format!(
            r#"{{"gateway_id":"gw_1","opens":[],"finals":[],"rows":[{}],"key_last_used":{{"key_1":1.5}}}}"#,
            rows.join(",")
        )
    }

    #[test]
    fn a_post_is_summed_by_group_and_kept_as_posted() {
        let other = ROW.replace("rid1", "rid2").replace(r#""ok",200"#, r#""upstream_error",502"#);
        let body = post(&[ROW, &other, ROW]);
        let s = scan(body.as_bytes()).unwrap();
        assert_eq!(s.gateway_id, "gw_1");
        assert_eq!(s.rows_posted, 3);
        assert_eq!(s.ids, ["rid1", "rid2"]);
        assert_eq!(&body.as_bytes()[s.spans[1].0..s.spans[1].1], other.as_bytes());
        assert_eq!(s.groups.len(), 1);
        let ((hour, tenancy, model), sums) = &s.groups[0];
        assert_eq!(*hour, 1_764_000_000); // the row started half a second into it
        assert_eq!(tenancy, &["org", "team", "proj", "", "key_1"]);
        assert_eq!(model, "m");
        assert_eq!(sums, &[2, 1, 24, 6]);
        assert!((s.started_max - 1_764_000_000.5).abs() < 1e-9);
        assert_eq!(s.rows, format!("[{ROW},{other},{ROW}]").as_bytes());
        assert_eq!(s.opens, Some(&b"[]"[..]));
        assert_eq!(s.key_last_used, Some(&br#"{"key_1":1.5}"#[..]));
    }

    #[test]
    fn escapes_are_read_and_bodies_left_out_are_fine() {
        let row = ROW
            .replace("rid1", r"r\u00e9\ud83d\ude00\n")
            .replace(",null,null]", "]");
        let body = post(&[&row]);
        let s = scan(body.as_bytes()).unwrap();
        assert_eq!(s.ids, ["ré😀\n"]);
        let long = ROW.replace("1500.0", "999999999999.5").replace("0.812", "-0.0");
        assert!(scan(post(&[&long]).as_bytes()).is_ok());
        let nul_in_route = ROW.replace(r#""c":[1,2]"#, r#""\u0000":0"#);
        assert!(scan(post(&[&nul_in_route]).as_bytes()).is_ok());
        let nul_in_opens = r#"{"gateway_id":"g","opens":[{"model":"\u0000"}]}"#;
        assert!(scan(nul_in_opens.as_bytes()).is_err());
    }

    #[test]
    fn what_msgspec_must_judge_is_declined() {
        let cases = [
            (ROW.replace("rid1", r"a\u0000"), "NUL"),
            (ROW.replace("rid1", r"a\ud800"), "lone surrogate"),
            (ROW.replace(r#""c":[1,2]"#, r#""c":"\ud800""#), "lone surrogate in the route"),
            (ROW.replace("rid1", "a\u{1}"), "control character"),
            (ROW.replace(",200,", ",1000,"), "http_status bound"),
            (ROW.replace(",200,", ",200.0,"), "float for an int"),
            (ROW.replace(",12,", ",-1,"), "negative tally"),
            (ROW.replace("1764000000.5", "1e12"), "instant bound"),
            (ROW.replace("1500.0", "1e400"), "infinite"),
            (ROW.replace("1500.0", "1000000000000.5"), "duration bound"),
            (ROW.replace("0.812", "1e13"), "ttft bound"),
            (ROW.replace("0.812", "-1"), "negative ttft"),
            (ROW.replace(",true,", ",1,"), "int for a bool"),
            (ROW.replace("null,null]", r#"{"x":1},null]"#), "kept body"),
            (ROW.replace("null,null]", "null,null,null]"), "too long"),
            (ROW.replace(r#","org",null,null]"#, "]"), "too short"),
            (ROW.replace("[1,2]", "[1,2,]"), "bad route"),
            (ROW.replace("0.812", "01"), "leading zero"),
            (ROW.replace("\"m\"", "null"), "null model"),
        ];
        for (row, why) in cases {
            assert!(scan(post(&[&row]).as_bytes()).is_err(), "{why}");
        }
        for body in [
            r#"{"rows":[]}"#.to_owned(),
            r#"{"gateway_id":"g","gateway_id":"g"}"#.to_owned(),
            r#"{"gateway_id":"g","extra":1}"#.to_owned(),
            r#"{"gateway_id":"g","finals":[{}]}"#.to_owned(),
            r#"{"gateway_id":"g"} x"#.to_owned(),
            format!("{}\u{ff}", post(&[ROW])),
        ] {
            assert!(scan(body.as_bytes()).is_err(), "{body}");
        }
        assert!(scan(b"{\"gateway_id\":\"g\"}\xff").is_err());
    }

    #[test]
    fn whitespace_anywhere_is_taken() {
        let row = ROW.replace(',', " ,\n ").replace('[', "[ ").replace(':', " : ");
        let body = format!(" {{ \"gateway_id\" : \"g\" , \"rows\" : [ {row} ] }} ");
        let s = scan(body.as_bytes()).unwrap();
        assert_eq!(s.ids, ["rid1"]);
        assert_eq!(s.groups[0].1, [1, 0, 12, 3]);
    }

    #[test]
    fn hours_match_python_floor_division() {
        // Values next to an hour's boundary, where naive division could round up.
        assert_eq!(hour_start(3600.0), 3600);
        assert_eq!(hour_start(3_599.999_999_999_999_5), 0);
        assert_eq!(hour_start(7_199.999_999_999), 3600);
        assert_eq!(hour_start(0.0), 0);
    }
}
