//! What the fuzzer has learnt from answers, so valid requests reach the store.

use super::*;

#[derive(Default)]
pub(super) struct World {
    /// (job id, lease token) of jobs fetched and maybe still running.
    pub(super) leases: Vec<(Uuid, Uuid)>,
    pub(super) jobs: Vec<Uuid>,
    pub(super) dead: Vec<Uuid>,
    pub(super) schedules: Vec<String>,
    /// Token ids and names created over HTTP, and secrets answered by token creation.
    pub(super) tokens: Vec<String>,
    pub(super) secrets: Vec<String>,
    /// Session cookies of the auth server.
    pub(super) sessions: Vec<String>,
}

pub(super) fn keep<T>(list: &mut Vec<T>, item: T) {
    list.push(item);
    if list.len() > 64 {
        list.remove(0);
    }
}
