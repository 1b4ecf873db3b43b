//! Configuration the servers of a cluster share, kept in the store as named JSON documents by
//! collection: event sources today (`sources`), and the webhooks and subscriptions that follow.
//! Every server reads the same documents, so a change made through any of them reaches all.
//!
//! The store keeps documents as given; what a document means, and its checks, belong to its
//! collection's owner (`crate::sources` for sources).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{StoreResult, ValidationError};
use crate::fields;

/// The collection of event sources (documents: [`crate::sources::SourceSpec`]).
pub const SOURCES: &str = "sources";

/// The collection of signed inbound webhooks (documents: [`crate::hooks::HookSpec`]).
pub const HOOKS: &str = "hooks";

/// The collection of event subscriptions (documents:
/// [`crate::subscriptions::SubscriptionSpec`]).
pub const SUBSCRIPTIONS: &str = "subscriptions";

/// The collection of named limits (documents: [`crate::limits::LimitSpec`]).
pub const LIMITS: &str = "limits";

/// One named document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigEntry {
    pub collection: String,
    pub name: String,
    pub document: Value,
    /// When it was last put, by the store's clock.
    pub updated_at: DateTime<Utc>,
}

/// Checks a collection's and a document's name (the names the store keys on).
pub fn validate_key(collection: &str, name: &str) -> Result<(), ValidationError> {
    fields::name("collection", collection)?;
    fields::name("name", name)
}

/// Shared configuration documents (see the module's documentation).
#[async_trait]
pub trait ConfigStore: Send + Sync {
    /// Creates or replaces a document; `updated_at` is set from the store's clock.
    async fn config_put(
        &self,
        collection: &str,
        name: &str,
        document: Value,
    ) -> StoreResult<ConfigEntry>;

    /// A document, `None` when there is none by that name.
    async fn config_get(&self, collection: &str, name: &str) -> StoreResult<Option<ConfigEntry>>;

    /// Every document of a collection, by name.
    async fn config_list(&self, collection: &str) -> StoreResult<Vec<ConfigEntry>>;

    /// Deletes a document; false when there was none.
    async fn config_delete(&self, collection: &str, name: &str) -> StoreResult<bool>;
}
