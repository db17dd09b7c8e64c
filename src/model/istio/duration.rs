//! Durations as Istio users write them.
//!
//! Istio's CRDs carry `google.protobuf.Duration`, whose JSON form is a
//! decimal number of seconds with an `s` suffix (`"1.5s"`). Users also write
//! Go-style durations (`"100ms"`, `"2m"`, `"1h30m"`), which Kubernetes' CEL
//! validation of the Istio CRDs accepts, so we accept the union of both.
//!
//! The model keeps the string exactly as written so that a parsed spec
//! serialises back to the same JSON; the numeric value is computed on demand.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest duration protobuf can represent (10,000 years), which is what
/// Envoy ultimately receives; anything larger is a typo, not a timeout.
const MAX_SECONDS: u128 = 315_576_000_000;

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// A duration field of an Istio spec, kept as the string the user wrote.
///
/// Deserialising accepts any string so that a bad value is reported by
/// validation, with its path, alongside every other problem in the spec
/// rather than aborting deserialisation at the first one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Duration(String);

impl Duration {
    /// Wraps a duration string without checking it; see [`Duration::to_std`].
    pub fn new(raw: impl Into<String>) -> Self {
        Duration(raw.into())
    }

    /// The duration exactly as written in the spec.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parsed value. Always `Ok` for specs that passed validation.
    pub fn to_std(&self) -> Result<std::time::Duration, String> {
        parse_duration(&self.0)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Duration)
    }
}

/// Parses a protobuf-JSON (`"1.5s"`) or Go-style (`"100ms"`, `"1h30m"`,
/// `"1.5h"`) duration.
///
/// Units are `ns`, `us` (or `µs`), `ms`, `s`, `m` and `h`; several
/// number-unit pairs may be concatenated as in Go. A bare `"0"` is accepted
/// (Go does too); any other number needs a unit. Negative durations are
/// rejected because no Istio field gives them a meaning.
pub fn parse_duration(input: &str) -> Result<std::time::Duration, String> {
    let invalid = |why: &str| format!("invalid duration {input:?}: {why}");
    let mut rest = input;
    if let Some(stripped) = rest.strip_prefix('+') {
        rest = stripped;
    } else if rest.starts_with('-') {
        return Err(invalid("negative durations are not allowed"));
    }
    if rest.is_empty() {
        return Err(invalid("empty duration"));
    }
    if rest == "0" {
        return Ok(std::time::Duration::ZERO);
    }

    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let (whole, after_whole) = split_digits(rest);
        let (fraction, after_fraction) = match after_whole.strip_prefix('.') {
            Some(after_dot) => split_digits(after_dot),
            None => ("", after_whole),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid("expected a number"));
        }
        let unit_len = after_fraction.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after_fraction.len());
        let (unit, after_unit) = after_fraction.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => NANOS_PER_SECOND,
            "m" => 60 * NANOS_PER_SECOND,
            "h" => 3_600 * NANOS_PER_SECOND,
            "" => return Err(invalid("missing unit (use one of ns, us, ms, s, m, h)")),
            other => return Err(invalid(&format!("unknown unit {other:?}"))),
        };

        let whole_value = parse_bounded(whole).ok_or_else(|| invalid("value out of range"))?;
        total_nanos = whole_value.checked_mul(unit_nanos).and_then(|n| n.checked_add(total_nanos)).ok_or_else(|| invalid("value out of range"))?;
        // Digits past nanosecond resolution cannot change the result for any
        // unit we know, so truncating them (as Go does) keeps the arithmetic
        // within u128.
        let fraction = &fraction[..fraction.len().min(18)];
        if !fraction.is_empty() {
            let numerator = parse_bounded(fraction).ok_or_else(|| invalid("value out of range"))?;
            let scale = 10u128.pow(fraction.len() as u32);
            total_nanos += numerator * unit_nanos / scale;
        }
        if total_nanos > MAX_SECONDS * NANOS_PER_SECOND {
            return Err(invalid("value out of range"));
        }
        rest = after_unit;
    }

    let seconds = u64::try_from(total_nanos / NANOS_PER_SECOND).map_err(|_| invalid("value out of range"))?;
    // The remainder is below one billion, so it always fits.
    let nanos = (total_nanos % NANOS_PER_SECOND) as u32;
    Ok(std::time::Duration::new(seconds, nanos))
}

/// Splits the leading ASCII digits off `s`.
fn split_digits(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s.split_at(end)
}

/// Parses a run of ASCII digits; `None` when it overflows (an empty run is 0).
fn parse_bounded(digits: &str) -> Option<u128> {
    if digits.is_empty() {
        return Some(0);
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration as Std;

    #[test]
    fn protobuf_json_form() {
        assert_eq!(parse_duration("1.5s"), Ok(Std::from_millis(1500)));
        assert_eq!(parse_duration("10s"), Ok(Std::from_secs(10)));
        assert_eq!(parse_duration("0.001s"), Ok(Std::from_millis(1)));
        assert_eq!(parse_duration("0s"), Ok(Std::ZERO));
        assert_eq!(parse_duration("1.000000001s"), Ok(Std::new(1, 1)));
    }

    #[test]
    fn go_form() {
        assert_eq!(parse_duration("100ms"), Ok(Std::from_millis(100)));
        assert_eq!(parse_duration("2m"), Ok(Std::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Std::from_secs(3600)));
        assert_eq!(parse_duration("1h30m"), Ok(Std::from_secs(5400)));
        assert_eq!(parse_duration("1.5h"), Ok(Std::from_secs(5400)));
        assert_eq!(parse_duration("250us"), Ok(Std::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Std::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Ok(Std::from_nanos(7)));
        assert_eq!(parse_duration(".5s"), Ok(Std::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Std::ZERO));
        assert_eq!(parse_duration("+3s"), Ok(Std::from_secs(3)));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "1", "s", "1x", "-1s", "1.5", "abc", "1s2", "1..5s", ".s", "1 s", "5 s", " 1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn rejects_absurd_values() {
        assert!(parse_duration("99999999999999999999999999999999999999999h").is_err());
        assert!(parse_duration("400000000000s").is_err());
        assert!(parse_duration("315576000000s").is_ok());
    }

    #[test]
    fn error_names_the_input() {
        let err = parse_duration("10x").unwrap_err();
        assert!(err.contains("\"10x\""), "{err}");
        assert!(err.contains("unknown unit"), "{err}");
    }

    #[test]
    fn serde_keeps_the_original_string() {
        let d: Duration = serde_json::from_value(serde_json::json!("1.50s")).unwrap();
        assert_eq!(d.as_str(), "1.50s");
        assert_eq!(d.to_std(), Ok(Std::from_millis(1500)));
        assert_eq!(serde_json::to_value(&d).unwrap(), serde_json::json!("1.50s"));
        assert!(serde_json::from_value::<Duration>(serde_json::json!(5)).is_err());
    }
}
