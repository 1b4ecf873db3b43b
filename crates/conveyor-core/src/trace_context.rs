//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>) carried by a job: the producer's
//! `traceparent` (and `tracestate`) are stored with the job and handed to the worker, which runs
//! the handler as a child span of it, so one trace follows the work across the queue.

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

/// Longest `tracestate` kept (the specification allows 32 list members of at most 256
/// characters each; 512 characters is what it asks vendors to propagate at least).
pub const MAX_TRACESTATE_LEN: usize = 8192;

/// Checks a `tracestate` (printable ASCII of at most [`MAX_TRACESTATE_LEN`] characters), also
/// when it comes without a `traceparent` (it is then dropped, but bad input is still refused).
pub fn check_tracestate(state: &str, field_prefix: &str) -> Result<(), ValidationError> {
    if state.len() > MAX_TRACESTATE_LEN || !state.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(ValidationError::new(
            format!("{field_prefix}tracestate"),
            format!("must be printable ASCII of at most {MAX_TRACESTATE_LEN} characters"),
        ));
    }
    Ok(())
}

/// A job's trace context, as received: `traceparent` checked against the version-00 format,
/// `tracestate` kept opaque.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// Checks `traceparent` (version 00: `00-<32 hex trace id>-<16 hex parent id>-<2 hex
    /// flags>`, lowercase, neither id all zeros; the only version the specification defines,
    /// and exactly what the API document states) and `tracestate` (printable ASCII). Errors
    /// name `field_prefix` + `traceparent` or `tracestate`.
    pub fn parse(
        traceparent: &str,
        tracestate: Option<&str>,
        field_prefix: &str,
    ) -> Result<Self, ValidationError> {
        let field = |name: &str| format!("{field_prefix}{name}");
        let parts: Vec<&str> = traceparent.split('-').collect();
        let hex = |s: &str, len: usize| {
            s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let well_formed = parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && hex(parts[2], 16)
            && hex(parts[3], 2)
            && parts[1].bytes().any(|b| b != b'0')
            && parts[2].bytes().any(|b| b != b'0');
        if !well_formed {
            return Err(ValidationError::new(
                field("traceparent"),
                format!(
                    "{traceparent:?} is not a W3C traceparent \
                     (00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>, ids not all zeros)"
                ),
            ));
        }
        let tracestate = match tracestate {
            None => None,
            Some(state) => {
                check_tracestate(state, field_prefix)?;
                Some(state.trim())
                    .filter(|state| !state.is_empty())
                    .map(str::to_string)
            }
        };
        Ok(Self {
            traceparent: traceparent.to_string(),
            tracestate,
        })
    }

    /// Checks a context built elsewhere (a stored or deserialized one).
    pub fn validate(&self) -> Result<(), ValidationError> {
        Self::parse(&self.traceparent, self.tracestate.as_deref(), "").map(|_| ())
    }

    /// The trace id (32 hex digits).
    pub fn trace_id(&self) -> &str {
        self.traceparent.get(3..35).unwrap_or_default()
    }

    /// The parent span id (16 hex digits): the producer's span.
    pub fn parent_id(&self) -> &str {
        self.traceparent.get(36..52).unwrap_or_default()
    }

    /// Whether the producer sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.traceparent
            .get(53..55)
            .and_then(|flags| u8::from_str_radix(flags, 16).ok())
            .is_some_and(|flags| flags & 1 == 1)
    }

    /// The context of a child span `span_id` (16 hex digits) of this one: same trace and
    /// flags, `tracestate` passed on.
    pub fn child(&self, span_id: &str) -> TraceContext {
        let flags = self.traceparent.get(53..55).unwrap_or("00");
        TraceContext {
            traceparent: format!("00-{}-{span_id}-{flags}", self.trace_id()),
            tracestate: self.tracestate.clone(),
        }
    }

    /// A new span id: 16 random hex digits, never all zeros.
    pub fn new_span_id() -> String {
        loop {
            let id = format!("{:016x}", rand::random::<u64>());
            if id.bytes().any(|b| b != b'0') {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_is_kept_and_read() {
        let context = TraceContext::parse(GOOD, Some("congo=t61rcWkgMzE"), "").expect("valid");
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.parent_id(), "00f067aa0ba902b7");
        assert!(context.sampled());
        let child = context.child("b7ad6b7169203331");
        assert_eq!(
            child.traceparent,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
        );
        assert_eq!(child.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
    }

    #[test]
    fn malformed_traceparents_are_refused_naming_the_field() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let error = TraceContext::parse(bad, None, "jobs[1].").expect_err(bad);
            assert_eq!(error.field, "jobs[1].traceparent", "{bad}");
        }
        let error = TraceContext::parse(GOOD, Some("a=\u{1}"), "").expect_err("control char");
        assert_eq!(error.field, "tracestate");
    }
}
