//! RequestAuthentication → Envoy's `jwt_authn` HTTP filter, first in the
//! HTTP filter chain of the inbound (Sidecar ingress) and gateway listeners
//! of the proxies a policy selects (Istio's scoping: `scope::policy_selects`).
//!
//! Istio's semantics: every jwtRule of every policy that selects the proxy
//! is one provider (`origins-N`, in policy order); the requirement is "any
//! provider, or no token at all" (`requires_any` + `allow_missing`), so a
//! request carrying a token that no provider accepts is rejected with 401
//! and a request with none passes (an AuthorizationPolicy may then require
//! a request principal).
//!
//! The verified payload is put in the request's dynamic metadata under the
//! filter's name, key `payload` (`PAYLOAD_METADATA_KEY`): the RBAC filter
//! reads request principals (`iss/sub`) and `request.auth.claims[...]`
//! from there.
//!
//! Keys: a rule's inline `jwks`, else the key set the control plane fetched
//! from its `jwksUri` (the root's `jwks` fetcher, handed to translation in
//! `Mesh::jwks`), served inline: Envoy never calls the issuer. A `jwksUri`
//! not fetched (yet, or ever) gets `UNFETCHED_JWKS`, a key whose private
//! half nobody has, so its tokens are rejected (fail closed, as Istio's
//! fake JWKS).
//!
//! `providers` is a protobuf map, which prost encodes in a HashMap's
//! random order; the filter's bytes are built with its entries sorted
//! (see `encode`), so equal input gives equal bytes and versions.

use super::encode::put_sorted_message_map;
use super::scope::policy_selects;
use crate::mesh::{Config, Mesh};
use crate::model::istio::request_authentication::{JwtRule, DEFAULT_SPACE_DELIMITED_CLAIMS};
use crate::model::istio::RequestAuthentication;
use crate::model::proxy::ProxyIdentity;
use envoy_types::pb::envoy::config::core::v3::{data_source, DataSource};
use envoy_types::pb::envoy::config::route::v3::{route_match::PathSpecifier, RouteMatch};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    jwt_provider::{JwksSourceSpecifier, NormalizePayload},
    jwt_requirement::RequiresType,
    requirement_rule::RequirementType,
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement, JwtRequirementOrList, RequirementRule,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{http_filter, HttpFilter};
use envoy_types::pb::google::protobuf::{Any, Empty};
use prost::{Message, Name};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

pub const JWT_AUTHN_FILTER: &str = "envoy.filters.http.jwt_authn";
/// Where the verified payload goes in the dynamic metadata of
/// `JWT_AUTHN_FILTER` (the convention the RBAC translation reads).
pub const PAYLOAD_METADATA_KEY: &str = "payload";

/// The key set served for a `jwksUri` that has not been fetched: a valid
/// RSA public key whose private key was thrown away when it was made, so
/// no token verifies against it.
pub const UNFETCHED_JWKS: &str = concat!(
    r#"{"keys":[{"kty":"RSA","kid":"lodestar-unfetched","alg":"RS256","e":"AQAB","n":""#,
    "sVaIoZwgMdkQy3JBcdDH2vW_99rrjzEtRdNPmGJ4Sx_3sdKsm3edTstDcn-ZAJnXAFARyL6E2HJH21453kTNc2hEaNgx28mpkmkVMePV-ja8_032wVy8_BF9iCIJ3n68xA_p71mcZ4f2L0yqXjCpEg0yzRGW5uvLsy4sd7xEMxjKro8p-mBRZGIo6mi9tgwfKzYxw9RekDRitH3iBz_pg1VAxuZuTKk-Ca4Twj4n2XQNpodglF76XRIkvx8FngOSPWRPyEfwI4sVsB972zPJcjt1BqxDP-Mxz_pEvqGBOlUOhndH4Fo_ufJDeBRBco5bt4IR0z8q8XxF8wHcgh0rkw",
    r#""}]}"#
);

// Fetched key sets are an input of the mesh index (`mesh::FetchedKeys`);
// their old paths here stay.
pub use super::mesh::{FetchedKeys, KeyCell};

/// The RequestAuthentications that apply to `proxy`, in mesh order (oldest
/// first).
pub fn policies_for<'a>(mesh: &'a Mesh, proxy: &'a ProxyIdentity) -> impl Iterator<Item = &'a Arc<Config<RequestAuthentication>>> + 'a {
    let root = mesh.config.root_namespace.as_str();
    mesh.request_authentications.iter().filter(move |p| policy_selects(&p.key.namespace, p.spec.selector.as_ref().map(|s| &s.match_labels), root, proxy))
}

fn rules_for<'a>(mesh: &'a Mesh, proxy: &'a ProxyIdentity) -> impl Iterator<Item = &'a JwtRule> + 'a {
    policies_for(mesh, proxy).flat_map(|p| p.spec.jwt_rules.iter())
}

/// The `jwksUri`s whose fetched keys `proxy`'s config contains.
pub fn fetched_uris_for(mesh: &Mesh, proxy: &ProxyIdentity) -> BTreeSet<String> {
    rules_for(mesh, proxy).filter(|r| r.jwks.is_none()).filter_map(|r| r.jwks_uri.clone()).collect()
}

/// The key set a rule's provider is given.
fn jwks_of(mesh: &Mesh, rule: &JwtRule) -> String {
    if let Some(inline) = &rule.jwks {
        return inline.clone();
    }
    rule.jwks_uri.as_ref().and_then(|u| mesh.jwks.sets.get(u)).map_or_else(|| UNFETCHED_JWKS.to_string(), |s| s.to_string())
}

fn provider(mesh: &Mesh, rule: &JwtRule) -> JwtProvider {
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        from_headers: rule.from_headers.iter().map(|h| JwtHeader { name: h.name.clone(), value_prefix: h.prefix.clone() }).collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        forward_payload_header: rule.output_payload_to_header.clone().unwrap_or_default(),
        payload_in_metadata: PAYLOAD_METADATA_KEY.to_string(),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| JwtClaimToHeader { header_name: c.header.clone(), claim_name: c.claim.clone(), ..Default::default() })
            .collect(),
        // As Istio: `scope`, `permission` and the rule's own
        // space-delimited claims become lists in the metadata, so that
        // `request.auth.claims[scope]` matches one scope among several.
        normalize_payload_in_metadata: Some(NormalizePayload {
            space_delimited_claims: DEFAULT_SPACE_DELIMITED_CLAIMS
                .iter()
                .map(|c| c.to_string())
                .chain(rule.space_delimited_claims.iter().filter(|c| !DEFAULT_SPACE_DELIMITED_CLAIMS.contains(&c.as_str())).cloned())
                .collect(),
        }),
        jwks_source_specifier: Some(JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(jwks_of(mesh, rule))),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The `jwt_authn` filter RequestAuthentication puts first in `proxy`'s
/// inbound and gateway HTTP connection managers, if a policy with rules
/// selects it. (Envoy itself removes client-supplied copies of the headers
/// the filter writes, `outputPayloadToHeader` and `outputClaimToHeaders`,
/// token or not: `tests/e2e/jwt.rs` checks it on the real binary.)
pub fn jwt_filter(mesh: &Mesh, proxy: &ProxyIdentity) -> Option<HttpFilter> {
    let rules: Vec<&JwtRule> = rules_for(mesh, proxy).collect();
    if rules.is_empty() {
        return None;
    }
    let providers: HashMap<String, JwtProvider> = rules.iter().enumerate().map(|(i, r)| (format!("origins-{i}"), provider(mesh, r))).collect();
    let mut names: Vec<String> = providers.keys().cloned().collect();
    names.sort_by_key(|n| n.trim_start_matches("origins-").parse::<usize>().unwrap_or(usize::MAX));
    let mut any_of: Vec<JwtRequirement> = names.into_iter().map(|n| JwtRequirement { requires_type: Some(RequiresType::ProviderName(n)) }).collect();
    any_of.push(JwtRequirement { requires_type: Some(RequiresType::AllowMissing(Empty {})) });
    let config = JwtAuthentication {
        providers,
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch { path_specifier: Some(PathSpecifier::Prefix("/".into())), ..Default::default() }),
            requirement_type: Some(RequirementType::Requires(JwtRequirement {
                requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList { requirements: any_of })),
            })),
        }],
        // As Istio: CORS preflights carry no token and must not be refused.
        bypass_cors_preflight: true,
        ..Default::default()
    };
    Some(HttpFilter { name: JWT_AUTHN_FILTER.into(), config_type: Some(http_filter::ConfigType::TypedConfig(jwt_authn_any(&config))), ..Default::default() })
}

/// The filter config as an `Any`, encoded deterministically: the message
/// without its maps, then the map entries sorted by key (field 1:
/// `providers`, field 5: `requirement_map`).
pub fn jwt_authn_any(config: &JwtAuthentication) -> Any {
    const PROVIDERS: u32 = 1;
    const REQUIREMENT_MAP: u32 = 5;
    let mut bare = config.clone();
    let providers = std::mem::take(&mut bare.providers);
    let requirements = std::mem::take(&mut bare.requirement_map);
    let mut value = bare.encode_to_vec();
    put_sorted_message_map(PROVIDERS, &providers, &mut value);
    put_sorted_message_map(REQUIREMENT_MAP, &requirements, &mut value);
    Any { type_url: JwtAuthentication::type_url(), value }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_whatever_the_map_order() {
        let mut config = JwtAuthentication::default();
        for i in 0..12 {
            config.providers.insert(format!("origins-{i}"), JwtProvider { issuer: format!("issuer-{i}"), ..Default::default() });
        }
        let a = jwt_authn_any(&config);
        for _ in 0..20 {
            let mut copy = config.clone();
            copy.providers = copy.providers.into_iter().collect();
            assert_eq!(jwt_authn_any(&copy), a);
        }
        assert_eq!(JwtAuthentication::decode(a.value.as_slice()).unwrap(), config);
    }

    #[test]
    fn the_unfetched_key_set_is_a_valid_jwks() {
        assert_eq!(crate::model::istio::request_authentication::check_jwks(UNFETCHED_JWKS), Ok(()));
    }
}
