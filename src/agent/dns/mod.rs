//! The agent's DNS proxy (`lodestar agent --capture --capture-dns`), as
//! Istio's agent runs one (`ISTIO_META_DNS_CAPTURE`): the capture rules
//! send the host's DNS (UDP and TCP port 53 to its `/etc/resolv.conf`
//! nameservers) to 127.0.0.1:15053, where
//!
//! - a mesh name (the proxy's name table, [`nds`]: its reachable services
//!   with their short forms) is answered at once: its IPv4 addresses for A,
//!   its IPv6 ones for AAAA, and no records (NODATA, never forwarded, as
//!   Istio's agent) for a family it has no address of or any other type;
//! - a name under a wildcard host of the table (`*.api.example`: any
//!   `a.api.example`, `a.b.api.example`, the most specific wildcard first),
//!   as Istio's agent does, is answered with the wildcard's addresses;
//! - an unknown name under the mesh's service domain (`svc.cluster.local`)
//!   is NXDOMAIN, as the cluster's DNS would say;
//! - everything else is forwarded, as bytes, to the upstream resolvers
//!   (the nameservers the rules capture), from sockets marked
//!   [`DNS_MARK`](super::capture::rules::DNS_MARK) so the rules let them
//!   pass.
//!
//! Messages are decoded and encoded with `hickory-proto` ([`message`]).
//! Bounded: messages of at most [`message::MAX_MESSAGE`] bytes, at most
//! [`MAX_FORWARDS`] forwarded queries in flight (more are answered
//! SERVFAIL), [`MAX_TCP`] TCP connections (more are closed), each idle for
//! at most [`TCP_IDLE`].

pub mod message;
pub mod nds;

use anyhow::{Context as _, Result};
use message::{DNSClass, Query, Rcode, RecordType, Refused};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{watch, Semaphore};

/// Forwarded queries in flight, at most.
pub const MAX_FORWARDS: usize = 256;
/// TCP connections at once, at most.
pub const MAX_TCP: usize = 64;
/// A TCP connection with no query for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// One upstream resolver's time to answer before the next is asked.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// The TTL of mesh answers (Istio's agent answers with 30 s).
pub const TTL: u32 = 30;
/// The most names a table holds (its entries and their short forms).
pub const MAX_NAMES: usize = 200_000;

/// The names the proxy answers: each with its addresses (IPv4 and IPv6).
#[derive(Debug, Default)]
pub struct Names {
    by_name: HashMap<String, Vec<IpAddr>>,
    /// Wildcard hosts by what follows their `*.` (`api.example`).
    wildcards: HashMap<String, Vec<IpAddr>>,
    /// `svc.DOMAIN`: an unknown name under it is NXDOMAIN.
    service_domain: String,
}

/// What the proxy does with a name.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    Mesh(&'a [IpAddr]),
    NxDomain,
    Forward,
}

impl Names {
    /// From a name table (`translate::dns::NameTable`); `domain` is the
    /// mesh's (`cluster.local`).
    pub fn from_table(table: &lodestar_model::dns::NameTable, domain: &str) -> Names {
        let (mut by_name, mut wildcards) = (HashMap::new(), HashMap::new());
        for (host, info) in &table.table {
            let ips: Vec<IpAddr> = info.ips.iter().filter_map(|a| a.parse().ok()).collect();
            for name in std::iter::once(host).chain(&info.alt_hosts) {
                if by_name.len() + wildcards.len() >= MAX_NAMES {
                    break;
                }
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                match name.strip_prefix("*.") {
                    Some(domain) => wildcards.entry(domain.to_string()),
                    None => by_name.entry(name),
                }
                .or_insert_with(|| ips.clone());
            }
        }
        Names { by_name, wildcards, service_domain: format!("svc.{domain}") }
    }

    pub fn len(&self) -> usize {
        self.by_name.len() + self.wildcards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn lookup(&self, name: &str) -> Lookup<'_> {
        if let Some(ips) = self.by_name.get(name) {
            return Lookup::Mesh(ips);
        }
        // The wildcards over it, longest first: for `a.b.api.example`,
        // `*.b.api.example`, `*.api.example`, `*.example`.
        if !self.wildcards.is_empty() {
            let parents = name.match_indices('.').map(|(i, _)| &name[i + 1..]);
            if let Some(ips) = parents.filter(|d| !d.is_empty()).find_map(|d| self.wildcards.get(d)) {
                return Lookup::Mesh(ips);
            }
        }
        let under = |d: &str| !d.is_empty() && name.strip_suffix(d).is_some_and(|rest| rest.ends_with('.'));
        if under(&self.service_domain) {
            Lookup::NxDomain
        } else {
            Lookup::Forward
        }
    }

    /// The answer for a query, if it is for a mesh name (or under the
    /// service domain); None: forward it.
    pub fn answer(&self, q: &Query) -> Option<Vec<u8>> {
        let name = q.name.as_deref()?;
        match self.lookup(name) {
            Lookup::Forward => None,
            Lookup::NxDomain => Some(message::answer(q, Rcode::NXDomain, &[], TTL)),
            Lookup::Mesh(ips) => {
                // A and AAAA of class IN: the addresses of that family
                // (none: NODATA); anything else: no records.
                let family: fn(&IpAddr) -> bool = match (q.qtype(), q.qclass()) {
                    (RecordType::A, DNSClass::IN) => IpAddr::is_ipv4,
                    (RecordType::AAAA, DNSClass::IN) => IpAddr::is_ipv6,
                    _ => |_| false,
                };
                let ips: Vec<IpAddr> = ips.iter().copied().filter(family).collect();
                Some(message::answer(q, Rcode::NoError, &ips, TTL))
            }
        }
    }
}

/// The nameservers (IPv4) of a `resolv.conf`.
pub fn nameservers(resolv_conf: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    for line in resolv_conf.lines() {
        let mut w = line.split_whitespace();
        if w.next() == Some("nameserver") {
            if let Some(ip) = w.next().and_then(|a| a.parse::<Ipv4Addr>().ok()) {
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
    }
    out
}

/// What the DNS proxy runs with.
#[derive(Debug, Clone)]
pub struct DnsOptions {
    /// Where it listens, UDP and TCP (127.0.0.1:15053).
    pub listen: SocketAddr,
    /// Where other names go, in order (each port 53).
    pub upstreams: Vec<SocketAddr>,
}

/// Set the socket mark the capture rules let pass (needs CAP_NET_ADMIN,
/// which a capturing agent has).
fn mark(fd: &impl AsRawFd) -> std::io::Result<()> {
    let mark: libc::c_uint = super::capture::rules::DNS_MARK;
    // SAFETY: a valid descriptor, and a pointer to a c_uint of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            &mark as *const _ as *const libc::c_void,
            size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Ask the upstreams (in turn) over UDP; the first answer with the query's
/// id.
async fn forward_udp(upstreams: &[SocketAddr], msg: &[u8]) -> Option<Vec<u8>> {
    let id = msg.get(..2)?;
    for up in upstreams {
        let Ok(sock) = UdpSocket::bind("0.0.0.0:0").await else { return None };
        if let Err(e) = mark(&sock) {
            tracing::warn!(error = %e, "DNS proxy: cannot mark the upstream socket; forwarding would loop");
            return None;
        }
        if sock.send_to(msg, up).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; message::MAX_MESSAGE];
        let got = tokio::time::timeout(UPSTREAM_TIMEOUT, async {
            loop {
                let (n, from) = sock.recv_from(&mut buf).await.ok()?;
                if from == *up && buf.get(..2) == Some(id) {
                    return Some(n);
                }
            }
        })
        .await;
        if let Ok(Some(n)) = got {
            buf.truncate(n);
            return Some(buf);
        }
    }
    None
}

/// One DNS message over TCP (two-byte length first).
async fn read_tcp(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = s.read_u16().await? as usize;
    if len > message::MAX_MESSAGE {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "message too large"));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await?;
    Ok(buf)
}

async fn write_tcp(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(msg.len() + 2);
    out.extend_from_slice(&(msg.len().min(u16::MAX as usize) as u16).to_be_bytes());
    out.extend_from_slice(msg);
    s.write_all(&out).await
}

/// Ask the upstreams (in turn) over TCP.
async fn forward_tcp(upstreams: &[SocketAddr], msg: &[u8]) -> Option<Vec<u8>> {
    for up in upstreams {
        let attempt = async {
            let sock = tokio::net::TcpSocket::new_v4().ok()?;
            mark(&sock).ok()?;
            let mut s = sock.connect(*up).await.ok()?;
            write_tcp(&mut s, msg).await.ok()?;
            read_tcp(&mut s).await.ok()
        };
        if let Ok(Some(answer)) = tokio::time::timeout(UPSTREAM_TIMEOUT, attempt).await {
            return Some(answer);
        }
    }
    None
}

/// The answer to one message: from the table, else from an upstream
/// (`forward`), else an error; None: nothing to answer.
async fn respond<F, Fut>(names: &Names, msg: &[u8], forward: F) -> Option<Vec<u8>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Option<Vec<u8>>>,
{
    match message::parse_query(msg) {
        Err(Refused(None)) => None,
        Err(Refused(Some((id, rcode)))) => Some(message::error(id, rcode)),
        Ok(q) => match names.answer(&q) {
            Some(a) => Some(a),
            None => Some(forward().await.unwrap_or_else(|| message::answer(&q, Rcode::ServFail, &[], 0))),
        },
    }
}

/// Until `shutdown` says stop (the guard `wait_for` returns is dropped
/// here, so a spawned loop's future stays `Send`).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// Bind the proxy's sockets (before the capture sends anything there).
pub async fn bind(opts: &DnsOptions) -> Result<(UdpSocket, TcpListener)> {
    let udp = UdpSocket::bind(opts.listen).await.with_context(|| format!("the DNS proxy: binding udp {}", opts.listen))?;
    let tcp = TcpListener::bind(opts.listen).await.with_context(|| format!("the DNS proxy: binding tcp {}", opts.listen))?;
    Ok((udp, tcp))
}

/// Serve DNS on `sockets` until `shutdown`, answering from `names`.
pub async fn serve(opts: DnsOptions, sockets: (UdpSocket, TcpListener), names: watch::Receiver<Arc<Names>>, mut shutdown: watch::Receiver<bool>) -> Result<()> {
    let (udp, tcp) = sockets;
    let udp = Arc::new(udp);
    let upstreams: Arc<[SocketAddr]> = opts.upstreams.into();
    let forwards = Arc::new(Semaphore::new(MAX_FORWARDS));
    let conns = Arc::new(Semaphore::new(MAX_TCP));
    tracing::info!(listen = %opts.listen, upstreams = ?upstreams, "DNS proxy: answering mesh names, forwarding the rest");
    let mut buf = vec![0u8; message::MAX_MESSAGE];
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return Ok(()),
            r = udp.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                let msg = buf[..n].to_vec();
                let table = names.borrow().clone();
                let q = match message::parse_query(&msg) {
                    Ok(q) => q,
                    Err(Refused(Some((id, rcode)))) => {
                        let _ = udp.send_to(&message::error(id, rcode), from).await;
                        continue;
                    }
                    Err(Refused(None)) => continue,
                };
                if let Some(a) = table.answer(&q) {
                    let _ = udp.send_to(&a, from).await;
                    continue;
                }
                let Ok(permit) = forwards.clone().try_acquire_owned() else {
                    let _ = udp.send_to(&message::answer(&q, Rcode::ServFail, &[], 0), from).await;
                    continue;
                };
                let (udp, upstreams) = (udp.clone(), upstreams.clone());
                tokio::spawn(async move {
                    let a = forward_udp(&upstreams, &msg).await.unwrap_or_else(|| message::answer(&q, Rcode::ServFail, &[], 0));
                    let _ = udp.send_to(&a, from).await;
                    drop(permit);
                });
            }
            r = tcp.accept() => {
                let Ok((mut s, _)) = r else { continue };
                let Ok(permit) = conns.clone().try_acquire_owned() else { continue };
                let (names, upstreams, forwards) = (names.clone(), upstreams.clone(), forwards.clone());
                tokio::spawn(async move {
                    while let Ok(Ok(msg)) = tokio::time::timeout(TCP_IDLE, read_tcp(&mut s)).await {
                        let table = names.borrow().clone();
                        let (up, fw, query) = (upstreams.clone(), forwards.clone(), msg.clone());
                        let forward = || async move {
                            let _permit = fw.try_acquire_owned().ok()?;
                            forward_tcp(&up, &query).await
                        };
                        let Some(a) = respond(&table, &msg, forward).await else { break };
                        if write_tcp(&mut s, &a).await.is_err() {
                            break;
                        }
                    }
                    drop(permit);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lodestar_model::dns::{NameInfo, NameTable};
    use std::net::Ipv6Addr;

    fn info(ips: &[&str], alt_hosts: &[&str]) -> NameInfo {
        NameInfo { ips: ips.iter().map(|s| s.to_string()).collect(), alt_hosts: alt_hosts.iter().map(|s| s.to_string()).collect(), ..Default::default() }
    }

    fn names() -> Names {
        let mut table = NameTable::default();
        table.table.insert("reviews.shop.svc.cluster.local".into(), info(&["198.19.0.10"], &["reviews", "reviews.shop"]));
        table.table.insert("db.example.com".into(), info(&["240.240.1.2"], &[]));
        table.table.insert("*.api.example".into(), info(&["198.18.1.50"], &[]));
        table.table.insert("*.eu.api.example".into(), info(&["198.18.1.51"], &[]));
        // Dual stack, IPv6 only, and a wildcard with both.
        table.table.insert("dual.example.com".into(), info(&["198.18.2.1", "fd00::2:1", "fd00::2:2"], &[]));
        table.table.insert("v6.example.com".into(), info(&["fd00::6"], &[]));
        table.table.insert("*.v6.example".into(), info(&["fd00::7", "198.18.2.7"], &[]));
        Names::from_table(&table, "cluster.local")
    }

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    fn v6(s: &str) -> IpAddr {
        s.parse::<Ipv6Addr>().unwrap().into()
    }

    /// The answer to a query for `name` of `qtype`: id, rcode, records.
    fn ask(n: &Names, id: u16, name: &str, qtype: RecordType) -> Option<(u16, Rcode, Vec<IpAddr>)> {
        let q = message::query(id, name, qtype);
        let a = n.answer(&message::parse_query(&q).unwrap())?;
        Some(message::read_answer(&a).unwrap())
    }

    #[test]
    fn names_under_a_wildcard_host() {
        let n = names();
        let (any, eu) = ([v4(198, 18, 1, 50)], [v4(198, 18, 1, 51)]);
        for name in ["v1.api.example", "a.b.api.example"] {
            assert_eq!(n.lookup(name), Lookup::Mesh(&any), "{name}");
        }
        // The most specific wildcard.
        assert_eq!(n.lookup("fr.eu.api.example"), Lookup::Mesh(&eu));
        assert_eq!(n.lookup("eu.api.example"), Lookup::Mesh(&any));
        // Not the wildcard's own domain, nor a sibling, nor `*` itself.
        for name in ["api.example", "api.example.org", "xapi.example", "example"] {
            assert_eq!(n.lookup(name), Lookup::Forward, "{name}");
        }
        assert_eq!(n.len(), 9);
        // The answer names the question (a pointer to it), as Istio's does.
        assert_eq!(ask(&n, 8, "V1.Api.Example", RecordType::A), Some((8, Rcode::NoError, any.to_vec())));
    }

    #[test]
    fn mesh_names_short_forms_and_the_rest() {
        let n = names();
        let ip = [v4(198, 19, 0, 10)];
        for name in ["reviews", "reviews.shop", "reviews.shop.svc.cluster.local"] {
            assert_eq!(n.lookup(name), Lookup::Mesh(&ip), "{name}");
        }
        assert_eq!(n.lookup("ratings.shop.svc.cluster.local"), Lookup::NxDomain);
        assert_eq!(n.lookup("example.org"), Lookup::Forward);
        assert_eq!(n.lookup("svc.cluster.local"), Lookup::Forward);
        // AAAA for an IPv4-only mesh name: NOERROR, no records (NODATA),
        // not forwarded.
        assert_eq!(ask(&n, 5, "DB.example.com", RecordType::AAAA), Some((5, Rcode::NoError, vec![])));
        assert_eq!(ask(&n, 6, "db.example.com", RecordType::A), Some((6, Rcode::NoError, vec![v4(240, 240, 1, 2)])));
        // Other types for a mesh name: no records.
        assert_eq!(ask(&n, 6, "db.example.com", RecordType::MX), Some((6, Rcode::NoError, vec![])));
        // Unknown under the service domain: NXDOMAIN for any type.
        for t in [RecordType::A, RecordType::AAAA] {
            assert_eq!(ask(&n, 9, "ratings.shop.svc.cluster.local", t), Some((9, Rcode::NXDomain, vec![])));
        }
        assert!(ask(&n, 7, "example.org", RecordType::A).is_none());
        assert!(ask(&n, 7, "example.org", RecordType::AAAA).is_none());
    }

    #[test]
    fn aaaa_answers_and_nodata_by_family() {
        let n = names();
        let both = (RecordType::A, RecordType::AAAA);
        assert_eq!(ask(&n, 1, "dual.example.com", both.0), Some((1, Rcode::NoError, vec![v4(198, 18, 2, 1)])));
        assert_eq!(ask(&n, 2, "dual.example.com", both.1), Some((2, Rcode::NoError, vec![v6("fd00::2:1"), v6("fd00::2:2")])));
        // IPv6 only: AAAA answered, A is NODATA (not forwarded).
        assert_eq!(ask(&n, 3, "v6.example.com", both.1), Some((3, Rcode::NoError, vec![v6("fd00::6")])));
        assert_eq!(ask(&n, 4, "V6.Example.Com", both.0), Some((4, Rcode::NoError, vec![])));
        // A wildcard's concrete names, by family.
        assert_eq!(ask(&n, 5, "a.b.v6.example", both.1), Some((5, Rcode::NoError, vec![v6("fd00::7")])));
        assert_eq!(ask(&n, 6, "a.v6.example", both.0), Some((6, Rcode::NoError, vec![v4(198, 18, 2, 7)])));
    }

    async fn udp_exchange(c: &UdpSocket, to: SocketAddr, q: &[u8]) -> (u16, Rcode, Vec<IpAddr>) {
        c.send_to(q, to).await.unwrap();
        let mut buf = vec![0u8; message::MAX_MESSAGE];
        let n = tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf)).await.expect("an answer within 5 s").unwrap();
        message::read_answer(&buf[..n]).unwrap()
    }

    async fn tcp_exchange(s: &mut TcpStream, q: &[u8]) -> (u16, Rcode, Vec<IpAddr>) {
        write_tcp(s, q).await.unwrap();
        let a = tokio::time::timeout(Duration::from_secs(5), read_tcp(s)).await.expect("an answer within 5 s").unwrap();
        message::read_answer(&a).unwrap()
    }

    /// The proxy itself, on loopback: bad packets get FORMERR (or
    /// nothing) and the next query is answered, over UDP and TCP; a name
    /// to forward with no upstream is SERVFAIL.
    #[tokio::test]
    async fn serve_answers_over_udp_and_tcp_and_survives_bad_packets() {
        let opts = DnsOptions { listen: "127.0.0.1:0".parse().unwrap(), upstreams: Vec::new() };
        let sockets = bind(&opts).await.unwrap();
        let (udp_at, tcp_at) = (sockets.0.local_addr().unwrap(), sockets.1.local_addr().unwrap());
        let (_names_tx, names_rx) = watch::channel(Arc::new(names()));
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(serve(opts, sockets, names_rx, stop_rx));
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let header = |id: u8, qd: u16| [vec![0, id, 1, 0], qd.to_be_bytes().to_vec(), vec![0; 6]].concat();
        // No header, and a response: no answer (the next one is the query's).
        c.send_to(&[0; 5], udp_at).await.unwrap();
        c.send_to(&message::answer(&message::parse_query(&message::query(1, "a.b", RecordType::A)).unwrap(), Rcode::NoError, &[], 0), udp_at).await.unwrap();
        // A compression loop, a huge question count, a truncated name.
        for (id, bad) in [(2u8, [header(2, 1), vec![0xc0, 12, 0, 1, 0, 1]].concat()), (3, header(3, u16::MAX)), (4, [header(4, 1), vec![9, b'a']].concat())] {
            assert_eq!(udp_exchange(&c, udp_at, &bad).await, (id as u16, Rcode::FormErr, vec![]));
        }
        let q = message::query(5, "dual.example.com", RecordType::AAAA);
        assert_eq!(udp_exchange(&c, udp_at, &q).await, (5, Rcode::NoError, vec![v6("fd00::2:1"), v6("fd00::2:2")]));
        let q = message::query(6, "example.org", RecordType::A);
        assert_eq!(udp_exchange(&c, udp_at, &q).await, (6, Rcode::ServFail, vec![]));
        // TCP: a bad message, then A and AAAA on the same connection.
        let mut s = TcpStream::connect(tcp_at).await.unwrap();
        assert_eq!(tcp_exchange(&mut s, &header(7, 2)).await, (7, Rcode::FormErr, vec![]));
        assert_eq!(tcp_exchange(&mut s, &message::query(8, "reviews", RecordType::A)).await, (8, Rcode::NoError, vec![v4(198, 19, 0, 10)]));
        assert_eq!(tcp_exchange(&mut s, &message::query(9, "reviews", RecordType::AAAA)).await, (9, Rcode::NoError, vec![]));
        assert_eq!(tcp_exchange(&mut s, &message::query(10, "v6.example.com", RecordType::AAAA)).await, (10, Rcode::NoError, vec![v6("fd00::6")]));
        stop_tx.send_replace(true);
        task.await.unwrap().unwrap();
    }

    #[test]
    fn resolv_conf_nameservers() {
        let text = "# comment\nsearch example.com\nnameserver 198.18.0.1\nnameserver ::1\nnameserver 198.18.0.1\nnameserver 10.0.0.2 # x\noptions ndots:5\n";
        assert_eq!(nameservers(text), [Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(10, 0, 0, 2)]);
    }
}
