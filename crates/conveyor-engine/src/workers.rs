//! The commands operators gave workers, as this process last read them.

use std::time::Duration;

use conveyor_core::workers::WorkerCommand;

/// The commands operators gave workers, as this process last read them from the registry
/// (at most [`WorkerCommands::MAX_AGE`] old): what the server checks before handing out jobs.
pub struct WorkerCommands {
    store: std::sync::Arc<dyn conveyor_core::Store>,
    cell: crate::refreshed::Refreshed<std::collections::HashMap<String, WorkerCommand>>,
}

impl WorkerCommands {
    /// How stale the commands may be: a command given through another server takes effect
    /// here within this long.
    pub const MAX_AGE: Duration = Duration::from_secs(1);

    pub fn new(store: std::sync::Arc<dyn conveyor_core::Store>) -> Self {
        Self {
            store,
            cell: crate::refreshed::Refreshed::new(Self::MAX_AGE),
        }
    }

    /// The command given to `worker_id`, if any.
    pub async fn of(&self, worker_id: &str) -> conveyor_core::StoreResult<Option<WorkerCommand>> {
        let store = self.store.clone();
        let commands = self
            .cell
            .get(|| async move {
                Ok(store
                    .workers_list()
                    .await?
                    .into_iter()
                    .filter_map(|worker| worker.command.map(|command| (worker.id, command)))
                    .collect())
            })
            .await?;
        Ok(commands.get(worker_id).copied())
    }

    /// A command this process just stored: in effect here at once.
    pub fn told(&self, worker_id: &str, command: Option<WorkerCommand>) {
        self.cell.update(|commands| {
            let mut commands = commands.clone();
            match command {
                Some(command) => commands.insert(worker_id.to_string(), command),
                None => commands.remove(worker_id),
            };
            commands
        });
    }
}
