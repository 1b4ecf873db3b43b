//! How the integer and optional fields of request bodies (HTTP bodies, schedule files) are read.
//!
//! Two rules, the same for every field, so that the API agrees with its JSON Schema
//! (`docs/openapi.yaml`):
//!
//! * An integer may be written as any JSON number whose value is whole: `216`, `216.0` and
//!   `2.16e2` are the same integer to JSON Schema, so they are to us. Fractions, and values
//!   beyond the field's range or beyond 2^63-1 (the largest integer any store keeps), are
//!   refused. Only fields the server reads as integers go through here: payloads and results
//!   are user data and are kept exactly as sent.
//! * `null` is refused in an optional field unless the field documents what `null` means
//!   there: leaving a field out is how one asks for its default. The error names the field,
//!   as every deserialization error does.
//!
//! Use them as `#[serde(default, deserialize_with = "wire::opt_int")]` and so on.
//! [`read_body`] reads a whole configuration body (a source, hook or subscription) and names
//! the field at fault when it is refused.

use crate::error::ValidationError;
use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};
use serde_json::Value;
use std::fmt;
use std::marker::PhantomData;

/// Integer types a request field may have. Their range is capped at `i64::MAX`, the largest
/// integer every store can keep.
pub trait WireInt: Sized {
    const MIN: i128;
    const MAX: i128;
    fn from_i128(value: i128) -> Option<Self>;
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl WireInt for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = if (<$t>::MAX as i128) < (i64::MAX as i128) {
                <$t>::MAX as i128
            } else {
                i64::MAX as i128
            };
            fn from_i128(value: i128) -> Option<Self> {
                if (<Self as WireInt>::MIN..=<Self as WireInt>::MAX).contains(&value) {
                    <$t>::try_from(value).ok()
                } else {
                    None
                }
            }
        }
    )*};
}

wire_int!(i32, u32, i64, u64, usize);

/// The whole number a JSON number stands for, if it stands for one (`216.0` does, `2.5` and
/// `NaN` do not). Far beyond any field's range, the exact value does not matter: it is refused.
pub fn whole_number(value: &serde_json::Value) -> Option<i128> {
    let number = value.as_number()?;
    if let Some(n) = number.as_i64() {
        return Some(i128::from(n));
    }
    if let Some(n) = number.as_u64() {
        return Some(i128::from(n));
    }
    number.as_f64().and_then(whole_f64)
}

fn whole_f64(value: f64) -> Option<i128> {
    // 2^100 is far beyond every range, and small enough to convert without saturating.
    const LIMIT: f64 = 1_267_650_600_228_229_401_496_703_205_376.0;
    (value.is_finite() && value.fract() == 0.0 && value.abs() < LIMIT).then_some(value as i128)
}

struct IntVisitor<T>(PhantomData<T>);

impl<T: WireInt> IntVisitor<T> {
    fn checked<E: de::Error>(&self, value: i128, unexpected: Unexpected<'_>) -> Result<T, E> {
        T::from_i128(value).ok_or_else(|| E::invalid_value(unexpected, self))
    }
}

impl<'de, T: WireInt> Visitor<'de> for IntVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an integer from {} to {}", T::MIN, T::MAX)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        self.checked(i128::from(v), Unexpected::Signed(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        self.checked(i128::from(v), Unexpected::Unsigned(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        match whole_f64(v) {
            Some(whole) => self.checked(whole, Unexpected::Float(v)),
            None => Err(E::invalid_type(Unexpected::Float(v), &self)),
        }
    }
}

/// A required (or `#[serde(default)]`) integer field; `null` is refused as any non-number is.
pub fn int<'de, D: Deserializer<'de>, T: WireInt>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_any(IntVisitor(PhantomData))
}

/// An optional integer field without a meaning for `null` (absent: `None`, with
/// `#[serde(default)]`).
pub fn opt_int<'de, D: Deserializer<'de>, T: WireInt>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    deserializer.deserialize_option(NonNull(IntSeed::<T>(PhantomData)))
}

/// An optional integer field where `null` means the same as leaving it out (documented as
/// nullable, e.g. a schedule job's `timeout_ms`, which schedule views show as `null`).
pub fn nullable_int<'de, D: Deserializer<'de>, T: WireInt>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    deserializer.deserialize_option(Nullable(IntSeed::<T>(PhantomData)))
}

/// An optional field of any type without a meaning for `null`.
pub fn non_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    deserializer.deserialize_option(NonNull(PlainSeed::<T>(PhantomData)))
}

/// What to read once a value is known not to be `null`.
trait Seed<'de> {
    type Value;
    fn read<D: Deserializer<'de>>(&self, deserializer: D) -> Result<Self::Value, D::Error>;
}

struct IntSeed<T>(PhantomData<T>);

impl<'de, T: WireInt> Seed<'de> for IntSeed<T> {
    type Value = T;
    fn read<D: Deserializer<'de>>(&self, deserializer: D) -> Result<T, D::Error> {
        int(deserializer)
    }
}

struct PlainSeed<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Seed<'de> for PlainSeed<T> {
    type Value = T;
    fn read<D: Deserializer<'de>>(&self, deserializer: D) -> Result<T, D::Error> {
        T::deserialize(deserializer)
    }
}

struct NonNull<S>(S);

impl<'de, S: Seed<'de>> Visitor<'de> for NonNull<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a value other than null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(E::custom(
            "must not be null; leave the field out to get its default",
        ))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.0.read(deserializer).map(Some)
    }
}

struct Nullable<S>(S);

impl<'de, S: Seed<'de>> Visitor<'de> for Nullable<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a value or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.0.read(deserializer).map(Some)
    }
}

/// Reads a request's JSON object as `T`; an error names the field at fault: the path serde
/// reports where it tracks one, the field a "missing field" or "unknown field" message names,
/// `variant_field` for an unknown enum variant, and otherwise (a mistyped field of a flattened
/// part, whose path serde loses) the top-level key without which that error goes away.
pub fn read_body<T: serde::de::DeserializeOwned>(
    body: Value,
    variant_field: &str,
) -> Result<T, ValidationError> {
    let Some(object) = body.as_object() else {
        return Err(ValidationError::new("body", "must be a JSON object"));
    };
    let error = match serde_path_to_error::deserialize::<_, T>(&body) {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    let message = error.inner().to_string();
    let path = error.path().to_string();
    let tracked = !path.is_empty() && path != "." && !path.contains('?');
    let field = if message.contains("unknown variant") || message.contains("field `type`") {
        variant_field.to_string()
    } else if message.starts_with("unknown field") && tracked {
        path
    } else if message.starts_with("missing field") || message.starts_with("unknown field") {
        match (quoted_field(&message), tracked) {
            (Some(field), true) => format!("{path}.{field}"),
            (Some(field), false) => field.to_string(),
            (None, _) => "body".to_string(),
        }
    } else if tracked {
        path
    } else {
        // A mistyped field of a flattened part: serde loses its path but names the value it
        // refused, which points at the key holding it.
        object
            .iter()
            .find(|(_, value)| {
                let refused = unexpected(value);
                message.contains(&format!("invalid type: {refused}"))
                    || message.contains(&format!("invalid value: {refused}"))
            })
            .map_or_else(|| "body".to_string(), |(key, _)| key.clone())
    };
    Err(ValidationError::new(field, message))
}

/// How serde describes a JSON value it refuses ("integer `7`", "string \"x\"", "map").
fn unexpected(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) if n.is_f64() => format!("floating point `{n}`"),
        Value::Number(n) => format!("integer `{n}`"),
        Value::String(text) => format!("string {text:?}"),
        Value::Array(_) => "sequence".to_string(),
        Value::Object(_) => "map".to_string(),
    }
}

/// The first name in backquotes of a serde message ("missing field `stream`").
fn quoted_field(message: &str) -> Option<&str> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(&message[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[serde(default, deserialize_with = "int")]
        count: u32,
        #[serde(default, deserialize_with = "opt_int")]
        delay: Option<i64>,
        #[serde(default, deserialize_with = "nullable_int")]
        timeout: Option<u64>,
        #[serde(default, deserialize_with = "non_null")]
        name: Option<String>,
        #[serde(default)]
        payload: Option<serde_json::Value>,
    }

    fn parse(text: &str) -> Result<Body, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn whole_numbers_in_any_notation_are_integers() {
        let body = parse(r#"{"count": 216.0, "delay": 2.16e2, "timeout": -0.0}"#).unwrap();
        assert_eq!(
            (body.count, body.delay, body.timeout),
            (216, Some(216), Some(0))
        );
        let body = parse(r#"{"delay": -5, "timeout": 9223372036854775807}"#).unwrap();
        assert_eq!(
            (body.delay, body.timeout),
            (Some(-5), Some(i64::MAX as u64))
        );
    }

    #[test]
    fn fractions_and_out_of_range_values_are_refused() {
        for text in [
            r#"{"count": 1.5}"#,
            r#"{"count": -1}"#,
            r#"{"count": 4294967296}"#,
            r#"{"count": 4294967296.0}"#,
            r#"{"timeout": 9223372036854775808}"#,
            r#"{"delay": 1e300}"#,
            r#"{"count": "7"}"#,
            r#"{"count": true}"#,
        ] {
            assert!(parse(text).is_err(), "{text} should be refused");
        }
        let message = parse(r#"{"count": -1}"#).unwrap_err();
        assert!(message.contains("from 0 to 4294967295"), "{message}");
    }

    #[test]
    fn null_only_where_it_means_something() {
        assert!(parse(r#"{"count": null}"#).is_err());
        let message = parse(r#"{"delay": null}"#).unwrap_err();
        assert!(message.contains("must not be null"), "{message}");
        assert!(parse(r#"{"name": null}"#).is_err());
        let body = parse(r#"{"timeout": null, "name": "a"}"#).unwrap();
        assert_eq!((body.timeout, body.name.as_deref()), (None, Some("a")));
        let body = parse("{}").unwrap();
        assert_eq!((body.count, body.delay, body.timeout), (0, None, None));
    }

    #[test]
    fn user_data_is_not_rewritten() {
        let body = parse(r#"{"payload": {"n": 216.0, "m": 1e2}}"#).unwrap();
        assert_eq!(body.payload, Some(json!({"n": 216.0, "m": 100.0})));
        assert!(body.payload.unwrap()["n"].is_f64());
    }

    #[test]
    fn whole_number_of_a_value() {
        assert_eq!(whole_number(&json!(3)), Some(3));
        assert_eq!(whole_number(&json!(3.0)), Some(3));
        assert_eq!(whole_number(&json!(u64::MAX)), Some(i128::from(u64::MAX)));
        assert_eq!(whole_number(&json!(3.5)), None);
        assert_eq!(whole_number(&json!("3")), None);
        assert_eq!(whole_number(&json!(null)), None);
    }
}
