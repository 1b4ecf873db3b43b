//! The schedules file `conveyor serve --schedules FILE` reads at start: named cron or interval
//! schedules (`cron = "..."` or `every = "30s"`),
//! in TOML (or JSON when the file name ends in `.json`), each in the shape of the body of
//! `PUT /v1/schedules/{name}`.
//!
//! ```toml
//! [schedules.nightly-report]
//! cron = "0 3 * * *"
//! timezone = "Europe/Berlin"
//! missed = "catch_up"
//! max_catch_up = 3
//! job = { kind = "nightly_report", queue = "reports", payload = { day = "yesterday" } }
//!
//! [schedules.heartbeat]
//! cron = "*/10 * * * * *"
//! job = { kind = "heartbeat" }
//!
//! [schedules.cache-refresh]
//! every = "5m"
//! job = { kind = "refresh_cache" }
//! ```
//!
//! The JSON form is `{"schedules": {"nightly-report": {"cron": ..., "job": {...}}}}`.

use conveyor_core::{Schedule, ScheduleSpec};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleFile {
    #[serde(default)]
    schedules: BTreeMap<String, ScheduleSpec>,
}

/// Why a schedules file was refused; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleFileError {
    #[error("cannot read schedules file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("schedules file {} is not a valid schedules file: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("schedules file {}: schedule {name:?}: invalid {field}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        name: String,
        field: String,
        message: String,
    },
}

/// Reads and validates every schedule of the file at `path` (see the module documentation).
pub fn load_schedules(path: &Path) -> Result<Vec<Schedule>, ScheduleFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScheduleFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let json = path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
    parse_schedules(&text, json).map_err(|error| match error {
        ScheduleFileError::Syntax { message, .. } => ScheduleFileError::Syntax {
            path: path.to_path_buf(),
            message,
        },
        ScheduleFileError::Invalid {
            name,
            field,
            message,
            ..
        } => ScheduleFileError::Invalid {
            path: path.to_path_buf(),
            name,
            field,
            message,
        },
        read @ ScheduleFileError::Read { .. } => read,
    })
}

/// Parses and validates schedules from TOML text (or JSON when `json`), sorted by name.
pub fn parse_schedules(text: &str, json: bool) -> Result<Vec<Schedule>, ScheduleFileError> {
    let syntax = |message: String| ScheduleFileError::Syntax {
        path: PathBuf::new(),
        message,
    };
    let file: ScheduleFile = if json {
        serde_json::from_str(text).map_err(|e| syntax(e.to_string()))?
    } else {
        toml::from_str(text).map_err(|e| syntax(e.to_string()))?
    };
    file.schedules
        .into_iter()
        .map(|(name, spec)| {
            Schedule::from_spec(name.as_str(), spec).map_err(|e| ScheduleFileError::Invalid {
                path: PathBuf::new(),
                name,
                field: e.field,
                message: e.message,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor_core::{MissedPolicy, OverlapPolicy};

    #[test]
    fn toml_and_json_files_parse() {
        let toml = r#"
            [schedules.nightly-report]
            cron = "0 3 * * *"
            timezone = "Europe/Berlin"
            missed = "catch_up"
            max_catch_up = 3
            overlap = "allow"
            job = { kind = "nightly_report", queue = "reports", payload = { day = "yesterday", n = 2 } }

            [schedules.heartbeat]
            cron = "*/10 * * * * *"
            [schedules.heartbeat.job]
            kind = "heartbeat"
        "#;
        let schedules = parse_schedules(toml, false).expect("valid");
        assert_eq!(schedules.len(), 2);
        assert_eq!(schedules[0].name(), "heartbeat");
        assert_eq!(schedules[0].timezone(), "UTC");
        let nightly = &schedules[1];
        assert_eq!(nightly.name(), "nightly-report");
        assert_eq!(nightly.missed(), MissedPolicy::CatchUp { max: 3 });
        assert_eq!(nightly.overlap(), OverlapPolicy::Allow);
        assert_eq!(
            nightly.job().payload,
            serde_json::json!({"day": "yesterday", "n": 2})
        );
        assert_eq!(nightly.job().queue, "reports");

        let every = r#"
            [schedules.refresh]
            every = "1h30m"
            missed = "catch_up"
            job = { kind = "refresh" }
        "#;
        let schedules = parse_schedules(every, false).expect("valid");
        assert_eq!(
            schedules[0].every(),
            Some(std::time::Duration::from_secs(5_400))
        );
        assert_eq!(schedules[0].cron(), "");
        assert_eq!(schedules[0].missed(), MissedPolicy::CatchUp { max: 10 });
        for (bad, field) in [
            ("every = \"30\"", "every"),
            ("every = \"0s\"", "every"),
            ("every = \"30s\"\ncron = \"* * * * *\"", "every"),
            ("every = \"30s\"\ntimezone = \"Europe/Berlin\"", "timezone"),
            ("", "cron"),
        ] {
            let text = format!("[schedules.b]\n{bad}\njob = {{ kind = \"k\" }}\n");
            match parse_schedules(&text, false) {
                Err(ScheduleFileError::Invalid { name, field: f, .. }) => {
                    assert_eq!((name.as_str(), f.as_str()), ("b", field), "{bad}");
                }
                other => panic!("{bad}: expected Invalid, got {other:?}"),
            }
        }

        let json = r#"{"schedules": {"ping": {"cron": "* * * * *", "job": {"kind": "ping"}}}}"#;
        let schedules = parse_schedules(json, true).expect("valid");
        assert_eq!(schedules[0].name(), "ping");
        assert!(parse_schedules("", false).expect("empty").is_empty());
    }

    #[test]
    fn errors_name_the_schedule_and_field() {
        let bad_zone = r#"
            [schedules.x]
            cron = "* * * * *"
            timezone = "Nowhere/Special"
            job = { kind = "k" }
        "#;
        match parse_schedules(bad_zone, false) {
            Err(ScheduleFileError::Invalid { name, field, .. }) => {
                assert_eq!((name.as_str(), field.as_str()), ("x", "timezone"));
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        let bad_cron = r#"{"schedules": {"y": {"cron": "nope", "job": {"kind": "k"}}}}"#;
        match parse_schedules(bad_cron, true) {
            Err(ScheduleFileError::Invalid { name, field, .. }) => {
                assert_eq!((name.as_str(), field.as_str()), ("y", "cron"));
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        let unknown = "[schedules.z]\ncron = \"* * * * *\"\nbogus = 1\njob = { kind = \"k\" }\n";
        let error = parse_schedules(unknown, false).expect_err("unknown field");
        assert!(error.to_string().contains("bogus"), "{error}");
        let error = load_schedules(Path::new("/nonexistent/schedules.toml")).expect_err("missing");
        assert!(
            error.to_string().contains("/nonexistent/schedules.toml"),
            "{error}"
        );
    }
}
