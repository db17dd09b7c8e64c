//! DNS answer time of the agent's DNS proxy (`lodestar agent
//! --capture-dns`), over UDP on loopback, one query at a time, as an
//! application's resolver asks: p50/p99 of the round trip for
//!
//! - a mesh name (answered from a name table of 1,000 services with their
//!   short forms: 4,000 names), and
//! - a forwarded name (to a local upstream resolver that answers at once:
//!   the proxy's own cost of forwarding, without a real resolver's).
//!
//! The proxy marks its upstream sockets (SO_MARK), which needs
//! CAP_NET_ADMIN: run as root (as a capturing agent runs).
//!
//! cargo bench --bench dns   (LODESTAR_BENCH_QUERIES=N, default 20,000)

use lodestar::agent::dns::{self, message, DnsOptions, Names};
use lodestar::translate::dns::{NameInfo, NameTable};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use tokio::sync::watch;

fn queries() -> usize {
    std::env::var("LODESTAR_BENCH_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

fn table(services: usize) -> Names {
    let mut t = NameTable::default();
    for i in 0..services {
        let name = format!("svc-{i}");
        t.table.insert(
            format!("{name}.bench.svc.cluster.local"),
            NameInfo {
                ips: vec![format!("240.240.{}.{}", i / 250, i % 250 + 1)],
                alt_hosts: vec![name.clone(), format!("{name}.bench"), format!("{name}.bench.svc")],
                ..Default::default()
            },
        );
    }
    Names::from_table(&t, "cluster.local")
}

/// An upstream resolver that answers every query at once (NXDOMAIN).
async fn upstream() -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, from)) = sock.recv_from(&mut buf).await {
            let q = &buf[..n];
            if let Ok(parsed) = message::parse_query(q) {
                let _ = sock.send_to(&message::answer(&parsed, message::Rcode::NXDomain, &[], 0), from).await;
            }
        }
    });
    addr
}

/// p50, p99 and max of `n` sequential round trips for `name`.
async fn measure(client: &UdpSocket, proxy: SocketAddr, name: &str, n: usize, want_rcode: message::Rcode) -> (Duration, Duration, Duration) {
    let mut times = Vec::with_capacity(n);
    let mut buf = vec![0u8; 4096];
    for i in 0..n {
        let q = message::query(i as u16, name, message::RecordType::A);
        let start = Instant::now();
        client.send_to(&q, proxy).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf)).await.expect("an answer within 5 s").unwrap();
        times.push(start.elapsed());
        let (id, rcode, _) = message::read_answer(&buf[..got]).expect("an answer");
        assert_eq!((id, rcode), (i as u16, want_rcode), "{name}");
    }
    times.sort();
    (times[n / 2], times[n * 99 / 100], times[n - 1])
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs it once, briefly.
    let n = if std::env::args().any(|a| a == "--bench") { queries() } else { 100 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let upstream = upstream().await;
        let opts = DnsOptions { listen: "127.0.0.1:0".parse().unwrap(), upstreams: vec![upstream] };
        let sockets = dns::bind(&opts).await.unwrap();
        let proxy = sockets.0.local_addr().unwrap();
        let (_names_tx, names_rx) = watch::channel(Arc::new(table(1000)));
        let (_stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(dns::serve(opts, sockets, names_rx, stop_rx));
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        println!("DNS answer time, {n} sequential UDP queries each (loopback; 1,000 services, 4,000 names)");
        for (what, name, rcode) in [("mesh name", "svc-517.bench", message::Rcode::NoError), ("forwarded", "example.org", message::Rcode::NXDomain)] {
            // Warm up, then measure.
            measure(&client, proxy, name, n.min(1000), rcode).await;
            let (p50, p99, max) = measure(&client, proxy, name, n, rcode).await;
            println!("{what:>10}: p50 {p50:?}  p99 {p99:?}  max {max:?}");
        }
    });
}
