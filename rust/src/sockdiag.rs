//! Reading a `SOCK_DIAG_BY_FAMILY` dump (Linux's `inet_diag`, what `ss` reads): the
//! established TCP connections of one local port whose peer has sent no byte yet.
//!
//! The gateway asks the kernel for its listener's connections with their `tcp_info`
//! (`llmgw.net.connections.TcpDiag.silent`) and closes those that stay silent past the header
//! deadline (`llmgw.net.silent`). A dump answers with one message of about 400 bytes a
//! connection; read in Python that was 2.5 µs each, 25 ms for a worker with 10,000
//! connections. Here it is plain byte reading, with the interpreter free meanwhile.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `struct inet_diag_msg`: family, state, timer, retrans, the socket id (ports at 4 and 6,
/// addresses at 8 and 24), expires, the queues, uid, and the inode at 68.
const DIAG_MSG: usize = 72;
const TCP_ESTABLISHED: u8 = 1;
const AF_INET: u8 = 2;
/// `INET_DIAG_INFO`: the attribute holding `struct tcp_info`.
const INET_DIAG_INFO: u16 = 2;
/// Offset of `tcpi_bytes_received` (u64) in `struct tcp_info` (Linux 4.1 on).
const BYTES_RECEIVED: usize = 128;

/// One connection whose peer has sent nothing: its socket's inode and its two ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Silent {
    pub inode: u32,
    pub local: (IpAddr, u16),
    pub peer: (IpAddr, u16),
}

/// Adds the silent connections of local `port` found in `answer` (one part of the answer to
/// dump `seq`) to `out`. Returns false once the dump is over: its end, an error, or a message
/// that is not this dump's. Connections of other ports, in other states, or without a
/// `tcp_info` long enough to say what they received are skipped.
pub fn silent(answer: &[u8], seq: u32, port: u16, out: &mut Vec<Silent>) -> bool {
    let mut at = 0;
    while at + NLMSG_HDR <= answer.len() {
        let length = u32_ne(answer, at) as usize;
        let kind = u16_ne(answer, at + 4);
        if length < NLMSG_HDR || u32_ne(answer, at + 8) != seq || kind == NLMSG_DONE || kind == NLMSG_ERROR {
            return false;
        }
        let end = (at + length).min(answer.len());
        if kind == SOCK_DIAG_BY_FAMILY && end >= at + NLMSG_HDR + DIAG_MSG {
            if let Some(s) = read_one(&answer[at + NLMSG_HDR..end], port) {
                out.push(s);
            }
        }
        at += (length + 3) & !3;
    }
    true
}

fn read_one(msg: &[u8], port: u16) -> Option<Silent> {
    if msg[1] != TCP_ESTABLISHED {
        return None;
    }
    let sport = u16::from_be_bytes([msg[4], msg[5]]);
    if sport != port || received(&msg[DIAG_MSG..])? != 0 {
        return None;
    }
    let dport = u16::from_be_bytes([msg[6], msg[7]]);
    let v4 = msg[0] == AF_INET;
    Some(Silent {
        inode: u32_ne(msg, 68),
        local: (address(&msg[8..24], v4), sport),
        peer: (address(&msg[24..40], v4), dport),
    })
}

/// `tcpi_bytes_received` from a message's attributes; None when there is no `tcp_info`
/// that long.
fn received(attrs: &[u8]) -> Option<u64> {
    let mut a = 0;
    while a + 4 <= attrs.len() {
        let size = u16_ne(attrs, a) as usize;
        if size < 4 {
            return None;
        }
        if u16_ne(attrs, a + 2) == INET_DIAG_INFO {
            let info = attrs.get(a + 4..(a + size).min(attrs.len()))?;
            let bytes = info.get(BYTES_RECEIVED..BYTES_RECEIVED + 8)?;
            return Some(u64::from_ne_bytes(bytes.try_into().ok()?));
        }
        a += (size + 3) & !3;
    }
    None
}

/// An address as the kernel wrote it (network order; IPv4 in the first 4 of 16 bytes),
/// with an IPv4-mapped IPv6 address (a dual-stack listener's IPv4 peer) as plain IPv4.
fn address(raw: &[u8], v4: bool) -> IpAddr {
    if v4 {
        return IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]));
    }
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&raw[..16]);
    let v6 = Ipv6Addr::from(octets);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

fn u16_ne(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_ne(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One dump message as the kernel writes it: an IPv4 or IPv6 connection in `state`,
    /// `received` bytes from its peer (None: no `tcp_info`), after a SHUTDOWN attribute.
    fn message(seq: u32, v4: bool, state: u8, sport: u16, received: Option<u64>, inode: u32) -> Vec<u8> {
        let mut msg = vec![0u8; DIAG_MSG];
        msg[0] = if v4 { AF_INET } else { 10 };
        msg[1] = state;
        msg[4..6].copy_from_slice(&sport.to_be_bytes());
        msg[6..8].copy_from_slice(&40_000u16.to_be_bytes());
        if v4 {
            msg[8..12].copy_from_slice(&[127, 0, 0, 1]);
            msg[24..28].copy_from_slice(&[10, 1, 2, 3]);
        } else {
            msg[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
            msg[24..40].copy_from_slice(&Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped().octets());
        }
        msg[68..72].copy_from_slice(&inode.to_ne_bytes());
        // INET_DIAG_SHUTDOWN (8): one byte, padded to 4.
        msg.extend_from_slice(&5u16.to_ne_bytes());
        msg.extend_from_slice(&8u16.to_ne_bytes());
        msg.extend_from_slice(&[0, 0, 0, 0]);
        if let Some(n) = received {
            let mut info = vec![0u8; 232];
            info[BYTES_RECEIVED..BYTES_RECEIVED + 8].copy_from_slice(&n.to_ne_bytes());
            msg.extend_from_slice(&((4 + info.len()) as u16).to_ne_bytes());
            msg.extend_from_slice(&INET_DIAG_INFO.to_ne_bytes());
            msg.extend_from_slice(&info);
        }
        header(SOCK_DIAG_BY_FAMILY, seq, &msg)
    }

    fn header(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&2u16.to_ne_bytes()); // NLM_F_MULTI
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(body);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    #[test]
    fn keeps_only_the_ports_established_connections_that_received_nothing() {
        let mut part = Vec::new();
        part.extend(message(7, true, TCP_ESTABLISHED, 8080, Some(0), 11));
        part.extend(message(7, true, TCP_ESTABLISHED, 8080, Some(1), 12)); // sent its first byte
        part.extend(message(7, true, TCP_ESTABLISHED, 9090, Some(0), 13)); // another port
        part.extend(message(7, true, 8, 8080, Some(0), 14)); // closing
        part.extend(message(7, true, TCP_ESTABLISHED, 8080, None, 15)); // cannot tell
        part.extend(message(7, false, TCP_ESTABLISHED, 8080, Some(0), 16));
        let mut out = Vec::new();
        assert!(silent(&part, 7, 8080, &mut out), "no end yet: the dump goes on");
        assert_eq!(
            out,
            vec![
                Silent {
                    inode: 11,
                    local: (IpAddr::V4(Ipv4Addr::LOCALHOST), 8080),
                    peer: (IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 40_000),
                },
                Silent {
                    inode: 16,
                    local: (IpAddr::V6(Ipv6Addr::LOCALHOST), 8080),
                    peer: (IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)), 40_000), // IPv4-mapped, read as IPv4
                },
            ]
        );
    }

    #[test]
    fn the_end_an_error_or_another_dumps_message_stop_it() {
        let mut out = Vec::new();
        let mut part = message(3, true, TCP_ESTABLISHED, 80, Some(0), 1);
        part.extend(header(NLMSG_DONE, 3, &[0, 0, 0, 0]));
        part.extend(message(3, true, TCP_ESTABLISHED, 80, Some(0), 2)); // never read
        assert!(!silent(&part, 3, 80, &mut out));
        assert_eq!(out.len(), 1);
        assert!(!silent(&header(NLMSG_ERROR, 3, &[0; 20]), 3, 80, &mut out));
        assert!(!silent(&message(4, true, TCP_ESTABLISHED, 80, Some(0), 5), 3, 80, &mut out));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn cut_or_malformed_parts_are_read_without_a_panic() {
        let whole = message(1, true, TCP_ESTABLISHED, 80, Some(0), 9);
        for n in 0..whole.len() {
            let mut out = Vec::new();
            silent(&whole[..n], 1, 80, &mut out);
            assert!(out.is_empty() || n >= NLMSG_HDR + DIAG_MSG + 8 + 4 + BYTES_RECEIVED + 8);
        }
        let mut bad = whole.clone();
        bad[NLMSG_HDR + DIAG_MSG..NLMSG_HDR + DIAG_MSG + 2].copy_from_slice(&2u16.to_ne_bytes()); // size < 4
        let mut out = Vec::new();
        silent(&bad, 1, 80, &mut out);
        assert!(out.is_empty());
        let mut zero = whole;
        zero[..4].copy_from_slice(&0u32.to_ne_bytes()); // a length that would never advance
        assert!(!silent(&zero, 1, 80, &mut out));
    }
}
