//! Names derived from the configured schema: the quoted schema, the NOTIFY channel and the
//! advisory lock keys. Every process using the same schema must derive the same values, so
//! nothing here may depend on the Rust version or the platform (no `DefaultHasher`).

use conveyor_core::ValidationError;

/// PostgreSQL truncates identifiers longer than this (NAMEDATALEN - 1), and refuses channel
/// names that long in `pg_notify`.
const MAX_IDENTIFIER_LEN: usize = 63;

/// Checks a schema name: `[a-z_][a-z0-9_]*`, at most 63 bytes. The name is interpolated into
/// SQL (identifiers cannot be bound as parameters), so only this safe alphabet is accepted.
pub(crate) fn validate_schema(schema: &str) -> Result<(), ValidationError> {
    let mut chars = schema.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !first_ok || !rest_ok {
        return Err(ValidationError::new(
            "schema",
            format!(
                "{schema:?} is not a valid schema name: use a lowercase letter or '_' followed \
                 by lowercase letters, digits or '_'"
            ),
        ));
    }
    if schema.len() > MAX_IDENTIFIER_LEN {
        return Err(ValidationError::new(
            "schema",
            format!("must be at most {MAX_IDENTIFIER_LEN} characters"),
        ));
    }
    Ok(())
}

/// The schema as a quoted identifier, so names that are SQL keywords (`user`, `order`) work too.
/// Only called with validated names, which contain no quote.
pub(crate) fn quoted(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// The NOTIFY channel for the schema's job wake-ups: `conveyor_<schema>_jobs`, or, when that
/// would exceed PostgreSQL's identifier length, a name built from a hash of the schema.
pub(crate) fn channel(schema: &str) -> String {
    let readable = format!("conveyor_{schema}_jobs");
    if readable.len() <= MAX_IDENTIFIER_LEN {
        readable
    } else {
        format!("conveyor_jobs_{:016x}", fnv1a(&[schema.as_bytes()]))
    }
}

/// The advisory lock key that serializes migrations of `schema` across processes.
pub(crate) fn migration_lock_key(schema: &str) -> i64 {
    fnv1a(&[b"conveyor:migrate:", schema.as_bytes()]) as i64
}

/// The advisory lock key that serializes inserts carrying idempotency `key` in `schema`.
/// A collision between two keys only makes their inserts wait for each other.
pub(crate) fn idempotency_lock_key(schema: &str, key: &str) -> i64 {
    // The NUL separator keeps ("a", "bc") and ("ab", "c") apart; schemas cannot contain NUL.
    fnv1a(&[
        b"conveyor:idempotency:",
        schema.as_bytes(),
        b"\0",
        key.as_bytes(),
    ]) as i64
}

/// The advisory lock key that serializes enqueues folded by debounce or throttle `key` in
/// `schema`.
pub(crate) fn fold_lock_key(schema: &str, key: &str) -> i64 {
    fnv1a(&[b"conveyor:fold:", schema.as_bytes(), b"\0", key.as_bytes()]) as i64
}

/// The advisory lock key that serializes inserts of jobs with unique `key` (a hex digest) in
/// `schema`. Its own prefix keeps it apart from an idempotency key spelled the same.
pub(crate) fn unique_lock_key(schema: &str, key: &str) -> i64 {
    fnv1a(&[
        b"conveyor:unique:",
        schema.as_bytes(),
        b"\0",
        key.as_bytes(),
    ]) as i64
}

/// The advisory lock key that serializes inserts into `queue` of `schema` while the queue has a
/// maximum depth (`tenant: None`), or inserts of `tenant`'s jobs into it while it has a
/// per-tenant maximum, so that two batches cannot both see room for themselves.
pub(crate) fn depth_lock_key(schema: &str, queue: &str, tenant: Option<&str>) -> i64 {
    // PostgreSQL text cannot hold NUL, so the separators keep every part apart.
    match tenant {
        None => fnv1a(&[
            b"conveyor:queue-depth:",
            schema.as_bytes(),
            b"\0",
            queue.as_bytes(),
        ]) as i64,
        Some(tenant) => fnv1a(&[
            b"conveyor:tenant-depth:",
            schema.as_bytes(),
            b"\0",
            queue.as_bytes(),
            b"\0",
            tenant.as_bytes(),
        ]) as i64,
    }
}

/// The advisory lock key that serializes fetches claiming jobs of `queue` in `schema` while the
/// queue has a concurrency limit, so that two fetchers cannot both see its last free places.
pub(crate) fn concurrency_lock_key(schema: &str, queue: &str) -> i64 {
    fnv1a(&[
        b"conveyor:queue-concurrency:",
        schema.as_bytes(),
        b"\0",
        queue.as_bytes(),
    ]) as i64
}

/// The advisory lock key that serializes claims of jobs holding named-limit keys in `schema`:
/// limits span queues, so the queues' own locks cannot order them. Taken after those.
pub(crate) fn named_limits_lock_key(schema: &str) -> i64 {
    fnv1a(&[b"conveyor:named-limits:", schema.as_bytes()]) as i64
}

/// 64-bit FNV-1a over the concatenation of `parts`: tiny, fast, and fixed by its definition, so
/// every build of every process agrees on the lock keys.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET_BASIS;
    for byte in parts.iter().flat_map(|part| part.iter()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_restricted_to_a_safe_alphabet() {
        for good in ["conveyor", "_private", "jobs_2", "a", "user"] {
            assert!(validate_schema(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Conveyor",
            "2jobs",
            "my-jobs",
            "jobs;drop",
            "a\"b",
            "sch ema",
            "é",
        ] {
            let err = validate_schema(bad).expect_err(bad);
            assert_eq!(err.field, "schema");
        }
        assert!(validate_schema(&"a".repeat(63)).is_ok());
        assert!(validate_schema(&"a".repeat(64)).is_err());
    }

    #[test]
    fn channel_names_fit_postgres_identifiers() {
        assert_eq!(channel("conveyor"), "conveyor_conveyor_jobs");
        let long = "s".repeat(63);
        let hashed = channel(&long);
        assert!(hashed.len() <= MAX_IDENTIFIER_LEN, "{hashed}");
        assert_eq!(hashed, channel(&long), "stable");
        assert_ne!(hashed, channel(&"t".repeat(63)));
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // Published FNV-1a 64 test vectors: the keys must never change between releases.
        assert_eq!(fnv1a(&[b""]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(&[b"foobar"]), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a(&[b"foo", b"bar"]), fnv1a(&[b"foobar"]));
    }

    #[test]
    fn lock_keys_separate_schemas_and_keys() {
        assert_ne!(
            idempotency_lock_key("a", "bc"),
            idempotency_lock_key("ab", "c")
        );
        assert_ne!(
            idempotency_lock_key("s", "k"),
            idempotency_lock_key("t", "k")
        );
        assert_ne!(migration_lock_key("s"), migration_lock_key("t"));
        assert_ne!(unique_lock_key("s", "k"), idempotency_lock_key("s", "k"));
        assert_ne!(unique_lock_key("s", "k"), unique_lock_key("t", "k"));
        assert_ne!(
            depth_lock_key("s", "q", None),
            depth_lock_key("t", "q", None)
        );
        assert_ne!(
            depth_lock_key("s", "q", None),
            depth_lock_key("s", "q", Some("a"))
        );
        assert_ne!(
            depth_lock_key("s", "q", Some("ab")),
            depth_lock_key("s", "qa", Some("b"))
        );
        assert_ne!(
            depth_lock_key("s", "q", None),
            idempotency_lock_key("s", "q")
        );
        assert_ne!(
            concurrency_lock_key("s", "q"),
            depth_lock_key("s", "q", None)
        );
        assert_ne!(
            concurrency_lock_key("s", "q"),
            concurrency_lock_key("t", "q")
        );
    }
}
