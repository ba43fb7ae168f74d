//! A fixed-answer `OpenAI` upstream for the throughput bench, in plain std Rust.
//!
//! The bench's rule is that the upstream must reach at least 3x what the best
//! gateway reaches, or a comparison between gateways is void. The Python engine
//! simulator spends about 250 µs of CPU per request on a 2-core machine that also
//! runs the load generator and the gateway, so it cannot. This server answers
//! every POST with one fixed, non-streamed chat completion (with `usage`) and every
//! GET with an empty 200, over HTTP/1.1 keep-alive, one thread per connection. It
//! is simulated: it serves no model, and its answer says so.
//!
//! `cargo build --release --example fast_upstream`, then
//! `target/release/examples/fast_upstream PORT`; it prints
//! `llmgw-fast-upstream listening on http://127.0.0.1:PORT` when it accepts.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;

const ANSWER: &str = concat!(
    r#"{"id":"chatcmpl-fast","object":"chat.completion","created":0,"model":"sim-model","#,
    r#""choices":[{"index":0,"message":{"role":"assistant","content":"simulated answer from "#,
    r#"the bench's fixed upstream"},"finish_reason":"stop"}],"#,
    r#""usage":{"prompt_tokens":16,"completion_tokens":16,"total_tokens":32}}"#
);

fn main() -> io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "usage: fast_upstream PORT"))?;
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    println!("llmgw-fast-upstream listening on http://127.0.0.1:{port}");
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        thread::spawn(move || {
            // A client that goes away mid-request is the only error here: drop it.
            let _ = serve(stream);
        });
    }
    Ok(())
}

/// Answers requests on one connection until the client closes it.
fn serve(stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut answer = Vec::with_capacity(512);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let post = line.starts_with("POST");
        let (mut length, mut chunked, mut close) = (0usize, false, false);
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().unwrap_or(0);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            }
        }
        if chunked {
            skip_chunked(&mut reader, &mut line)?;
        } else {
            io::copy(&mut (&mut reader).take(length as u64), &mut io::sink())?;
        }
        let (ctype, body) = if post {
            ("application/json", ANSWER)
        } else {
            ("text/plain", "")
        };
        // One write per answer: `write!` straight to the socket sent each formatted
        // piece as its own syscall (and, with nodelay, its own segment), six per answer.
        answer.clear();
        write!(
            answer,
            "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        out.write_all(&answer)?;
        if close {
            return Ok(());
        }
    }
}

/// Reads and discards a chunked request body.
fn skip_chunked(reader: &mut BufReader<TcpStream>, line: &mut String) -> io::Result<()> {
    loop {
        line.clear();
        reader.read_line(line)?;
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        io::copy(&mut reader.take(size as u64 + 2), &mut io::sink())?;
        if size == 0 {
            return Ok(());
        }
    }
}
