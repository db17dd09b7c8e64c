//! ServiceEntry analyzers (Istio's `serviceentry.Analyzer`):
//! - IST0134: a ServiceEntry without `addresses`, for each port whose
//!   protocol is TCP or unset: a TCP listener is keyed by address and
//!   port, so without a VIP the port cannot be told apart from others
//!   (Lodestar allocates no addresses, as Istio without DNS capture and
//!   auto-allocation). Resolution and hosts are not looked at, as in Istio.

use super::{Ctx, Message, IST0134};

pub(super) fn run(ctx: &Ctx, out: &mut Vec<Message>) {
    for se in ctx.se.iter().filter(|se| se.spec.addresses.is_empty()) {
        for (i, p) in se.spec.ports.iter().enumerate() {
            if p.protocol.as_deref().is_none_or(|proto| proto.is_empty() || proto.eq_ignore_ascii_case("TCP")) {
                out.push(Message::new(IST0134, se.key(), Some(format!("spec.ports[{i}]")), IST0134.template.to_string()));
            }
        }
    }
}
