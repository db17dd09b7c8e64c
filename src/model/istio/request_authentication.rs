//! `RequestAuthentication` (`security.istio.io` v1beta1 and v1): which JSON
//! Web Tokens a workload accepts. Translated to Envoy's `jwt_authn` filter
//! (`translate::jwt`): a request with an invalid token is rejected (401), a
//! request without one passes (an AuthorizationPolicy decides whether it
//! may).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::MatchLabelsSelector;
use super::duration::Duration;
use super::validate::{check_duration, check_selector_labels, is_header_token, Path, Report};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestAuthentication {
    /// Workloads it applies to; every workload in scope when absent (its
    /// namespace, or the whole mesh from the root namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<MatchLabelsSelector>,
    /// Kubernetes Gateway API attachment: parsed so the refusal can name
    /// it, never acted upon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jwt_rules: Vec<JwtRule>,
}

/// Istio's `JWTRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtRule {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub issuer: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// Where the control plane fetches the key set (`jwks` wins if both
    /// are set, as in Istio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    /// The key set inline (JWKS JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_headers: Vec<JwtHeader>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_params: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_cookies: Vec<String>,
    /// The verified payload goes upstream in this header (base64url).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_payload_to_header: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// Keep the token in the request sent upstream (removed by default).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forward_original_token: bool,
    /// How long fetching `jwksUri` may take (Istio's default: 5 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Claims whose value is a space-delimited string, split into a list
    /// for authorization (besides `scope` and `permission`, always split).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub space_delimited_claims: Vec<String>,
}

/// The claims Istio always treats as space-delimited.
pub const DEFAULT_SPACE_DELIMITED_CLAIMS: [&str; 2] = ["scope", "permission"];
/// Istio's CRD bound on `spaceDelimitedClaims`.
const MAX_SPACE_DELIMITED_CLAIMS: usize = 64;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtHeader {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Stripped from the header's value before the token is read
    /// (`Bearer `).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClaimToHeader {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub header: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim: String,
}

impl RequestAuthentication {
    /// Istio's `ValidateRequestAuthentication` (pkg/config/validation):
    /// one of selector / targetRef(s), the selector's labels
    /// (`validateWorkloadSelector`), and each rule (`validateJwtRule`).
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        // Istio's `validateOneOfSelectorType`, then Lodestar's own limit:
        // a policy attached to a Kubernetes Gateway or Service has nothing
        // to attach to here.
        if self.selector.is_some() && (self.target_ref.is_some() || !self.target_refs.is_empty()) {
            r.error(at, "only one of targetRefs or workloadSelector can be set");
        }
        if self.target_ref.is_some() {
            r.error(&at.field("targetRef"), "targetRef is not supported: it names Kubernetes resources, which Lodestar does not have; use selector");
        }
        if !self.target_refs.is_empty() {
            r.error(&at.field("targetRefs"), "targetRefs is not supported: it names Kubernetes resources, which Lodestar does not have; use selector");
        }
        if let Some(sel) = &self.selector {
            check_selector_labels(r, &at.field("selector").field("matchLabels"), &sel.match_labels);
        }
        let rules_at = at.field("jwtRules");
        for (i, rule) in self.jwt_rules.iter().enumerate() {
            rule.check(&rules_at.index(i), r);
        }
    }
}

impl JwtRule {
    /// Istio's `validateJwtRule`, plus the header-name checks Envoy makes
    /// on what this becomes (it would NACK the listener otherwise).
    fn check(&self, at: &Path, r: &mut Report) {
        if self.issuer.is_empty() {
            r.error(&at.field("issuer"), "issuer must be set");
        }
        for (i, a) in self.audiences.iter().enumerate() {
            if a.is_empty() {
                r.error(&at.field("audiences").index(i), "audience must be non-empty string");
            }
        }
        if let Some(uri) = &self.jwks_uri {
            // Istio's `security.ParseJwksURI`.
            if let Err(e) = check_jwks_uri(uri) {
                r.error(&at.field("jwksUri"), e);
            }
        }
        match &self.jwks {
            Some(jwks) => {
                if let Err(e) = check_jwks(jwks) {
                    r.error(&at.field("jwks"), format!("jwks parse error: {e}"));
                }
                if self.jwks_uri.is_some() {
                    r.warn(&at.field("jwksUri"), "ignored: the inline jwks is used");
                }
            }
            None if self.jwks_uri.is_none() => {
                // Istio would look the issuer up by OpenID discovery
                // (`ISSUER/.well-known/openid-configuration`); Lodestar
                // fetches only what it is told.
                r.error(&at.field("jwksUri"), "one of jwksUri or jwks must be set: OpenID discovery from the issuer is not supported");
            }
            None => {}
        }
        for (i, h) in self.from_headers.iter().enumerate() {
            let name_at = at.field("fromHeaders").index(i).field("name");
            if h.name.is_empty() {
                r.error(&name_at, "location header name must be non-empty string");
            } else if !is_header_token(&h.name) {
                r.error(&name_at, format!("{:?} is not a valid header name", h.name));
            }
        }
        for (i, p) in self.from_params.iter().enumerate() {
            if p.is_empty() {
                r.error(&at.field("fromParams").index(i), "location query must be non-empty string");
            }
        }
        for (i, c) in self.from_cookies.iter().enumerate() {
            if c.is_empty() {
                r.error(&at.field("fromCookies").index(i), "cookie name must be non-empty string");
            }
        }
        if let Some(h) = &self.output_payload_to_header {
            if !is_header_token(h) {
                r.error(&at.field("outputPayloadToHeader"), format!("{h:?} is not a valid header name"));
            }
        }
        for (i, c) in self.output_claim_to_headers.iter().enumerate() {
            let c_at = at.field("outputClaimToHeaders").index(i);
            if c.claim.is_empty() || c.header.is_empty() {
                r.error(&c_at, "outputClaimToHeaders header and claim value must be non-empty string");
                continue;
            }
            // Istio's `ValidateStrictHTTPHeaderName`.
            if !is_header_token(&c.header) {
                r.error(&c_at.field("header"), format!("{:?} is not a valid header name", c.header));
            }
        }
        if let Some(t) = &self.timeout {
            check_duration(r, &at.field("timeout"), t);
        }
        // The CRD's schema: at most 64 names, none empty.
        let sdc_at = at.field("spaceDelimitedClaims");
        if self.space_delimited_claims.len() > MAX_SPACE_DELIMITED_CLAIMS {
            r.error(&sdc_at, format!("at most {MAX_SPACE_DELIMITED_CLAIMS} claims"));
        }
        for (i, c) in self.space_delimited_claims.iter().enumerate() {
            if c.is_empty() {
                r.error(&sdc_at.index(i), "claim name must be non-empty string");
            }
        }
    }
}

/// Istio's `ParseJwksURI`: an absolute http or https URL with a host.
pub fn check_jwks_uri(uri: &str) -> Result<(), String> {
    let (scheme, rest) = uri.split_once("://").ok_or_else(|| format!("jwksUri {uri:?} is not an absolute URL"))?;
    if !matches!(scheme, "http" | "https") {
        return Err(format!("URI scheme {scheme:?} is not supported (http or https)"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host_only = if host.starts_with('[') { host.split_once(']').map_or(host, |(h, _)| h) } else { host.split(':').next().unwrap_or("") };
    if host_only.trim_start_matches('[').is_empty() {
        return Err(format!("jwksUri {uri:?} has no host"));
    }
    if let Some(port) = host.strip_prefix(host_only).and_then(|p| p.trim_start_matches(']').strip_prefix(':')) {
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("jwksUri {uri:?} has an invalid port {port:?}"));
        }
    }
    if uri.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("jwksUri {uri:?} contains whitespace or control characters"));
    }
    Ok(())
}

/// A JSON Web Key Set (RFC 7517) Envoy can load: `{"keys": [...]}` with
/// at least one key, each with the members its `kty` needs. (Istio parses
/// with a JWK library; Envoy would reject a listener whose inline key set
/// it cannot load, so the same check guards fetched sets.)
pub fn check_jwks(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let keys = v.get("keys").and_then(Value::as_array).ok_or("expected a JSON object with a \"keys\" array")?;
    if keys.is_empty() {
        return Err("the key set has no keys".into());
    }
    for (i, k) in keys.iter().enumerate() {
        let kty = k.get("kty").and_then(Value::as_str).ok_or_else(|| format!("keys[{i}]: \"kty\" is required"))?;
        let needs: &[&str] = match kty {
            "RSA" => &["n", "e"],
            "EC" => &["crv", "x", "y"],
            "OKP" => &["crv", "x"],
            "oct" => &["k"],
            other => return Err(format!("keys[{i}]: key type {other:?} is not supported (RSA, EC, OKP, oct)")),
        };
        for m in needs {
            if k.get(*m).and_then(Value::as_str).is_none_or(str::is_empty) {
                return Err(format!("keys[{i}]: a {kty} key needs \"{m}\""));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, Validated};
    use serde_json::json;

    fn errors(spec: serde_json::Value) -> Vec<(String, String)> {
        match validate("RequestAuthentication", &spec) {
            Ok(_) => Vec::new(),
            Err(e) => e.into_iter().map(|e| (e.field, e.reason)).collect(),
        }
    }

    const JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","x":"abc","y":"def"}]}"#;

    #[test]
    fn istio_documented_example_is_accepted() {
        let spec = json!({
            "selector": {"matchLabels": {"app": "httpbin"}},
            "jwtRules": [{
                "issuer": "issuer-foo",
                "jwksUri": "https://example.com/.well-known/jwks.json",
                "audiences": ["bookstore_android.apps.example.com"],
                "fromHeaders": [{"name": "x-jwt-assertion", "prefix": "Bearer "}],
                "fromParams": ["my_token"],
                "fromCookies": ["session"],
                "outputPayloadToHeader": "x-jwt-payload",
                "outputClaimToHeaders": [{"header": "x-jwt-sub", "claim": "sub"}],
                "forwardOriginalToken": true,
                "timeout": "10s"
            }]
        });
        let v = validate("RequestAuthentication", &spec).unwrap();
        assert!(matches!(v, Validated::RequestAuthentication { .. }));
        // Written back as given.
        assert_eq!(v.to_json().unwrap(), spec);
    }

    #[test]
    fn every_bad_field_is_named() {
        let e = errors(json!({
            "jwtRules": [
                {"jwksUri": "ftp://example.com/keys"},
                {"issuer": "a", "jwks": "{\"keys\": []}", "audiences": [""]},
                {"issuer": "b", "jwksUri": "https:///nohost", "fromHeaders": [{"name": ""}, {"name": "bad header"}], "fromParams": [""], "fromCookies": [""]},
                {"issuer": "c", "jwks": JWKS, "outputClaimToHeaders": [{"header": "x-a"}, {"header": "bad header", "claim": "sub"}], "outputPayloadToHeader": "x y"},
                {"issuer": "d", "jwks": JWKS, "timeout": "0.5ms", "spaceDelimitedClaims": ["roles", ""]},
                {"issuer": "e"}
            ]
        }));
        let has = |f: &str, r: &str| e.iter().any(|(ef, er)| ef == f && er.contains(r));
        assert!(has("spec.jwtRules[0].issuer", "issuer must be set"), "{e:?}");
        assert!(has("spec.jwtRules[0].jwksUri", "scheme \"ftp\" is not supported"), "{e:?}");
        assert!(has("spec.jwtRules[1].jwks", "jwks parse error: the key set has no keys"), "{e:?}");
        assert!(has("spec.jwtRules[1].audiences[0]", "non-empty"), "{e:?}");
        assert!(has("spec.jwtRules[2].jwksUri", "no host"), "{e:?}");
        assert!(has("spec.jwtRules[2].fromHeaders[0].name", "non-empty"), "{e:?}");
        assert!(has("spec.jwtRules[2].fromHeaders[1].name", "not a valid header name"), "{e:?}");
        assert!(has("spec.jwtRules[2].fromParams[0]", "non-empty"), "{e:?}");
        assert!(has("spec.jwtRules[2].fromCookies[0]", "non-empty"), "{e:?}");
        assert!(has("spec.jwtRules[3].outputClaimToHeaders[0]", "header and claim"), "{e:?}");
        assert!(has("spec.jwtRules[3].outputClaimToHeaders[1].header", "not a valid header name"), "{e:?}");
        assert!(has("spec.jwtRules[3].outputPayloadToHeader", "not a valid header name"), "{e:?}");
        assert!(has("spec.jwtRules[4].timeout", "at least 1ms"), "{e:?}");
        assert!(has("spec.jwtRules[4].spaceDelimitedClaims[1]", "non-empty"), "{e:?}");
        assert!(has("spec.jwtRules[5].jwksUri", "one of jwksUri or jwks"), "{e:?}");
    }

    #[test]
    fn target_refs_and_bad_selectors_are_refused() {
        let e = errors(json!({"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}]}));
        assert!(e.iter().any(|(f, r)| f == "spec.targetRefs" && r.contains("not supported")), "{e:?}");
        let e = errors(json!({"targetRef": {"kind": "Service", "name": "s"}, "selector": {"matchLabels": {"app": "a"}}}));
        assert!(e.iter().any(|(f, r)| f == "spec" && r.contains("only one of")), "{e:?}");
        assert!(e.iter().any(|(f, r)| f == "spec.targetRef" && r.contains("not supported")), "{e:?}");
        let e = errors(json!({"selector": {"matchLabels": {"app": "*"}}}));
        assert!(e.iter().any(|(f, r)| f == "spec.selector.matchLabels.app" && r.contains("wildcard")), "{e:?}");
        let e = errors(json!({"jwtRules": [{"issuer": "a", "jwks": JWKS, "unknownField": 1}]}));
        assert!(e.iter().any(|(f, _)| f.starts_with("spec.jwtRules[0]")), "{e:?}");
    }

    #[test]
    fn jwks_uris() {
        for ok in ["http://127.0.0.1:8080/jwks", "https://example.com/.well-known/jwks.json", "https://[::1]:443/k", "https://example.com"] {
            assert_eq!(super::check_jwks_uri(ok), Ok(()), "{ok}");
        }
        for bad in ["example.com/jwks", "file:///etc/keys", "https://example.com:0/k", "https://example.com:99999/k", "http://", "https://exa mple.com/"] {
            assert!(super::check_jwks_uri(bad).is_err(), "{bad}");
        }
    }
}
