//! `lodestar token|policy|role|acl|cert ...`: ACL management. Policies,
//! roles and certificate revocations are ordinary resources (`lodestar
//! apply -f` works too); tokens are made by the server (`POST
//! /v1/acl/tokens`), which shows the secret once.

use super::client::Client;
use super::{print_rows, query, Output};
use crate::model::kinds::{ACL_GROUP, CLUSTER_NAMESPACE};
use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create a token. Prints its accessor id and its secret, which is
    /// shown this once (the store keeps only its hash).
    Create {
        /// What it is for (shown by `token list`).
        #[arg(long)]
        description: Option<String>,
        /// A policy it holds; repeat for more.
        #[arg(long = "policy")]
        policies: Vec<String>,
        /// A role it holds; repeat for more.
        #[arg(long = "role")]
        roles: Vec<String>,
        /// Lifetime, e.g. 1h or 30m (default: never expires).
        #[arg(long)]
        ttl: Option<String>,
        /// A proxy token for the xDS port, bound to NAMESPACE or
        /// NAMESPACE/NAME: an Envoy presenting it may only claim that
        /// namespace (and workload name). Needs no policy.
        #[arg(long, value_name = "NAMESPACE[/NAME]", conflicts_with = "workload")]
        proxy: Option<String>,
        /// With --proxy: a gateway's token, served its namespace's Secrets
        /// (gateway certificates and keys) over SDS. A proxy token without
        /// it is served none.
        #[arg(long, requires = "proxy")]
        gateway: bool,
        /// A join token instead: the workload identity NAMESPACE/SERVICE_ACCOUNT
        /// whose first certificate it obtains from the mesh CA (`lodestar
        /// agent --join-token-file`). No policies or roles.
        #[arg(long, conflicts_with = "host")]
        workload: Option<String>,
        /// A host agent's join token instead: the host NAME's first
        /// certificate (`spiffe://TRUST_DOMAIN/lodestar/host/NAME`), with
        /// which the agent obtains the certificates of the workloads
        /// registered on NAME (Instances with `spec.host`, WorkloadEntries
        /// labelled `lodestar.io/host`). No policies or roles.
        #[arg(long, value_name = "NAME", conflicts_with = "proxy")]
        host: Option<String>,
        /// A join token's uses (default 1).
        #[arg(long)]
        uses: Option<u64>,
        /// A source address range the join token is accepted from; repeat.
        #[arg(long = "cidr")]
        cidrs: Vec<String>,
        /// json: the whole answer (default: the accessor id and secret).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
    /// Who this CLI's token stands for, and whether it may read and
    /// administer the cluster (`GET /v1/acl/token/self`).
    #[command(name = "self")]
    Whoami {
        /// json (default: text).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
    /// Every token: accessor id, description, policies, roles, expiry.
    List,
    /// One token, by accessor id.
    Read {
        /// Its accessor id (`token list`).
        accessor: String,
        /// json (default: yaml).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
    /// Delete a token: every replica refuses it once it applied the delete.
    Revoke {
        /// Its accessor id (`token list`).
        accessor: String,
    },
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Create a policy from rules VERBS:KINDS:NAMESPACES[:HOSTNAMES], each a
    /// comma list, e.g. `--rule read,watch:*:*`, `--rule
    /// write,delete:vs,dr:team-a,team-a-*` or `--rule
    /// write:services,instances:team-a:*.team-a.example.com` (hostnames the
    /// registry services and instances it writes may claim).
    Create {
        /// The policy's name.
        name: String,
        /// What it is for.
        #[arg(long)]
        description: Option<String>,
        /// One rule; repeat for more.
        #[arg(long = "rule", required = true)]
        rules: Vec<String>,
    },
    #[command(flatten)]
    Object(ObjectCommand),
}

/// What policies and roles both answer.
#[derive(Subcommand)]
pub enum ObjectCommand {
    /// Every one, as a table.
    List,
    /// One, as YAML (or JSON).
    Read {
        /// Its name.
        name: String,
        /// json (default: yaml).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
    /// Delete one.
    Delete {
        /// Its name.
        name: String,
    },
}

#[derive(Subcommand)]
pub enum RoleCommand {
    /// Create a role: policies, and the client-certificate identities that
    /// hold it.
    Create {
        /// The role's name.
        name: String,
        /// What it is for.
        #[arg(long)]
        description: Option<String>,
        /// A policy it grants; repeat for more.
        #[arg(long = "policy", required = true)]
        policies: Vec<String>,
        /// A client-certificate identity (SPIFFE id or subject name); repeat.
        #[arg(long = "identity")]
        identities: Vec<String>,
    },
    #[command(flatten)]
    Object(ObjectCommand),
}

#[derive(Subcommand)]
pub enum AclCommand {
    /// Create the first management token (policy global-management), once.
    /// Needs no token; refused once the store holds any token.
    Bootstrap {
        /// json: the whole answer (default: the accessor id and secret).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
}

#[derive(Subcommand)]
pub enum CertCommand {
    /// Put mesh certificates on the deny list: they renew no more and open
    /// no xDS stream, and their open streams end. Creates (or, for the
    /// same SPIFFE id or serial, replaces) a CertificateRevocation.
    Revoke {
        /// Every certificate of this identity signed until now
        /// (spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT): the
        /// workload gets a new one only with a new join token.
        #[arg(long, required_unless_present = "serial", conflicts_with = "serial")]
        spiffe_id: Option<String>,
        /// With --spiffe-id: new certificates too (the CA signs none for
        /// the identity, join token or not, until `cert unrevoke`).
        #[arg(long, requires = "spiffe_id")]
        all: bool,
        /// One certificate, by serial (hex, colons allowed, as `openssl
        /// x509 -noout -serial` prints it).
        #[arg(long)]
        serial: Option<String>,
        /// Why, kept with the entry (shown by `cert revocations` and in
        /// the refusals it causes).
        #[arg(long)]
        reason: Option<String>,
        /// The CertificateRevocation's name (default: from the id or serial).
        #[arg(long)]
        name: Option<String>,
    },
    /// The deny list.
    Revocations,
    /// Take an entry (a CertificateRevocation, by name) off the deny list.
    Unrevoke {
        /// The CertificateRevocation's name (`cert revocations` lists them).
        name: String,
    },
}

pub async fn cert(client: &Client, command: CertCommand) -> Result<()> {
    use crate::model::acl::{format_rfc3339, hex, normalize_serial};
    match command {
        CertCommand::Revoke { spiffe_id, all, serial, reason, name } => {
            let (default_name, spec) = match (spiffe_id, serial) {
                (Some(id), _) => {
                    let digest = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
                    let issued_before = (!all).then(|| format_rfc3339(crate::auth::acl::unix_now()));
                    (format!("id-{}", &hex(digest.as_ref())[..16]), json!({"spiffeId": id, "issuedBefore": issued_before, "reason": reason}))
                }
                (None, Some(serial)) => {
                    let normalized = normalize_serial(&serial).ok_or_else(|| anyhow!("--serial {serial:?}: expected hex digits (colons allowed)"))?;
                    (format!("serial-{normalized}"), json!({"serial": serial, "reason": reason}))
                }
                (None, None) => bail!("give --spiffe-id or --serial"),
            };
            let mut spec = spec;
            if let Some(m) = spec.as_object_mut() {
                m.retain(|_, v| !v.is_null());
            }
            let name = name.unwrap_or(default_name);
            let doc = json!({"apiVersion": format!("{ACL_GROUP}/v1"), "kind": "CertificateRevocation", "metadata": {"name": name}, "spec": spec});
            let result = client.post("/v1/apply", &json!({"resources": [doc]})).await?;
            super::print_write_result(&result);
            Ok(())
        }
        CertCommand::Revocations => {
            let row = |r: &Value| {
                let spec = &r["spec"];
                let what = spec["spiffeId"].as_str().map_or_else(|| format!("serial {}", s(&spec["serial"])), str::to_string);
                let before = if spec["spiffeId"].is_string() { spec["issuedBefore"].as_str().unwrap_or("(all)").to_string() } else { String::new() };
                vec![name(r), what, before, s(&spec["reason"])]
            };
            object(client, "certificaterevocations", ObjectCommand::List, &["NAME", "REVOKED", "ISSUED-BEFORE", "REASON"], row).await
        }
        CertCommand::Unrevoke { name } => delete(client, "certificaterevocations", &name).await,
    }
}

pub async fn token(client: &Client, command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Create { description, policies, roles, ttl, proxy, gateway, workload, host, uses, cidrs, output } => {
            let mut body = json!({"description": description, "policies": policies, "roles": roles, "ttl": ttl, "proxy": proxy});
            if gateway {
                body["gateway"] = json!(true);
            }
            if workload.is_some() || host.is_some() || uses.is_some() || !cidrs.is_empty() {
                body["workload"] = json!(workload);
                body["host"] = json!(host);
                body["uses"] = json!(uses);
                body["cidrs"] = json!(cidrs);
            }
            print_created(&client.post("/v1/acl/tokens", &body).await?, output)
        }
        TokenCommand::List => {
            let row = |t: &Value| {
                let spec = &t["spec"];
                vec![name(t), s(&spec["description"]), joined(&spec["policies"]), joined(&spec["roles"]), proxy_of(spec), s(&spec["expiresAt"])]
            };
            object(client, "tokens", ObjectCommand::List, &["ACCESSOR", "DESCRIPTION", "POLICIES", "ROLES", "PROXY", "EXPIRES"], row).await
        }
        TokenCommand::Whoami { output } => {
            let me = client.get("/v1/acl/token/self").await?;
            if output == Some(Output::Json) {
                println!("{}", serde_json::to_string_pretty(&me)?);
            } else {
                let yes = |k: &str| if me[k] == true { "yes" } else { "no" };
                println!("{}\ncluster read: {}\nmanagement: {}", s(&me["who"]), yes("clusterRead"), yes("management"));
            }
            Ok(())
        }
        TokenCommand::Read { accessor, output } => read(client, "tokens", &accessor, output).await,
        TokenCommand::Revoke { accessor } => delete(client, "tokens", &accessor).await,
    }
}

pub async fn policy(client: &Client, command: PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::Create { name, description, rules } => {
            let rules = rules.iter().map(|r| parse_rule(r)).collect::<Result<Vec<_>>>()?;
            create(client, "Policy", &name, json!({"description": description, "rules": rules})).await
        }
        PolicyCommand::Object(c) => {
            let row = |p: &Value| {
                let rules = p["spec"]["rules"].as_array().into_iter().flatten();
                let rules: Vec<String> = rules
                    .map(|r| {
                        let rule = format!("{}:{}:{}", joined(&r["verbs"]), joined(&r["kinds"]), joined(&r["namespaces"]));
                        if r["hostnames"].as_array().is_some_and(|h| !h.is_empty()) {
                            format!("{rule}:{}", joined(&r["hostnames"]))
                        } else {
                            rule
                        }
                    })
                    .collect();
                vec![name(p), s(&p["spec"]["description"]), rules.join(" ")]
            };
            object(client, "policies", c, &["NAME", "DESCRIPTION", "RULES"], row).await
        }
    }
}

pub async fn role(client: &Client, command: RoleCommand) -> Result<()> {
    match command {
        RoleCommand::Create { name, description, policies, identities } => {
            create(client, "Role", &name, json!({"description": description, "policies": policies, "identities": identities})).await
        }
        RoleCommand::Object(c) => {
            let row = |r: &Value| vec![name(r), s(&r["spec"]["description"]), joined(&r["spec"]["policies"]), joined(&r["spec"]["identities"])];
            object(client, "roles", c, &["NAME", "DESCRIPTION", "POLICIES", "IDENTITIES"], row).await
        }
    }
}

/// list (a table of `header` and `row`), read or delete.
async fn object(client: &Client, plural: &str, command: ObjectCommand, header: &[&str], row: impl Fn(&Value) -> Vec<String>) -> Result<()> {
    match command {
        ObjectCommand::List => {
            let mut rows = vec![header.iter().map(|h| h.to_string()).collect()];
            rows.extend(list(client, plural).await?.iter().map(row));
            print_list(rows)
        }
        ObjectCommand::Read { name, output } => read(client, plural, &name, output).await,
        ObjectCommand::Delete { name } => delete(client, plural, &name).await,
    }
}

pub async fn acl(client: &Client, command: AclCommand) -> Result<()> {
    match command {
        AclCommand::Bootstrap { output } => print_created(&client.post("/v1/acl/bootstrap", &json!({})).await?, output),
    }
}

/// `VERBS:KINDS:NAMESPACES[:HOSTNAMES]`, each a comma-separated list.
fn parse_rule(rule: &str) -> Result<Value> {
    let parts: Vec<&str> = rule.split(':').collect();
    let (verbs, kinds, namespaces, hostnames) = match parts.as_slice() {
        [v, k, n] => (v, k, n, None),
        [v, k, n, h] => (v, k, n, Some(h)),
        _ => bail!("--rule {rule:?}: expected VERBS:KINDS:NAMESPACES[:HOSTNAMES], e.g. read,watch:*:team-a"),
    };
    let list = |s: &str| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect::<Vec<_>>();
    let mut out = json!({"verbs": list(verbs), "kinds": list(kinds), "namespaces": list(namespaces)});
    if let Some(h) = hostnames {
        out["hostnames"] = json!(list(h));
    }
    Ok(out)
}

/// Create-only: an existing object of that name is a conflict, not replaced.
async fn create(client: &Client, kind: &str, name: &str, mut spec: Value) -> Result<()> {
    if let Some(m) = spec.as_object_mut() {
        m.retain(|_, v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()));
    }
    let doc = json!({"apiVersion": format!("{ACL_GROUP}/v1"), "kind": kind, "metadata": {"name": name}, "spec": spec});
    let result = client.post("/v1/apply", &json!({"resources": [{"resource": doc, "expectedRevision": 0}]})).await?;
    super::print_write_result(&result);
    Ok(())
}

async fn list(client: &Client, plural: &str) -> Result<Vec<Value>> {
    let list = client.get(&format!("/v1/resources/{plural}{}", query(&[("namespace", Some(CLUSTER_NAMESPACE))]))).await?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

async fn read(client: &Client, plural: &str, name: &str, output: Option<Output>) -> Result<()> {
    let obj = client.get(&format!("/v1/resources/{plural}/{CLUSTER_NAMESPACE}/{name}")).await?;
    match output {
        Some(Output::Json) => println!("{}", serde_json::to_string_pretty(&obj)?),
        _ => print!("{}", yaml_serde::to_string(&obj)?),
    }
    Ok(())
}

async fn delete(client: &Client, plural: &str, name: &str) -> Result<()> {
    let result = client.delete(&format!("/v1/resources/{plural}/{CLUSTER_NAMESPACE}/{name}")).await?;
    super::print_write_result(&result);
    Ok(())
}

fn print_created(t: &Value, output: Option<Output>) -> Result<()> {
    if output == Some(Output::Json) {
        println!("{}", serde_json::to_string_pretty(t)?);
        return Ok(());
    }
    let field = |k: &str| t[k].as_str().map(String::from).ok_or_else(|| anyhow!("the server's answer has no {k}"));
    println!("AccessorID:  {}", field("accessorId")?);
    println!("SecretID:    {}", field("secret")?);
    println!("Expires:     {}", t["expiresAt"].as_str().unwrap_or("never"));
    eprintln!("The secret is shown this once: keep it now (the store holds only its hash).");
    Ok(())
}

fn print_list(rows: Vec<Vec<String>>) -> Result<()> {
    if rows.len() == 1 {
        eprintln!("No resources found.");
    } else {
        print_rows(rows);
    }
    Ok(())
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

fn name(o: &Value) -> String {
    s(&o["metadata"]["name"])
}

fn joined(v: &Value) -> String {
    v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")).unwrap_or_default()
}

/// A proxy token's identity, `NAMESPACE[/NAME]`, and ` (gateway)`.
fn proxy_of(spec: &Value) -> String {
    let gateway = if spec["proxy"]["gateway"] == true { " (gateway)" } else { "" };
    match (spec["proxy"]["namespace"].as_str(), spec["proxy"]["name"].as_str()) {
        (Some(ns), Some(n)) => format!("{ns}/{n}{gateway}"),
        (Some(ns), None) => format!("{ns}{gateway}"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rules() {
        let r = super::parse_rule("read,watch:vs,dr:a,b-*").unwrap();
        assert_eq!(r, serde_json::json!({"verbs": ["read", "watch"], "kinds": ["vs", "dr"], "namespaces": ["a", "b-*"]}));
        assert!(super::parse_rule("read:*").is_err());
        let r = super::parse_rule("write:services,instances:team-a:*.team-a.example.com,api.example.com").unwrap();
        assert_eq!(r["hostnames"], serde_json::json!(["*.team-a.example.com", "api.example.com"]));
        assert!(super::parse_rule("write:*:a:b:c").is_err());
    }
}
