//! The sources file `conveyor serve --sources FILE` reads at start: named event sources in TOML
//! (or JSON when the file name ends in `.json`), each in the shape of `conveyor_core::sources::
//! SourceSpec`.
//!
//! ```toml
//! [sources.orders]
//! type = "redis_stream"
//! url = "redis://127.0.0.1:6379"   # or url_env = "ORDERS_REDIS_URL" for a URL with a password
//! stream = "orders"
//! group = "conveyor"
//! job = { kind = "order.placed", queue = "orders" }
//! max_in_flight = 1000
//! ```
//!
//! The JSON form is `{"sources": {"orders": {"type": "redis_stream", ...}}}`.

use conveyor_core::sources::SourceSpec;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceFile {
    #[serde(default)]
    sources: BTreeMap<String, SourceSpec>,
}

/// Why a sources file was refused; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum SourceFileError {
    #[error("cannot read sources file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sources file {} is not a valid sources file: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("sources file {}: source {name:?}: invalid {field}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        name: String,
        field: String,
        message: String,
    },
}

/// Reads and checks every source of the file at `path` (see the module documentation).
pub fn load_sources(path: &Path) -> Result<Vec<SourceSpec>, SourceFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| SourceFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let syntax = |message: String| SourceFileError::Syntax {
        path: path.to_path_buf(),
        message,
    };
    let file: SourceFile = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| syntax(e.to_string()))?
    } else {
        toml::from_str(&text).map_err(|e| syntax(e.to_string()))?
    };
    let mut sources = Vec::with_capacity(file.sources.len());
    for (name, mut spec) in file.sources {
        spec.name = name.clone();
        spec.validate().map_err(|e| SourceFileError::Invalid {
            path: path.to_path_buf(),
            name,
            field: e.field,
            message: e.message,
        })?;
        sources.push(spec);
    }
    Ok(sources)
}
