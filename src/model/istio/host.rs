//! Host names as Istio treats them: short-name resolution, wildcard matching
//! and the DNS syntax checks that validation shares.

use std::net::IpAddr;

/// Longest DNS label (RFC 1123).
const DNS1123_LABEL_MAX_LEN: usize = 63;

/// Longest host name Istio accepts.
const DOMAIN_MAX_LEN: usize = 255;

/// Turns a host as written in a config into the name Istio uses internally,
/// following `ResolveShortnameToFQDN` in istio/istio (pilot/pkg/model/config.go):
///
/// * `""` stays `""` and `"*"` stays `"*"`;
/// * an IP address (v4 or v6) is left alone;
/// * a name containing **no dot** (`reviews`) is a Kubernetes short name and
///   becomes `<host>.<namespace>.svc.<domain_suffix>`
///   (`reviews` in `default` with `cluster.local` gives
///   `reviews.default.svc.cluster.local`); an empty namespace or suffix just
///   drops that part, as Istio does;
/// * a name with **any dot** is taken as already fully qualified and is left
///   alone. So `reviews.prod` stays `reviews.prod`: Istio does *not* expand
///   it to `reviews.prod.svc.cluster.local`, even though Kubernetes DNS would
///   resolve it through its search path. Users must write the full name.
///
/// Wildcards other than `*` always contain a dot (`*.example.com`), so they
/// fall in the last case.
pub fn resolve_short_name(host: &str, namespace: &str, domain_suffix: &str) -> String {
    if host.is_empty() || host == "*" || is_ip_address(host) || host.contains('.') {
        return host.to_string();
    }
    let mut out = host.to_string();
    if !namespace.is_empty() {
        out.push('.');
        out.push_str(namespace);
    }
    if !domain_suffix.is_empty() {
        out.push_str(".svc.");
        out.push_str(domain_suffix);
    }
    out
}

/// Whether `host` is covered by `pattern` (Istio's `host.Name.SubsetOf`).
///
/// * `*` covers everything;
/// * `*.example.com` covers `a.example.com`, `a.b.example.com` and the
///   narrower wildcard `*.a.example.com`, but not `example.com` itself;
/// * a plain name covers only itself.
///
/// Comparison ignores ASCII case because DNS names are case-insensitive
/// (Istio compares bytes; configs differing only in case are rare and the
/// proxies treat such hosts as equal anyway).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    match (pattern.strip_prefix('*'), host.strip_prefix('*')) {
        // A wildcard host is covered only by a wildcard at least as broad.
        (Some(pattern_suffix), Some(host_suffix)) => host_suffix.len() >= pattern_suffix.len() && ends_with_ignore_case(host_suffix, pattern_suffix),
        (Some(pattern_suffix), None) => ends_with_ignore_case(host, pattern_suffix),
        (None, Some(_)) => false,
        (None, None) => pattern.eq_ignore_ascii_case(host),
    }
}

/// Whether two (possibly wildcarded) hosts have a name in common
/// (Istio's `host.Name.Matches`): either one covers the other.
pub fn hosts_overlap(a: &str, b: &str) -> bool {
    host_matches(a, b) || host_matches(b, a)
}

/// Whether `s` is an IPv4 or IPv6 address (without brackets or port).
pub fn is_ip_address(s: &str) -> bool {
    s.parse::<IpAddr>().is_ok()
}

fn ends_with_ignore_case(s: &str, suffix: &str) -> bool {
    s.len() >= suffix.len() && s.is_char_boundary(s.len() - suffix.len()) && s[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

/// RFC 1123 label: alphanumerics and `-`, not starting or ending with `-`.
/// Istio (like Kubernetes' label check it copies) allows upper case.
pub(super) fn is_dns1123_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            s.len() <= DNS1123_LABEL_MAX_LEN
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        }
        _ => false,
    }
}

/// A DNS label that may carry Istio's wildcard prefix: `*`, `*foo`, `*-foo`.
fn is_wildcard_dns1123_label(s: &str) -> bool {
    if s.len() > DNS1123_LABEL_MAX_LEN {
        return false;
    }
    if s == "*" {
        return true;
    }
    let rest = s.strip_prefix("*-").or_else(|| s.strip_prefix('*')).unwrap_or(s);
    is_dns1123_label(rest)
}

fn check_dns1123_preconditions(name: &str) -> Result<(), String> {
    if name.len() > DOMAIN_MAX_LEN {
        return Err(format!("domain name {name:?} too long (max {DOMAIN_MAX_LEN})"));
    }
    if name.is_empty() {
        return Err("empty domain name not allowed".to_string());
    }
    Ok(())
}

/// Every label is an RFC 1123 label, the top-level one is not all digits
/// (that would be an IP address typo), and a trailing dot is tolerated.
fn check_dns1123_labels(domain: &str) -> Result<(), String> {
    let labels: Vec<&str> = domain.split('.').collect();
    let top_level = labels.last().copied().unwrap_or_default();
    // Go's strconv.Atoi also takes a sign, so "-1" counts as numeric there.
    let unsigned = top_level.strip_prefix(['+', '-']).unwrap_or(top_level);
    if !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("domain name {domain:?} invalid (top level domain {top_level:?} cannot be all-numeric)"));
    }
    for (i, label) in labels.iter().enumerate() {
        if i == labels.len() - 1 && label.is_empty() {
            return Ok(());
        }
        if !is_dns1123_label(label) {
            return Err(format!("domain name {domain:?} invalid (label {label:?} invalid)"));
        }
    }
    Ok(())
}

/// A fully qualified (or short) name without wildcards.
pub(super) fn check_fqdn(name: &str) -> Result<(), String> {
    check_dns1123_preconditions(name)?;
    check_dns1123_labels(name)
}

/// A DNS name whose first label may be a wildcard (`*`, `*.example.com`,
/// `*-foo.example.com`); short names such as `reviews` are fine.
pub(super) fn check_wildcard_domain(name: &str) -> Result<(), String> {
    check_dns1123_preconditions(name)?;
    let (first, rest) = match name.split_once('.') {
        Some((first, rest)) => (first, Some(rest)),
        None => (name, None),
    };
    if !is_wildcard_dns1123_label(first) {
        return Err(format!("domain name {name:?} invalid (label {first:?} invalid)"));
    }
    match rest {
        Some(rest) => check_dns1123_labels(rest),
        None => Ok(()),
    }
}

/// Only `*` or a leading `*.` wildcard; `*foo.com` and `a.*.com` are partial.
pub(super) fn check_no_partial_wildcard(host: &str) -> Result<(), String> {
    if host.contains('*') && host != "*" && !host.starts_with("*.") {
        return Err(format!("partial wildcard {host:?} not allowed"));
    }
    Ok(())
}

/// Where a `namespace/dnsName` host is written: the two places differ in
/// which namespace forms and host forms they allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HostScope {
    Gateway,
    Sidecar,
}

/// Validates a Gateway server host or Sidecar egress host
/// (Istio's `ValidateNamespaceSlashWildcardHostname`). Gateways also accept
/// the legacy form without namespace and IP addresses as host; sidecars
/// require `namespace/dnsName` where namespace is `*`, `.`, a DNS label, or
/// one of those prefixed with `~` (exclusion).
pub(super) fn check_namespace_slash_host(host: &str, scope: HostScope) -> Vec<String> {
    let mut errors = Vec::new();
    let Some((namespace, name)) = host.split_once('/') else {
        if scope == HostScope::Gateway {
            check_host_part(host, scope, &mut errors);
        } else {
            errors.push(format!("host {host:?} must be of form namespace/dnsName"));
        }
        return errors;
    };
    if namespace.is_empty() || name.is_empty() {
        errors.push(format!("host {host:?}: namespace and dnsName cannot be empty"));
    }
    let namespace_ok = match scope {
        HostScope::Sidecar => {
            let ns = namespace.strip_prefix('~').unwrap_or(namespace);
            ns.is_empty() || ns == "*" || ns == "." || is_dns1123_label(ns)
        }
        HostScope::Gateway => namespace == "*" || namespace == "." || is_dns1123_label(namespace),
    };
    if !namespace_ok {
        errors.push(format!("invalid namespace {namespace:?} in host {host:?}"));
    }
    check_host_part(name, scope, &mut errors);
    errors
}

fn check_host_part(name: &str, scope: HostScope, errors: &mut Vec<String>) {
    if name != "*" && !name.contains('.') {
        errors.push(format!("short name {name:?} is not allowed here; use a fully qualified name"));
    }
    if let Err(e) = check_wildcard_domain(name) {
        // Gateways may be addressed by IP.
        if scope == HostScope::Sidecar || !is_ip_address(name) {
            errors.push(e);
        }
    }
    if let Err(e) = check_no_partial_wildcard(name) {
        errors.push(e);
    }
}

/// `a.b.c.d`, `a.b.c.d/len`, an IPv6 address or an IPv6 CIDR.
pub(super) fn check_ip_subnet(subnet: &str) -> Result<(), String> {
    match subnet.split_once('/') {
        Some((addr, len)) => {
            let max = match addr.parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => 32,
                Ok(IpAddr::V6(_)) => 128,
                Err(_) => return Err(format!("{subnet} is not a valid CIDR block")),
            };
            // Go's netip.ParsePrefix rejects signs and leading zeros.
            let len_ok = !len.is_empty()
                && len.bytes().all(|b| b.is_ascii_digit())
                && (len == "0" || !len.starts_with('0'))
                && len.parse::<u32>().is_ok_and(|l| l <= max);
            if len_ok {
                Ok(())
            } else {
                Err(format!("{subnet} is not a valid CIDR block"))
            }
        }
        None if is_ip_address(subnet) => Ok(()),
        None => Err(format!("{subnet} is not a valid IP address")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_get_namespace_and_suffix() {
        assert_eq!(resolve_short_name("reviews", "default", "cluster.local"), "reviews.default.svc.cluster.local");
        assert_eq!(resolve_short_name("reviews", "", "cluster.local"), "reviews.svc.cluster.local");
        assert_eq!(resolve_short_name("reviews", "default", ""), "reviews.default");
    }

    #[test]
    fn dotted_wildcard_and_ip_hosts_are_left_alone() {
        for host in ["reviews.prod", "reviews.prod.svc.cluster.local", "*.example.com", "*", "", "10.0.0.1", "::1", "2001:db8::1"] {
            assert_eq!(resolve_short_name(host, "default", "cluster.local"), host);
        }
    }

    #[test]
    fn wildcard_matching() {
        assert!(host_matches("*", "anything.example.com"));
        assert!(host_matches("*", "*.example.com"));
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.example.com", "a.b.example.com"));
        assert!(host_matches("*.example.com", "*.a.example.com"));
        assert!(host_matches("*.example.com", "*.example.com"));
        assert!(host_matches("*.example.com", "A.Example.COM"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", "a.example.org"));
        assert!(!host_matches("*.a.example.com", "*.example.com"));
        assert!(!host_matches("a.example.com", "*.example.com"));
        assert!(!host_matches("a.example.com", "b.example.com"));
        assert!(host_matches("reviews", "reviews"));
        assert!(!host_matches("*.example.com", "ä"));
    }

    #[test]
    fn overlap_is_symmetric() {
        assert!(hosts_overlap("*.com", "foo.com"));
        assert!(hosts_overlap("foo.com", "*.com"));
        assert!(hosts_overlap("*", "*.com"));
        assert!(!hosts_overlap("*.foo.com", "foo.com"));
        assert!(!hosts_overlap("foo.com", "bar.com"));
    }

    #[test]
    fn dns_labels() {
        assert!(is_dns1123_label("v1"));
        assert!(is_dns1123_label("a-b"));
        assert!(is_dns1123_label("A1"));
        assert!(!is_dns1123_label(""));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label("a-"));
        assert!(!is_dns1123_label("a_b"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
    }

    #[test]
    fn wildcard_domains() {
        for ok in ["*", "*.example.com", "*-x.example.com", "reviews", "reviews.prod.svc.cluster.local", "istio.io."] {
            assert_eq!(check_wildcard_domain(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a.*.com", "example.123", "foo..com", "-a.com", "a_b.com", "**.com"] {
            assert!(check_wildcard_domain(bad).is_err(), "{bad}");
        }
        assert!(check_fqdn("*.example.com").is_err());
        assert!(check_fqdn("api.example.com").is_ok());
    }

    #[test]
    fn partial_wildcards() {
        assert!(check_no_partial_wildcard("*").is_ok());
        assert!(check_no_partial_wildcard("*.foo.com").is_ok());
        assert!(check_no_partial_wildcard("*foo.com").is_err());
        assert!(check_no_partial_wildcard("foo.*.com").is_err());
    }

    #[test]
    fn namespace_slash_hosts() {
        for ok in ["./*", "*/*", "istio-system/*", "~/foo.example.com", "prod/*.example.com", "~prod/a.b.c"] {
            assert!(check_namespace_slash_host(ok, HostScope::Sidecar).is_empty(), "{ok}");
        }
        for bad in ["foo.example.com", "prod/reviews", "Bad_ns/*", "/foo.com", "ns/", "ns/*foo.com"] {
            assert!(!check_namespace_slash_host(bad, HostScope::Sidecar).is_empty(), "{bad}");
        }
        for ok in ["*", "bookinfo.example.com", "*/bookinfo.example.com", "10.0.0.1", "ns/*"] {
            assert!(check_namespace_slash_host(ok, HostScope::Gateway).is_empty(), "{ok}");
        }
        for bad in ["reviews", "~/foo.com", "ns/*foo.com"] {
            assert!(!check_namespace_slash_host(bad, HostScope::Gateway).is_empty(), "{bad}");
        }
    }

    #[test]
    fn subnets() {
        for ok in ["10.0.0.0/8", "10.1.2.3", "2001:db8::/32", "::1", "0.0.0.0/0"] {
            assert_eq!(check_ip_subnet(ok), Ok(()), "{ok}");
        }
        for bad in ["10.0.0.0/33", "10.0.0/8", "foo", "10.0.0.0/", "10.0.0.0/08", "10.0.0.0/+8", "::/129"] {
            assert!(check_ip_subnet(bad).is_err(), "{bad}");
        }
    }
}
