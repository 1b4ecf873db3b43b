//! Settings per job kind: a payload schema (JSON Schema 2020-12) that every enqueue of the
//! kind must satisfy, checked at the door for every language at once.
//!
//! The settings live in the store ([`crate::KindStore`]); each process keeps the compiled
//! schemas in a `conveyor_engine::KindRegistry` that re-reads them when a second old, so a
//! schema set through one node is enforced by every node within a second (and at once by the
//! node that set it). Jobs already stored are never re-checked: changing a schema to one that
//! rejects queued jobs is refused unless forced (see `conveyor_engine::queued_violations`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ValidationError;

/// A kind's stored settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindSettings {
    pub kind: String,
    /// JSON Schema (2020-12) every payload of the kind must satisfy; `None`: any payload.
    pub schema: Option<Value>,
    /// The producer's own version of the schema, shown to operators (not interpreted).
    pub version: Option<u32>,
    /// Stops handing out the kind's jobs (in every queue) while too many of them fail (see
    /// [`crate::breaker`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<crate::breaker::BreakerSettings>,
    /// Named limits every job of the kind is subject to (see [`crate::limits::named`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
    /// Jobs of the kind with the same key run one after another (see [`crate::sequence`]),
    /// unless the job names another sequence; overrides its queue's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<crate::sequence::SequenceSpec>,
    /// The kind's jobs go out in batches, to fetches that ask for them (see [`crate::batch`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<crate::batch::BatchSpec>,
    /// When the settings were last written (the store's clock).
    pub updated_at: DateTime<Utc>,
}

impl KindSettings {
    /// A kind with no settings yet (set the fields wanted with struct update syntax).
    pub fn new(kind: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            schema: None,
            version: None,
            circuit_breaker: None,
            limits: Vec::new(),
            sequence: None,
            batch: None,
            updated_at: DateTime::UNIX_EPOCH,
        }
    }
}

/// Checks settings before a store keeps them: the kind's name, and a schema that compiles.
pub fn validate_settings(settings: &KindSettings) -> Result<(), ValidationError> {
    crate::fields::name("kind", &settings.kind)?;
    crate::limits::named::limit_names("limits", &settings.limits)?;
    if let Some(sequence) = &settings.sequence {
        crate::limits::named::sequence("sequence", sequence)?;
    }
    if let Some(batch) = &settings.batch {
        batch.validate("batch")?;
    }
    if let Some(schema) = &settings.schema {
        KindSchema::compile(schema)?;
    }
    if let Some(version) = settings.version {
        crate::fields::stored_integer("version", u64::from(version))?;
    }
    if let Some(breaker) = &settings.circuit_breaker {
        breaker.validate("circuit_breaker")?;
    }
    Ok(())
}

/// Most bytes a stored schema may take (as JSON text).
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;

/// A compiled payload schema.
pub struct KindSchema {
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for KindSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KindSchema")
    }
}

impl KindSchema {
    /// Compiles `schema` as JSON Schema 2020-12 (the draft a schema's own `$schema` names, if
    /// any). A schema that is not one, or refers to documents outside itself, is refused with
    /// the field `schema`.
    pub fn compile(schema: &Value) -> Result<Self, ValidationError> {
        let size = serde_json::to_vec(schema).map(|v| v.len()).unwrap_or(0);
        if size > MAX_SCHEMA_BYTES {
            return Err(ValidationError::new(
                "schema",
                format!("at most {MAX_SCHEMA_BYTES} bytes (got {size})"),
            ));
        }
        if !(schema.is_object() || schema.is_boolean()) {
            return Err(ValidationError::new(
                "schema",
                "must be a JSON Schema: an object (or true/false)",
            ));
        }
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(schema)
            .map_err(|e| ValidationError::new("schema", format!("not a valid JSON Schema: {e}")))?;
        Ok(Self { validator })
    }

    /// Checks a payload: the first violation names its place as `payload/<JSON pointer>`
    /// (`payload/user_id`, `payload/items/2/sku`; a missing required property is named as the
    /// place it is missing from).
    pub fn check(&self, payload: &Value) -> Result<(), ValidationError> {
        let Some(error) = self.validator.iter_errors(payload).next() else {
            return Ok(());
        };
        let mut pointer = error.instance_path().as_str().to_string();
        if let jsonschema::error::ValidationErrorKind::Required { property } = error.kind() {
            if let Some(name) = property.as_str() {
                pointer.push('/');
                pointer.push_str(&name.replace('~', "~0").replace('/', "~1"));
            }
        }
        Err(ValidationError::new(
            format!("payload{pointer}"),
            format!("does not match the kind's schema: {error}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> KindSchema {
        KindSchema::compile(&json!({
            "type": "object",
            "required": ["user_id"],
            "properties": {
                "user_id": {"type": "integer"},
                "items": {"type": "array", "items": {"type": "object",
                    "properties": {"sku": {"type": "string"}}}}
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_wrong_type_is_named_by_its_pointer() {
        let e = schema().check(&json!({"user_id": "seven"})).unwrap_err();
        assert_eq!(e.field, "payload/user_id");
        assert!(e.message.contains("integer"), "{}", e.message);
    }

    #[test]
    fn a_missing_property_is_named_where_it_is_missing() {
        let e = schema().check(&json!({})).unwrap_err();
        assert_eq!(e.field, "payload/user_id");
        let e = schema()
            .check(&json!({"user_id": 1, "items": [{"sku": "a"}, {"sku": "b"}, {"sku": 3}]}))
            .unwrap_err();
        assert_eq!(e.field, "payload/items/2/sku");
    }

    #[test]
    fn a_matching_payload_passes() {
        schema()
            .check(&json!({"user_id": 7, "extra": true}))
            .unwrap();
    }

    #[test]
    fn not_a_schema_is_refused_naming_the_field() {
        for bad in [
            json!(5),
            json!({"type": 12}),
            json!({"$ref": "https://example.com/s"}),
        ] {
            let e = KindSchema::compile(&bad).unwrap_err();
            assert_eq!(e.field, "schema", "{bad}");
        }
    }
}
