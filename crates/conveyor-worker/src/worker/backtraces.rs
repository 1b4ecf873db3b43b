//! Backtraces of handlers' panics, for the job's history.
//!
//! A handler runs in a task of its own; when it panics, the panic hook of this process runs on
//! that task's thread, still inside the task. The hook installed here captures a backtrace
//! there, keyed by the task's id, and chains to the hook installed before it (logging stays as
//! it was). The worker takes the backtrace by the id of the task whose join reported the panic.

use std::collections::HashMap;
use std::sync::{Mutex, Once};

static INSTALL: Once = Once::new();
static CAPTURED: Mutex<Option<HashMap<tokio::task::Id, String>>> = Mutex::new(None);
/// Most backtraces kept unclaimed (panics outside handlers' tasks are captured too).
const MAX_KEPT: usize = 1_024;

/// Installs the capturing hook once per process.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(id) = tokio::task::try_id() {
                let trace = std::backtrace::Backtrace::force_capture().to_string();
                if let Ok(mut captured) = CAPTURED.lock() {
                    let captured = captured.get_or_insert_with(HashMap::new);
                    if captured.len() >= MAX_KEPT {
                        captured.clear();
                    }
                    captured.insert(id, trace);
                }
            }
            previous(info);
        }));
    });
}

/// The backtrace of the panic of task `id`, if one was captured.
pub(crate) fn take(id: tokio::task::Id) -> Option<String> {
    CAPTURED.lock().ok()?.as_mut()?.remove(&id)
}
