//! The agent's DNS proxy (`lodestar agent --capture --capture-dns`), as
//! Istio's agent runs one (`ISTIO_META_DNS_CAPTURE`): the capture rules
//! send the host's DNS (UDP and TCP port 53 to its `/etc/resolv.conf`
//! nameservers) to 127.0.0.1:15053, where
//!
//! - a mesh name (the proxy's name table, [`nds`]: its reachable services
//!   with their short forms) is answered at once: its IPv4 addresses for A,
//!   no records for AAAA or any other type (NODATA);
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
//! Bounded: messages of at most [`message::MAX_MESSAGE`] bytes, at most
//! [`MAX_FORWARDS`] forwarded queries in flight (more are answered
//! SERVFAIL), [`MAX_TCP`] TCP connections (more are closed), each idle for
//! at most [`TCP_IDLE`].

pub mod message;
pub mod nds;

use anyhow::{Context as _, Result};
use message::{Query, Rcode, Refused};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
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

/// The names the proxy answers: each with its IPv4 addresses.
#[derive(Debug, Default)]
pub struct Names {
    by_name: HashMap<String, Vec<Ipv4Addr>>,
    /// Wildcard hosts by what follows their `*.` (`api.example`).
    wildcards: HashMap<String, Vec<Ipv4Addr>>,
    /// `svc.DOMAIN`: an unknown name under it is NXDOMAIN.
    service_domain: String,
}

/// What the proxy does with a name.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    Mesh(&'a [Ipv4Addr]),
    NxDomain,
    Forward,
}

impl Names {
    /// From a name table (`translate::dns::NameTable`); `domain` is the
    /// mesh's (`cluster.local`).
    pub fn from_table(table: &lodestar_model::dns::NameTable, domain: &str) -> Names {
        let (mut by_name, mut wildcards) = (HashMap::new(), HashMap::new());
        for (host, info) in &table.table {
            let ips: Vec<Ipv4Addr> = info.ips.iter().filter_map(|a| a.parse().ok()).collect();
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

    /// The answer for a query read from `msg`, if it is for a mesh name (or
    /// under the service domain); None: forward it.
    pub fn answer(&self, q: &Query, msg: &[u8]) -> Option<Vec<u8>> {
        let name = q.name.as_deref()?;
        match self.lookup(name) {
            Lookup::Forward => None,
            Lookup::NxDomain => Some(message::answer(q, msg, Rcode::NxDomain, &[], TTL)),
            // A for class IN; anything else for a mesh name: no records.
            Lookup::Mesh(ips) if q.qtype == message::TYPE_A && q.qclass == message::CLASS_IN => Some(message::answer(q, msg, Rcode::NoError, ips, TTL)),
            Lookup::Mesh(_) => Some(message::answer(q, msg, Rcode::NoError, &[], TTL)),
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
        Ok(q) => match names.answer(&q, msg) {
            Some(a) => Some(a),
            None => Some(forward().await.unwrap_or_else(|| message::answer(&q, msg, Rcode::ServFail, &[], 0))),
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
                if let Some(a) = table.answer(&q, &msg) {
                    let _ = udp.send_to(&a, from).await;
                    continue;
                }
                let Ok(permit) = forwards.clone().try_acquire_owned() else {
                    let _ = udp.send_to(&message::answer(&q, &msg, Rcode::ServFail, &[], 0), from).await;
                    continue;
                };
                let (udp, upstreams) = (udp.clone(), upstreams.clone());
                tokio::spawn(async move {
                    let a = forward_udp(&upstreams, &msg).await.unwrap_or_else(|| message::answer(&q, &msg, Rcode::ServFail, &[], 0));
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

    fn names() -> Names {
        let mut table = NameTable::default();
        table.table.insert(
            "reviews.shop.svc.cluster.local".into(),
            NameInfo { ips: vec!["198.19.0.10".into()], alt_hosts: vec!["reviews".into(), "reviews.shop".into()], ..Default::default() },
        );
        table.table.insert("db.example.com".into(), NameInfo { ips: vec!["240.240.1.2".into()], ..Default::default() });
        table.table.insert("*.api.example".into(), NameInfo { ips: vec!["198.18.1.50".into()], ..Default::default() });
        table.table.insert("*.eu.api.example".into(), NameInfo { ips: vec!["198.18.1.51".into()], ..Default::default() });
        Names::from_table(&table, "cluster.local")
    }

    #[test]
    fn names_under_a_wildcard_host() {
        let n = names();
        let (any, eu) = ([Ipv4Addr::new(198, 18, 1, 50)], [Ipv4Addr::new(198, 18, 1, 51)]);
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
        assert_eq!(n.len(), 6);
        // The answer names the question (a pointer to it), as Istio's does.
        let q = message::query(8, "V1.Api.Example", message::TYPE_A);
        let a = n.answer(&message::parse_query(&q).unwrap(), &q).unwrap();
        assert_eq!(message::read_answer(&a), Some((8, 0, any.to_vec())));
    }

    #[test]
    fn mesh_names_short_forms_and_the_rest() {
        let n = names();
        let ip = [Ipv4Addr::new(198, 19, 0, 10)];
        for name in ["reviews", "reviews.shop", "reviews.shop.svc.cluster.local"] {
            assert_eq!(n.lookup(name), Lookup::Mesh(&ip), "{name}");
        }
        assert_eq!(n.lookup("ratings.shop.svc.cluster.local"), Lookup::NxDomain);
        assert_eq!(n.lookup("example.org"), Lookup::Forward);
        assert_eq!(n.lookup("svc.cluster.local"), Lookup::Forward);
        // AAAA for a mesh name: NOERROR, no records.
        let q = message::query(5, "DB.example.com", message::TYPE_AAAA);
        let a = n.answer(&message::parse_query(&q).unwrap(), &q).unwrap();
        assert_eq!(message::read_answer(&a), Some((5, 0, vec![])));
        let q = message::query(6, "db.example.com", message::TYPE_A);
        let a = n.answer(&message::parse_query(&q).unwrap(), &q).unwrap();
        assert_eq!(message::read_answer(&a), Some((6, 0, vec![Ipv4Addr::new(240, 240, 1, 2)])));
        let q = message::query(7, "example.org", message::TYPE_A);
        assert!(n.answer(&message::parse_query(&q).unwrap(), &q).is_none());
    }

    #[test]
    fn resolv_conf_nameservers() {
        let text = "# comment\nsearch example.com\nnameserver 198.18.0.1\nnameserver ::1\nnameserver 198.18.0.1\nnameserver 10.0.0.2 # x\noptions ndots:5\n";
        assert_eq!(nameservers(text), [Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(10, 0, 0, 2)]);
    }
}
