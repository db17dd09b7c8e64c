//! The DNS messages the agent's DNS proxy reads and writes, through
//! `hickory-proto` (RFC 1035 decoding and encoding: names, compression
//! pointers and their loops, label and name lengths): a query's header
//! and single question, and an authoritative answer of A or AAAA records
//! (or none) for it. Everything else (other opcodes, several questions,
//! a question that does not decode) is answered with an error code;
//! forwarded queries and their answers pass as bytes, never re-encoded.
//!
//! Bounded before decoding: at most [`MAX_MESSAGE`] bytes, and the
//! question count is read from the header (exactly one, else FORMERR)
//! before any question is, so a header claiming 65,535 questions costs
//! nothing; the rest of the message (EDNS, other sections) is not decoded.

use hickory_proto::op::{Header, Message, MessageType, OpCode, Query as Question};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use std::net::IpAddr;

pub use hickory_proto::op::ResponseCode as Rcode;
pub use hickory_proto::rr::{DNSClass, RecordType};

/// The most records in one answer: it stays within 512 bytes (a name of
/// 255 bytes, then 28 bytes an AAAA record with its name a pointer), so no
/// answer needs truncation.
pub const MAX_ANSWERS: usize = 8;
/// The largest message the proxy reads (UDP with EDNS, or one TCP message).
pub const MAX_MESSAGE: usize = 4096;

/// A query's header fields and its question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// The RD bit, echoed.
    pub recursion_desired: bool,
    /// Lower case, without the trailing dot; None if a label holds bytes a
    /// host name never has (then the query is only forwarded).
    pub name: Option<String>,
    /// The question as asked (its name's case kept), echoed in answers.
    pub question: Question,
}

impl Query {
    pub fn qtype(&self) -> RecordType {
        self.question.query_type()
    }

    pub fn qclass(&self) -> DNSClass {
        self.question.query_class()
    }
}

/// Why a message is not a query the proxy can read: the code to answer
/// with (None: not even a header to answer to, or a response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub Option<(u16, Rcode)>);

/// A host name's labels only (letters, digits, `-`, `_`), lower case,
/// joined with dots.
fn host_name(name: &Name) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    for (i, label) in name.iter().enumerate() {
        if !label.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_') {
            return None;
        }
        if i > 0 {
            out.push('.');
        }
        out.extend(label.iter().map(|b| b.to_ascii_lowercase() as char));
    }
    Some(out)
}

/// Read a standard query with one question.
pub fn parse_query(msg: &[u8]) -> Result<Query, Refused> {
    if msg.len() > MAX_MESSAGE {
        return Err(Refused(None));
    }
    let mut d = BinDecoder::new(msg);
    let Ok(Header { metadata, counts }) = Header::read(&mut d) else { return Err(Refused(None)) };
    let id = metadata.id;
    if metadata.message_type == MessageType::Response {
        return Err(Refused(None));
    }
    if metadata.op_code != OpCode::Query {
        return Err(Refused(Some((id, Rcode::NotImp))));
    }
    let formerr = Refused(Some((id, Rcode::FormErr)));
    if counts.queries != 1 {
        return Err(formerr);
    }
    let question = Question::read(&mut d).map_err(|_| formerr)?;
    Ok(Query { id, recursion_desired: metadata.recursion_desired, name: host_name(question.name()), question })
}

/// The answer to `q`: `rcode`, with an A record per IPv4 address and an
/// AAAA record per IPv6 one (at most [`MAX_ANSWERS`]), authoritative,
/// each record named as the question (a pointer to it).
pub fn answer(q: &Query, rcode: Rcode, ips: &[IpAddr], ttl: u32) -> Vec<u8> {
    let mut m = Message::response(q.id, OpCode::Query);
    m.metadata.authoritative = true;
    m.metadata.recursion_desired = q.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.response_code = rcode;
    m.add_query(q.question.clone());
    for ip in ips.iter().take(MAX_ANSWERS) {
        let data = match ip {
            IpAddr::V4(v4) => RData::A(A(*v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
        };
        m.add_answer(Record::from_rdata(q.question.name().clone(), ttl, data));
    }
    m.to_vec().unwrap_or_else(|_| error(q.id, Rcode::ServFail))
}

/// An error answer with no question (for a query that could not be read).
pub fn error(id: u16, rcode: Rcode) -> Vec<u8> {
    let mut m = Message::error_msg(id, OpCode::Query, rcode);
    m.metadata.recursion_available = true;
    // A header alone always encodes.
    m.to_vec().unwrap_or_default()
}

/// A query for `name` of `qtype` (tests, benchmarks).
pub fn query(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    let name = Name::from_ascii(name).unwrap_or_default();
    m.add_query(Question::query(name, qtype));
    m.to_vec().unwrap_or_default()
}

/// An answer's id, rcode and A/AAAA records (tests, benchmarks).
pub fn read_answer(msg: &[u8]) -> Option<(u16, Rcode, Vec<IpAddr>)> {
    let m = Message::from_vec(msg).ok()?;
    let ips = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    Some((m.metadata.id, m.metadata.response_code, ips))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn u16_at(b: &[u8], i: usize) -> u16 {
        u16::from_be_bytes([b[i], b[i + 1]])
    }

    #[test]
    fn a_query_and_its_answer() {
        let q = query(0x1234, "Reviews.Shop.", RecordType::A);
        let parsed = parse_query(&q).unwrap();
        assert_eq!((parsed.id, parsed.name.as_deref(), parsed.qtype(), parsed.recursion_desired), (0x1234, Some("reviews.shop"), RecordType::A, true));
        let ips = [IpAddr::V4(Ipv4Addr::new(240, 240, 1, 2)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7))];
        let a = answer(&parsed, Rcode::NoError, &ips, 30);
        assert_eq!(read_answer(&a), Some((0x1234, Rcode::NoError, ips.to_vec())));
        // The flags: a response, authoritative, recursion desired and
        // available; the question echoed as asked, each record's name a
        // pointer to it (offset 12).
        assert_eq!(u16_at(&a, 2), 0x8580);
        assert_eq!(&a[12..q.len()], &q[12..]);
        assert_eq!(&a[q.len()..q.len() + 2], &[0xc0, 0x0c]);
        let m = Message::from_vec(&a).unwrap();
        assert!(m.answers.iter().all(|r| r.ttl == 30 && r.name.to_ascii() == "Reviews.Shop."));
        let nx = answer(&parsed, Rcode::NXDomain, &[], 30);
        assert_eq!(read_answer(&nx), Some((0x1234, Rcode::NXDomain, vec![])));
        // At most MAX_ANSWERS records, within 512 bytes for the longest name.
        let long = [&"a".repeat(63)[..]; 4].join(".");
        let q = query(1, &long[..long.len() - 2], RecordType::AAAA);
        let many = vec![IpAddr::V6(Ipv6Addr::LOCALHOST); 100];
        let a = answer(&parse_query(&q).unwrap(), Rcode::NoError, &many, 30);
        assert_eq!(read_answer(&a).unwrap().2.len(), MAX_ANSWERS);
        assert!(a.len() <= 512, "{}", a.len());
    }

    /// A header and a question from raw bytes: `qdcount` questions claimed,
    /// `question` as the bytes after the header.
    fn raw(id: u16, qdcount: u16, question: &[u8]) -> Vec<u8> {
        let mut q = Vec::new();
        q.extend_from_slice(&id.to_be_bytes());
        q.extend_from_slice(&[0x01, 0x00]);
        q.extend_from_slice(&qdcount.to_be_bytes());
        q.extend_from_slice(&[0; 6]);
        q.extend_from_slice(question);
        q
    }

    #[test]
    fn bad_queries_are_refused_with_a_code() {
        let formerr = |id| Err(Refused(Some((id, Rcode::FormErr))));
        // No header: dropped.
        assert_eq!(parse_query(&[0; 5]), Err(Refused(None)));
        assert_eq!(parse_query(&[]), Err(Refused(None)));
        // A response: dropped.
        let mut q = query(7, "a.b", RecordType::A);
        q[2] |= 0x80;
        assert_eq!(parse_query(&q), Err(Refused(None)));
        // Two questions, none, and a huge count (no question behind it).
        let mut q = query(7, "a.b", RecordType::A);
        q[5] = 2;
        assert_eq!(parse_query(&q), formerr(7));
        assert_eq!(parse_query(&raw(8, 0, &[])), formerr(8));
        assert_eq!(parse_query(&raw(9, u16::MAX, &[1, b'a', 0, 0, 1, 0, 1])), formerr(9));
        // Truncated: in the name, in the type, in the class.
        let q = query(7, "abc.b", RecordType::A);
        for cut in [14, q.len() - 3, q.len() - 1] {
            assert_eq!(parse_query(&q[..cut]), formerr(7), "cut at {cut}");
        }
        // Compression loops: a pointer to itself, and two pointing at each
        // other.
        assert_eq!(parse_query(&raw(10, 1, &[0xc0, 12, 0, 1, 0, 1])), formerr(10));
        assert_eq!(parse_query(&raw(11, 1, &[1, b'a', 0xc0, 16, 0xc0, 12, 0, 1, 0, 1])), formerr(11));
        // A pointer past the end.
        assert_eq!(parse_query(&raw(12, 1, &[0xc0, 200, 0, 1, 0, 1])), formerr(12));
        // A label longer than 63 bytes (a reserved label type).
        let mut long = vec![64];
        long.extend_from_slice(&[b'a'; 64]);
        long.extend_from_slice(&[0, 0, 1, 0, 1]);
        assert_eq!(parse_query(&raw(13, 1, &long)), formerr(13));
        // A name longer than 255 bytes.
        let mut name = Vec::new();
        for _ in 0..5 {
            name.push(63);
            name.extend_from_slice(&[b'a'; 63]);
        }
        name.extend_from_slice(&[0, 0, 1, 0, 1]);
        assert_eq!(parse_query(&raw(14, 1, &name)), formerr(14));
        // Another opcode (UPDATE): not implemented.
        let mut q = query(7, "a.b", RecordType::A);
        q[2] |= 0x28;
        assert_eq!(parse_query(&q), Err(Refused(Some((7, Rcode::NotImp)))));
        // More than MAX_MESSAGE bytes: dropped.
        let mut big = query(7, "a.b", RecordType::A);
        big.resize(MAX_MESSAGE + 1, 0);
        assert_eq!(parse_query(&big), Err(Refused(None)));
        // Odd bytes in a label: readable, but not a host name.
        assert_eq!(parse_query(&raw(3, 1, &[3, b'a', b' ', b'b', 1, b'c', 0, 0, 1, 0, 1])).unwrap().name, None);
        // The error answers: a header with the code.
        assert_eq!(read_answer(&error(3, Rcode::ServFail)), Some((3, Rcode::ServFail, vec![])));
        assert_eq!(error(3, Rcode::FormErr).len(), 12);
    }

    /// Whatever the bytes, no panic: every prefix and every single-byte
    /// change of a query decodes to a query or a refusal.
    #[test]
    fn no_input_panics() {
        let q = query(0xbeef, "reviews.shop.svc.cluster.local", RecordType::AAAA);
        for cut in 0..q.len() {
            let _ = parse_query(&q[..cut]);
        }
        for i in 0..q.len() {
            for b in [0x00, 0x01, 0x3f, 0x40, 0x7f, 0x80, 0xc0, 0xff] {
                let mut m = q.clone();
                m[i] = b;
                if let Ok(parsed) = parse_query(&m) {
                    let a = answer(&parsed, Rcode::NoError, &[IpAddr::V4(Ipv4Addr::LOCALHOST)], 30);
                    assert_eq!(read_answer(&a).map(|a| a.0), Some(parsed.id), "byte {i} = {b:#x}");
                }
            }
        }
    }
}
