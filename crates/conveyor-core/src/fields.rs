//! The checks every field of every request takes (names, integers a store can hold, text and
//! JSON without NUL characters), shared by the model's own checks and the request checks in
//! [`crate::validate`], which re-exports them.

use crate::error::ValidationError;

pub const MAX_NAME_LEN: usize = 128;
pub const MAX_TAGS: usize = 32;
pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 512;

/// Kind, queue, tenant and tag names: 1-128 characters from `[A-Za-z0-9_.:-]`.
pub fn name(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(ValidationError::new(
            field,
            format!("must be at most {MAX_NAME_LEN} characters"),
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(ValidationError::new(
            field,
            format!("contains illegal character {bad:?}; allowed are letters, digits, '_', '-', '.', ':'"),
        ));
    }
    Ok(())
}

/// The largest number a store keeps: both stores hold integers as signed 64-bit values, so a
/// larger one would be clamped (SQLite) or refused with a storage error (PostgreSQL).
pub const MAX_STORED_INTEGER: u64 = i64::MAX as u64;

/// Refuses a number the stores cannot hold exactly.
pub fn stored_integer(field: &str, value: u64) -> Result<(), ValidationError> {
    if value > MAX_STORED_INTEGER {
        return Err(ValidationError::new(
            field,
            format!("must be at most {MAX_STORED_INTEGER}"),
        ));
    }
    Ok(())
}

/// Refuses text holding a NUL character. PostgreSQL cannot store one in text or JSONB; SQLite
/// can. Refusing it everywhere keeps both stores (and every client) behaving the same.
pub fn text_without_nul(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.contains('\0') {
        return Err(ValidationError::new(
            field,
            "must not contain the NUL character (\\u0000)",
        ));
    }
    Ok(())
}

/// Deepest nesting of arrays and objects accepted in a payload or result. Answers wrap a
/// payload in a few more levels (`{"jobs": [{"payload": ...}]}`), and common JSON parsers
/// (serde_json's default among them) stop at 128: a deeper payload would be stored, then
/// unreadable by the workers meant to run it.
pub const MAX_JSON_DEPTH: usize = 64;

/// Refuses JSON holding a NUL character in any string or object key, or nested deeper than
/// [`MAX_JSON_DEPTH`]. The error names the place as `field` followed by a JSON pointer
/// (`payload/user/name`).
pub fn json_without_nul(field: &str, value: &serde_json::Value) -> Result<(), ValidationError> {
    use serde_json::Value;
    // Every enqueue and completion passes here: walk without building paths, and spell out
    // the place only once something is wrong.
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((item, depth)) = stack.pop() {
        let bad = depth > MAX_JSON_DEPTH
            || match item {
                Value::String(text) => text.contains('\0'),
                Value::Array(items) => {
                    stack.extend(items.iter().map(|item| (item, depth + 1)));
                    false
                }
                Value::Object(map) => {
                    stack.extend(map.values().map(|item| (item, depth + 1)));
                    map.keys().any(|key| key.contains('\0'))
                }
                Value::Null | Value::Bool(_) | Value::Number(_) => false,
            };
        if bad {
            return Err(json_problem(field, value));
        }
    }
    Ok(())
}

/// The first problem [`json_without_nul`] found, named by its JSON pointer.
fn json_problem(field: &str, value: &serde_json::Value) -> ValidationError {
    use serde_json::Value;
    fn escape(key: &str) -> String {
        key.replace('~', "~0").replace('/', "~1")
    }
    let mut stack: Vec<(String, &Value, usize)> = vec![(field.to_string(), value, 0)];
    while let Some((path, value, depth)) = stack.pop() {
        if depth > MAX_JSON_DEPTH {
            return ValidationError::new(
                field,
                format!("is nested deeper than {MAX_JSON_DEPTH} levels"),
            );
        }
        match value {
            Value::String(text) => {
                if let Err(problem) = text_without_nul(&path, text) {
                    return problem;
                }
            }
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    stack.push((format!("{path}/{index}"), item, depth + 1));
                }
            }
            Value::Object(map) => {
                for (key, item) in map {
                    let place = format!("{path}/{}", escape(key));
                    if let Err(problem) = text_without_nul(&place, key) {
                        return problem;
                    }
                    stack.push((place, item, depth + 1));
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    ValidationError::new(field, "is not storable")
}

/// A failure's message as stored: NUL characters written out as `\u0000`. An error message is
/// a report, not data: refusing it would leave the job running until its lease expired.
pub fn storable_message(message: &str) -> std::borrow::Cow<'_, str> {
    if message.contains('\0') {
        std::borrow::Cow::Owned(message.replace('\0', "\\u0000"))
    } else {
        std::borrow::Cow::Borrowed(message)
    }
}
