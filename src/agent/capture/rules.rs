//! The redirect rules of `lodestar agent --capture`, as text for
//! `iptables-restore --noflush`: a pure function of [`CaptureOptions`]
//! (golden tested below), the same rules Istio's `istio-iptables` writes
//! in REDIRECT mode, with our chain names.
//!
//! ```text
//! PREROUTING -p tcp -> LODESTAR_INBOUND
//!   excluded ports (--exclude-inbound-ports) -> RETURN
//!   --include-inbound-ports (each, or all: `*`) -> LODESTAR_IN_REDIRECT -> REDIRECT 15006
//! OUTPUT -p tcp -> LODESTAR_OUTPUT
//!   from 127.0.0.6 over lo (Envoy's inbound passthrough) -> RETURN
//!   Envoy (uid/gid) to a local address but 127.0.0.1 over lo -> LODESTAR_IN_REDIRECT
//!   others over lo -> RETURN; Envoy's own (uid, gid) -> RETURN
//!   to 127.0.0.1, excluded ports, excluded CIDRs (the replicas) -> RETURN
//!   to --include-outbound-cidrs (or all) -> LODESTAR_REDIRECT -> REDIRECT 15001
//! with --capture-dns, before those (Istio's DNS capture):
//! OUTPUT -p udp/tcp --dport 53 -> LODESTAR_DNS
//!   the agent's own queries (socket mark 1337), Envoy's (uid/gid) -> RETURN
//!   to a resolv.conf nameserver -> REDIRECT 15053 (the agent's DNS proxy)
//! and in LODESTAR_OUTPUT the agent's marked (TCP) queries -> RETURN
//! ```
//!
//! The removal is the inverse: the jumps from the built-in chains are
//! deleted (`-D`), then the chains flushed and deleted (`-F`, `-X`), which
//! removes only what these rules added.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

/// Envoy's outbound capture port (Istio's).
pub const OUTBOUND_PORT: u16 = 15001;
/// Envoy's inbound capture port (Istio's).
pub const INBOUND_PORT: u16 = 15006;
/// Istio's proxy uid and gid.
pub const DEFAULT_PROXY_ID: u32 = 1337;
/// Inbound ports never captured unless included by name: SSH (a VM stays
/// reachable) and the ports Istio's VMs exclude (15020, 15021, 15090).
pub const DEFAULT_EXCLUDED_INBOUND: &[u16] = &[22, 15020, 15021, 15090];
/// The source address of Envoy's inbound passthrough connections (Istio's).
pub const INBOUND_PASSTHROUGH_SOURCE: &str = "127.0.0.6";

/// Our chains, in the nat table. A chain of this name is ours: another
/// tool's rules never use them.
pub const OUTPUT_CHAIN: &str = "LODESTAR_OUTPUT";
pub const REDIRECT_CHAIN: &str = "LODESTAR_REDIRECT";
pub const INBOUND_CHAIN: &str = "LODESTAR_INBOUND";
pub const IN_REDIRECT_CHAIN: &str = "LODESTAR_IN_REDIRECT";
pub const DNS_CHAIN: &str = "LODESTAR_DNS";
pub const CHAINS: [&str; 5] = [INBOUND_CHAIN, REDIRECT_CHAIN, IN_REDIRECT_CHAIN, OUTPUT_CHAIN, DNS_CHAIN];

/// The agent's DNS proxy port (Istio's).
pub const DNS_PORT: u16 = 15053;
/// The socket mark of the agent's own queries to the upstream resolvers
/// (never captured).
pub const DNS_MARK: u32 = 1337;

/// DNS capture: queries to these nameservers (the host's, from
/// `/etc/resolv.conf`) go to the agent's DNS proxy on `port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsCapture {
    pub nameservers: Vec<Ipv4Addr>,
    pub port: u16,
}

/// Which inbound ports are captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundPorts {
    /// Every port (`*`), but the excluded ones.
    All,
    /// These ports only (none: no inbound capture).
    Only(Vec<u16>),
}

/// A CIDR: an IPv4 network and its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    /// `10.0.0.0/8` or a bare address (a /32). IPv4 only: the rules are
    /// `iptables`', not `ip6tables`'.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, len) = s.split_once('/').map_or((s, None), |(a, l)| (a, Some(l)));
        let addr: Ipv4Addr = a.parse().map_err(|_| format!("{s:?} is not an IPv4 address or CIDR"))?;
        let len = match len {
            Some(l) => l.parse::<u8>().ok().filter(|l| *l <= 32).ok_or_else(|| format!("{s:?}: the prefix length must be 0 to 32"))?,
            None => 32,
        };
        Ok(Cidr { addr, len })
    }

    /// Everything (`0.0.0.0/0`)?
    pub fn is_all(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// What to capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureOptions {
    /// Envoy's uid and gid: its own connections are never captured.
    pub proxy_uid: u32,
    pub proxy_gid: u32,
    pub outbound_port: u16,
    pub inbound_port: u16,
    /// Outbound destinations captured (empty: all).
    pub include_outbound_cidrs: Vec<Cidr>,
    /// Outbound destinations never captured: the replicas (the agent
    /// reaches them itself) and `--exclude-outbound-cidrs`.
    pub exclude_outbound_cidrs: Vec<Cidr>,
    pub exclude_outbound_ports: Vec<u16>,
    pub inbound: InboundPorts,
    pub exclude_inbound_ports: Vec<u16>,
    /// Capture DNS too (`--capture-dns`).
    pub dns: Option<DnsCapture>,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions {
            proxy_uid: DEFAULT_PROXY_ID,
            proxy_gid: DEFAULT_PROXY_ID,
            outbound_port: OUTBOUND_PORT,
            inbound_port: INBOUND_PORT,
            include_outbound_cidrs: Vec::new(),
            exclude_outbound_cidrs: Vec::new(),
            exclude_outbound_ports: Vec::new(),
            inbound: InboundPorts::All,
            exclude_inbound_ports: DEFAULT_EXCLUDED_INBOUND.to_vec(),
            dns: None,
        }
    }
}

/// A comma-separated list of ports (`--exclude-outbound-ports 22,5432`).
pub fn parse_ports(flag: &str, s: &str) -> Result<Vec<u16>, String> {
    let mut out = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let n: u16 = p.parse().ok().filter(|n| *n != 0).ok_or_else(|| format!("{flag}: {p:?} is not a port (1-65535)"))?;
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

/// `--include-inbound-ports`: `*` (all) or a list of ports.
pub fn parse_inbound(s: &str) -> Result<InboundPorts, String> {
    if s.trim() == "*" {
        return Ok(InboundPorts::All);
    }
    parse_ports("--include-inbound-ports", s).map(InboundPorts::Only)
}

/// A comma-separated list of CIDRs (`--include-outbound-cidrs`); `*` is
/// everything.
pub fn parse_cidrs(flag: &str, s: &str) -> Result<Vec<Cidr>, String> {
    if s.trim() == "*" {
        return Ok(Vec::new());
    }
    s.split(',').map(str::trim).filter(|c| !c.is_empty()).map(|c| Cidr::parse(c).map_err(|e| format!("{flag}: {e}"))).collect()
}

impl CaptureOptions {
    /// The nat table rules that install the capture, for `iptables-restore
    /// --noflush` (the chains must not exist yet: see [`remove`]).
    pub fn install(&self) -> String {
        let mut out = String::from("*nat\n");
        for c in CHAINS.into_iter().filter(|c| *c != DNS_CHAIN) {
            let _ = writeln!(out, "-N {c}");
        }
        let _ = writeln!(out, "-A {REDIRECT_CHAIN} -p tcp -j REDIRECT --to-ports {}", self.outbound_port);
        let _ = writeln!(out, "-A {IN_REDIRECT_CHAIN} -p tcp -j REDIRECT --to-ports {}", self.inbound_port);
        // Inbound.
        let inbound = match &self.inbound {
            InboundPorts::Only(ports) => !ports.is_empty(),
            InboundPorts::All => true,
        };
        if inbound {
            let _ = writeln!(out, "-A PREROUTING -p tcp -j {INBOUND_CHAIN}");
            match &self.inbound {
                InboundPorts::All => {
                    for p in &self.exclude_inbound_ports {
                        let _ = writeln!(out, "-A {INBOUND_CHAIN} -p tcp --dport {p} -j RETURN");
                    }
                    let _ = writeln!(out, "-A {INBOUND_CHAIN} -p tcp -j {IN_REDIRECT_CHAIN}");
                }
                InboundPorts::Only(ports) => {
                    for p in ports.iter().filter(|p| !self.exclude_inbound_ports.contains(p)) {
                        let _ = writeln!(out, "-A {INBOUND_CHAIN} -p tcp --dport {p} -j {IN_REDIRECT_CHAIN}");
                    }
                }
            }
        }
        // DNS, before the TCP capture (TCP 53 to another destination falls
        // through to it).
        if let Some(dns) = &self.dns {
            let d = DNS_CHAIN;
            let _ = writeln!(out, "-N {d}");
            for proto in ["udp", "tcp"] {
                let _ = writeln!(out, "-A OUTPUT -p {proto} --dport 53 -j {d}");
            }
            let _ = writeln!(out, "-A {d} -m mark --mark {DNS_MARK} -j RETURN");
            for (m, id) in [("--uid-owner", self.proxy_uid), ("--gid-owner", self.proxy_gid)] {
                let _ = writeln!(out, "-A {d} -m owner {m} {id} -j RETURN");
            }
            for ns in &dns.nameservers {
                for proto in ["udp", "tcp"] {
                    let _ = writeln!(out, "-A {d} -d {ns}/32 -p {proto} --dport 53 -j REDIRECT --to-ports {}", dns.port);
                }
            }
        }
        // Outbound.
        let _ = writeln!(out, "-A OUTPUT -p tcp -j {OUTPUT_CHAIN}");
        let o = OUTPUT_CHAIN;
        let _ = writeln!(out, "-A {o} -s {INBOUND_PASSTHROUGH_SOURCE}/32 -o lo -j RETURN");
        if self.dns.is_some() {
            // The DNS proxy's forwarded TCP queries.
            let _ = writeln!(out, "-A {o} -m mark --mark {DNS_MARK} -j RETURN");
        }
        for (m, id) in [("--uid-owner", self.proxy_uid), ("--gid-owner", self.proxy_gid)] {
            // Envoy calling its own workload by a local address other than
            // 127.0.0.1 goes through the inbound side (as from elsewhere).
            let _ = writeln!(out, "-A {o} ! -d 127.0.0.1/32 -o lo -p tcp -m owner {m} {id} -j {IN_REDIRECT_CHAIN}");
            let _ = writeln!(out, "-A {o} -o lo -m owner ! {m} {id} -j RETURN");
            let _ = writeln!(out, "-A {o} -m owner {m} {id} -j RETURN");
        }
        let _ = writeln!(out, "-A {o} -d 127.0.0.1/32 -j RETURN");
        for p in &self.exclude_outbound_ports {
            let _ = writeln!(out, "-A {o} -p tcp --dport {p} -j RETURN");
        }
        for c in &self.exclude_outbound_cidrs {
            let _ = writeln!(out, "-A {o} -d {c} -j RETURN");
        }
        if self.include_outbound_cidrs.is_empty() || self.include_outbound_cidrs.iter().any(Cidr::is_all) {
            let _ = writeln!(out, "-A {o} -j {REDIRECT_CHAIN}");
        } else {
            for c in &self.include_outbound_cidrs {
                let _ = writeln!(out, "-A {o} -d {c} -j {REDIRECT_CHAIN}");
            }
        }
        out.push_str("COMMIT\n");
        out
    }
}

/// The jump rules (as `iptables -t nat` arguments after `-D`/`-C`) that
/// `iptables-save` lists for our chains in a built-in chain: every rule
/// of `saved` (an `iptables-save -t nat` dump) in a built-in chain that
/// jumps to one of ours, e.g. `["PREROUTING", "-p", "tcp", "-j",
/// "LODESTAR_INBOUND"]`.
pub fn our_jumps(saved: &str) -> Vec<Vec<String>> {
    saved
        .lines()
        .filter_map(|l| l.strip_prefix("-A "))
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|w| !w.is_empty() && !CHAINS.contains(&w[0].as_str()))
        .filter(|w| w.windows(2).any(|p| p[0] == "-j" && CHAINS.contains(&p[1].as_str())))
        .collect()
}

/// Our chains that exist in `saved` (an `iptables-save -t nat` dump).
pub fn our_chains(saved: &str) -> Vec<&'static str> {
    CHAINS.into_iter().filter(|c| saved.lines().any(|l| l.strip_prefix(':').and_then(|r| r.split_whitespace().next()) == Some(*c))).collect()
}

/// Rules of another tool that would take traffic before ours or fight
/// with it: jumps to Istio's chains (`ISTIO_*`), Kuma's (`KUMA_*`) or
/// Consul's (`CONSUL_*`), or any REDIRECT/DNAT in the built-in nat
/// OUTPUT or PREROUTING chains that is not ours. Each as its
/// `iptables-save` line.
pub fn foreign_rules(saved: &str) -> Vec<String> {
    saved
        .lines()
        .filter(|l| l.starts_with("-A "))
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let chain = w.get(1).copied().unwrap_or("");
            if CHAINS.contains(&chain) {
                return false;
            }
            let target = w.windows(2).find(|p| p[0] == "-j").map(|p| p[1]).unwrap_or("");
            let mesh = ["ISTIO_", "KUMA_", "CONSUL_"].iter().any(|p| target.starts_with(p) || chain.starts_with(p));
            let redirect = matches!(chain, "OUTPUT" | "PREROUTING") && matches!(target, "REDIRECT" | "DNAT");
            mesh || redirect
        })
        .map(str::to_string)
        .collect()
}

/// The commands (each as `iptables` arguments) that remove what
/// [`CaptureOptions::install`] added, found in `saved` (an
/// `iptables-save -t nat` dump): the jumps first, then our chains
/// flushed, then deleted. Nothing else is touched.
pub fn remove(saved: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for jump in our_jumps(saved) {
        let mut cmd = vec!["-t".to_string(), "nat".into(), "-D".into()];
        cmd.extend(jump);
        out.push(cmd);
    }
    let chains = our_chains(saved);
    for op in ["-F", "-X"] {
        for c in &chains {
            out.push(vec!["-t".into(), "nat".into(), op.into(), c.to_string()]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules for the defaults: every inbound port but the excluded,
    /// every outbound destination, Envoy's uid and gid excluded.
    #[test]
    fn default_rules() {
        let want = "\
*nat
-N LODESTAR_INBOUND
-N LODESTAR_REDIRECT
-N LODESTAR_IN_REDIRECT
-N LODESTAR_OUTPUT
-A LODESTAR_REDIRECT -p tcp -j REDIRECT --to-ports 15001
-A LODESTAR_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A PREROUTING -p tcp -j LODESTAR_INBOUND
-A LODESTAR_INBOUND -p tcp --dport 22 -j RETURN
-A LODESTAR_INBOUND -p tcp --dport 15020 -j RETURN
-A LODESTAR_INBOUND -p tcp --dport 15021 -j RETURN
-A LODESTAR_INBOUND -p tcp --dport 15090 -j RETURN
-A LODESTAR_INBOUND -p tcp -j LODESTAR_IN_REDIRECT
-A OUTPUT -p tcp -j LODESTAR_OUTPUT
-A LODESTAR_OUTPUT -s 127.0.0.6/32 -o lo -j RETURN
-A LODESTAR_OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner 1337 -j LODESTAR_IN_REDIRECT
-A LODESTAR_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A LODESTAR_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A LODESTAR_OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --gid-owner 1337 -j LODESTAR_IN_REDIRECT
-A LODESTAR_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A LODESTAR_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A LODESTAR_OUTPUT -d 127.0.0.1/32 -j RETURN
-A LODESTAR_OUTPUT -j LODESTAR_REDIRECT
COMMIT
";
        assert_eq!(CaptureOptions::default().install(), want);
    }

    /// Given ports and CIDRs: only those inbound ports (minus excluded),
    /// excluded outbound ports and the replicas first, then the included
    /// CIDRs only.
    #[test]
    fn rules_for_given_ports_and_cidrs() {
        let opts = CaptureOptions {
            proxy_uid: 2001,
            proxy_gid: 2002,
            include_outbound_cidrs: parse_cidrs("--include-outbound-cidrs", "198.18.0.0/15, 10.0.0.1").unwrap(),
            exclude_outbound_cidrs: vec![Cidr::parse("198.18.0.1").unwrap()],
            exclude_outbound_ports: parse_ports("--exclude-outbound-ports", "5432,22,5432").unwrap(),
            inbound: parse_inbound("8080,9090").unwrap(),
            exclude_inbound_ports: vec![9090],
            ..Default::default()
        };
        let rules = opts.install();
        let body: Vec<&str> =
            rules.lines().filter(|l| l.contains("LODESTAR_INBOUND -") || l.starts_with("-A LODESTAR_OUTPUT -d") || l.contains("--dport")).collect();
        assert_eq!(
            body,
            [
                "-A LODESTAR_INBOUND -p tcp --dport 8080 -j LODESTAR_IN_REDIRECT",
                "-A LODESTAR_OUTPUT -d 127.0.0.1/32 -j RETURN",
                "-A LODESTAR_OUTPUT -p tcp --dport 5432 -j RETURN",
                "-A LODESTAR_OUTPUT -p tcp --dport 22 -j RETURN",
                "-A LODESTAR_OUTPUT -d 198.18.0.1/32 -j RETURN",
                "-A LODESTAR_OUTPUT -d 198.18.0.0/15 -j LODESTAR_REDIRECT",
                "-A LODESTAR_OUTPUT -d 10.0.0.1/32 -j LODESTAR_REDIRECT",
            ]
        );
        assert!(rules.contains("--uid-owner 2001") && rules.contains("--gid-owner 2002") && !rules.contains("1337"), "{rules}");
        assert!(!rules.contains("-A LODESTAR_OUTPUT -j LODESTAR_REDIRECT"), "only the included CIDRs: {rules}");
        // No inbound ports: no PREROUTING jump at all.
        let none = CaptureOptions { inbound: InboundPorts::Only(vec![]), ..Default::default() }.install();
        assert!(!none.contains("PREROUTING") && none.contains("-N LODESTAR_INBOUND"), "{none}");
    }

    /// --capture-dns: UDP and TCP 53 to each nameserver to the DNS proxy,
    /// before the TCP capture; the agent's marked queries and Envoy's pass.
    #[test]
    fn dns_rules() {
        let opts = CaptureOptions { dns: Some(DnsCapture { nameservers: vec![Ipv4Addr::new(198, 18, 0, 66)], port: DNS_PORT }), ..Default::default() };
        let rules = opts.install();
        let dns: Vec<&str> = rules.lines().filter(|l| l.contains("LODESTAR_DNS") || l.contains("-j LODESTAR_OUTPUT") || l.contains("mark")).collect();
        assert_eq!(
            dns,
            [
                "-N LODESTAR_DNS",
                "-A OUTPUT -p udp --dport 53 -j LODESTAR_DNS",
                "-A OUTPUT -p tcp --dport 53 -j LODESTAR_DNS",
                "-A LODESTAR_DNS -m mark --mark 1337 -j RETURN",
                "-A LODESTAR_DNS -m owner --uid-owner 1337 -j RETURN",
                "-A LODESTAR_DNS -m owner --gid-owner 1337 -j RETURN",
                "-A LODESTAR_DNS -d 198.18.0.66/32 -p udp --dport 53 -j REDIRECT --to-ports 15053",
                "-A LODESTAR_DNS -d 198.18.0.66/32 -p tcp --dport 53 -j REDIRECT --to-ports 15053",
                "-A OUTPUT -p tcp -j LODESTAR_OUTPUT",
                "-A LODESTAR_OUTPUT -m mark --mark 1337 -j RETURN",
            ]
        );
        assert!(!CaptureOptions::default().install().contains("LODESTAR_DNS"));
        // Removal knows the DNS chain.
        let saved = "*nat\n:OUTPUT ACCEPT [0:0]\n:LODESTAR_DNS - [0:0]\n-A OUTPUT -p udp -m udp --dport 53 -j LODESTAR_DNS\nCOMMIT\n";
        let cmds: Vec<String> = remove(saved).iter().map(|c| c.join(" ")).collect();
        assert_eq!(cmds, ["-t nat -D OUTPUT -p udp -m udp --dport 53 -j LODESTAR_DNS", "-t nat -F LODESTAR_DNS", "-t nat -X LODESTAR_DNS"]);
    }

    #[test]
    fn bad_flags_are_named() {
        assert!(parse_ports("--exclude-outbound-ports", "80,x").unwrap_err().contains("--exclude-outbound-ports: \"x\""));
        assert!(parse_ports("--exclude-outbound-ports", "0").is_err());
        assert!(parse_cidrs("--include-outbound-cidrs", "10.0.0.0/33").unwrap_err().contains("prefix length"));
        assert!(parse_cidrs("--include-outbound-cidrs", "::1/128").unwrap_err().contains("IPv4"));
        assert_eq!(parse_cidrs("--include-outbound-cidrs", "*").unwrap(), vec![]);
        assert_eq!(parse_inbound("*").unwrap(), InboundPorts::All);
    }

    /// What `iptables-save -t nat` prints after the install (nft backend),
    /// with another tool's rule beside ours: removal deletes our jumps and
    /// chains only; the other rule is reported as foreign.
    #[test]
    fn removal_touches_only_ours() {
        let saved = "\
# Generated by iptables-save v1.8.9 (nf_tables)
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:LODESTAR_INBOUND - [0:0]
:LODESTAR_IN_REDIRECT - [0:0]
:LODESTAR_OUTPUT - [0:0]
:LODESTAR_REDIRECT - [0:0]
:OTHER - [0:0]
-A PREROUTING -p tcp -j LODESTAR_INBOUND
-A OUTPUT -p tcp -j LODESTAR_OUTPUT
-A OUTPUT -d 10.9.0.0/16 -j OTHER
-A POSTROUTING -o eth0 -j MASQUERADE
-A LODESTAR_OUTPUT -j LODESTAR_REDIRECT
-A LODESTAR_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";
        let cmds: Vec<String> = remove(saved).iter().map(|c| c.join(" ")).collect();
        assert_eq!(
            cmds,
            [
                "-t nat -D PREROUTING -p tcp -j LODESTAR_INBOUND",
                "-t nat -D OUTPUT -p tcp -j LODESTAR_OUTPUT",
                "-t nat -F LODESTAR_INBOUND",
                "-t nat -F LODESTAR_REDIRECT",
                "-t nat -F LODESTAR_IN_REDIRECT",
                "-t nat -F LODESTAR_OUTPUT",
                "-t nat -X LODESTAR_INBOUND",
                "-t nat -X LODESTAR_REDIRECT",
                "-t nat -X LODESTAR_IN_REDIRECT",
                "-t nat -X LODESTAR_OUTPUT",
            ]
        );
        assert!(foreign_rules(saved).is_empty(), "{:?}", foreign_rules(saved));
        let istio = format!("{saved}-A OUTPUT -p tcp -j ISTIO_OUTPUT\n-A PREROUTING -p tcp --dport 80 -j REDIRECT --to-ports 8080\n");
        assert_eq!(foreign_rules(&istio), ["-A OUTPUT -p tcp -j ISTIO_OUTPUT", "-A PREROUTING -p tcp --dport 80 -j REDIRECT --to-ports 8080"]);
        assert!(remove("*nat\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n").is_empty());
    }
}
