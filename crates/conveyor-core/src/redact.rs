//! Redaction of sensitive payload fields in views meant for people (the job API, the
//! dashboard, logs). Workers still receive the whole payload when they fetch a job.

use serde_json::Value;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Replaces the value of every object key named in `fields`, at any depth (also inside
/// arrays), with [`REDACTED`]. Key names match exactly.
pub fn redact_fields(value: &mut Value, fields: &[String]) {
    if fields.is_empty() {
        return;
    }
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                if fields.iter().any(|field| field == key) {
                    *inner = Value::String(REDACTED.to_string());
                } else {
                    redact_fields(inner, fields);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                redact_fields(item, fields);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn named_fields_are_redacted_at_any_depth() {
        let mut payload = json!({
            "to": "a@example.com",
            "password": "hunter2",
            "card": {"number": "4111", "expiry": "12/30"},
            "items": [{"number": "9"}, {"sku": "x"}]
        });
        redact_fields(&mut payload, &["password".into(), "number".into()]);
        assert_eq!(
            payload,
            json!({
                "to": "a@example.com",
                "password": REDACTED,
                "card": {"number": REDACTED, "expiry": "12/30"},
                "items": [{"number": REDACTED}, {"sku": "x"}]
            })
        );
        let mut untouched = json!({"password": "x"});
        redact_fields(&mut untouched, &[]);
        assert_eq!(untouched, json!({"password": "x"}));
    }
}
