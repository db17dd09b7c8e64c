//! The few DNS messages the agent's DNS proxy reads and writes (RFC 1035
//! §4): a query's header and single question, and an answer of A records
//! (or none) for it. Everything else (other opcodes, several questions,
//! anything in a name it cannot read) is answered with an error code or
//! forwarded as bytes, never interpreted.
//!
//! Hand-written rather than a DNS crate: no DNS crate is in the dependency
//! tree, and this is all the proxy decodes (~150 lines), every input
//! bounded (a name of at most 255 bytes, labels of at most 63, no
//! compression pointers in a question, at most [`MAX_ANSWERS`] records).

use std::net::Ipv4Addr;

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
pub const CLASS_IN: u16 = 1;
pub const HEADER: usize = 12;
/// The most A records in one answer: it stays within 512 bytes (a name of
/// 255 bytes, 16 bytes a record), so no answer needs truncation.
pub const MAX_ANSWERS: usize = 8;
/// The largest message the proxy reads (UDP with EDNS, or one TCP message).
pub const MAX_MESSAGE: usize = 4096;

/// Response codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError = 0,
    FormErr = 1,
    ServFail = 2,
    NxDomain = 3,
    NotImp = 4,
}

/// A query's header fields and its question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// The RD bit, echoed.
    pub recursion_desired: bool,
    /// Lower case, without the trailing dot; None if a label holds bytes a
    /// host name never has (then the query is only forwarded).
    pub name: Option<String>,
    pub qtype: u16,
    pub qclass: u16,
    /// Where the question ends in the message.
    question_end: usize,
}

/// Why a message is not a query the proxy can read: the code to answer
/// with (None: not even a header to answer to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub Option<(u16, Rcode)>);

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

/// Read a standard query with one question.
pub fn parse_query(msg: &[u8]) -> Result<Query, Refused> {
    let (Some(id), Some(flags), Some(qdcount)) = (u16_at(msg, 0), u16_at(msg, 2), u16_at(msg, 4)) else {
        return Err(Refused(None));
    };
    if flags & 0x8000 != 0 {
        // A response: nothing to answer.
        return Err(Refused(None));
    }
    if (flags >> 11) & 0xf != 0 {
        return Err(Refused(Some((id, Rcode::NotImp))));
    }
    let formerr = Refused(Some((id, Rcode::FormErr)));
    if qdcount != 1 {
        return Err(formerr);
    }
    let mut i = HEADER;
    let mut labels: Vec<String> = Vec::new();
    let mut total = 0usize;
    let mut readable = true;
    loop {
        let len = *msg.get(i).ok_or(formerr)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        // Compression pointers (0xC0) and the reserved label types have no
        // place in a question here.
        if len > 63 {
            return Err(formerr);
        }
        total += len + 1;
        if total > 255 {
            return Err(formerr);
        }
        let label = msg.get(i..i + len).ok_or(formerr)?;
        readable &= label.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_');
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        i += len;
    }
    let (Some(qtype), Some(qclass)) = (u16_at(msg, i), u16_at(msg, i + 2)) else { return Err(formerr) };
    Ok(Query { id, recursion_desired: flags & 0x0100 != 0, name: readable.then(|| labels.join(".")), qtype, qclass, question_end: i + 4 })
}

/// The answer to `q` (read from `msg`): `rcode`, with an A record per
/// address (at most [`MAX_ANSWERS`]), authoritative.
pub fn answer(q: &Query, msg: &[u8], rcode: Rcode, ips: &[Ipv4Addr], ttl: u32) -> Vec<u8> {
    let ips = &ips[..ips.len().min(MAX_ANSWERS)];
    let mut out = Vec::with_capacity(q.question_end + 16 * ips.len());
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR, AA, RD as asked, RA.
    let flags: u16 = 0x8000 | 0x0400 | if q.recursion_desired { 0x0100 } else { 0 } | 0x0080 | rcode as u16;
    out.extend_from_slice(&flags.to_be_bytes());
    for count in [1u16, ips.len() as u16, 0, 0] {
        out.extend_from_slice(&count.to_be_bytes());
    }
    out.extend_from_slice(&msg[HEADER..q.question_end]);
    for ip in ips {
        // The name: a pointer to the question's (offset 12).
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&ip.octets());
    }
    out
}

/// An error answer with no question (for a query that could not be read).
pub fn error(id: u16, rcode: Rcode) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&(0x8000u16 | 0x0080 | rcode as u16).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out
}

/// A query for `name` of `qtype` (tests, benchmarks).
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.').filter(|l| !l.is_empty()) {
        out.push(label.len().min(63) as u8);
        out.extend_from_slice(&label.as_bytes()[..label.len().min(63)]);
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// An answer's id, rcode and A records (tests, benchmarks): follows the
/// question and each record's name as a pointer or labels.
pub fn read_answer(msg: &[u8]) -> Option<(u16, u8, Vec<Ipv4Addr>)> {
    let id = u16_at(msg, 0)?;
    let rcode = (u16_at(msg, 2)? & 0xf) as u8;
    let (qd, an) = (u16_at(msg, 4)?, u16_at(msg, 6)?);
    let skip_name = |mut i: usize| -> Option<usize> {
        loop {
            let len = *msg.get(i)? as usize;
            if len == 0 {
                return Some(i + 1);
            }
            if len & 0xc0 == 0xc0 {
                return Some(i + 2);
            }
            i += len + 1;
        }
    };
    let mut i = HEADER;
    for _ in 0..qd {
        i = skip_name(i)? + 4;
    }
    let mut ips = Vec::new();
    for _ in 0..an {
        i = skip_name(i)?;
        let (t, len) = (u16_at(msg, i)?, u16_at(msg, i + 8)? as usize);
        let data = msg.get(i + 10..i + 10 + len)?;
        if t == TYPE_A && len == 4 {
            ips.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        i += 10 + len;
    }
    Some((id, rcode, ips))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_and_its_answer() {
        let q = query(0x1234, "Reviews.Shop.", TYPE_A);
        let parsed = parse_query(&q).unwrap();
        assert_eq!((parsed.id, parsed.name.as_deref(), parsed.qtype, parsed.recursion_desired), (0x1234, Some("reviews.shop"), TYPE_A, true));
        let ips = [Ipv4Addr::new(240, 240, 1, 2), Ipv4Addr::new(10, 0, 0, 1)];
        let a = answer(&parsed, &q, Rcode::NoError, &ips, 30);
        assert_eq!(read_answer(&a), Some((0x1234, 0, ips.to_vec())));
        // The flags: a response, authoritative, recursion desired and
        // available.
        assert_eq!(u16_at(&a, 2), Some(0x8580));
        let nx = answer(&parsed, &q, Rcode::NxDomain, &[], 30);
        assert_eq!(read_answer(&nx), Some((0x1234, 3, vec![])));
        // At most MAX_ANSWERS records, within 512 bytes for the longest name.
        let long = [&"a".repeat(63)[..]; 4].join(".");
        let q = query(1, &long[..long.len() - 2], TYPE_A);
        let many = vec![Ipv4Addr::LOCALHOST; 100];
        let a = answer(&parse_query(&q).unwrap(), &q, Rcode::NoError, &many, 30);
        assert_eq!(read_answer(&a).unwrap().2.len(), MAX_ANSWERS);
        assert!(a.len() <= 512, "{}", a.len());
    }

    #[test]
    fn bad_queries_are_refused_with_a_code() {
        assert_eq!(parse_query(&[0; 5]), Err(Refused(None)));
        let mut q = query(7, "a.b", TYPE_A);
        q[5] = 2; // two questions
        assert_eq!(parse_query(&q), Err(Refused(Some((7, Rcode::FormErr)))));
        let mut q = query(7, "a.b", TYPE_A);
        q[12] = 0xc0; // a compression pointer
        assert_eq!(parse_query(&q), Err(Refused(Some((7, Rcode::FormErr)))));
        let q = query(7, "a.b", TYPE_A);
        assert_eq!(parse_query(&q[..q.len() - 1]), Err(Refused(Some((7, Rcode::FormErr)))));
        let mut q = query(7, "a.b", TYPE_A);
        q[2] |= 0x28; // opcode 5 (UPDATE)
        assert_eq!(parse_query(&q), Err(Refused(Some((7, Rcode::NotImp)))));
        // A name longer than 255 bytes.
        let mut q = query(9, "x", TYPE_A);
        q.truncate(HEADER);
        for _ in 0..5 {
            q.push(63);
            q.extend_from_slice(&[b'a'; 63]);
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        assert_eq!(parse_query(&q), Err(Refused(Some((9, Rcode::FormErr)))));
        // Odd bytes in a label: readable, but not a host name.
        let q = query(3, "a b.c", TYPE_A);
        assert_eq!(parse_query(&q).unwrap().name, None);
        assert_eq!(read_answer(&error(3, Rcode::ServFail)), Some((3, 2, vec![])));
    }
}
