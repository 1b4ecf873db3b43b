//! `GET/POST /v1/tokens` and `DELETE /v1/tokens/{token}`: API tokens, for admins (the same
//! operations as `conveyor token create|list|revoke`, which work on the store directly).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use conveyor_core::access::{create_token, revoke_token};
use conveyor_core::{ApiToken, Role, TokenSelector};
use serde::Deserialize;

use conveyor_core::wire;

use crate::api::{CreatedToken, TokenList};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRequest {
    role: String,
    #[serde(default, deserialize_with = "wire::non_null")]
    name: Option<String>,
}

pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<CreateRequest>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let role: Role = request.role.parse()?;
    let created = create_token(state.store.as_ref(), role, request.name, caller.actor).await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            token: created.token,
            secret: created.secret.plaintext,
        }),
    ))
}

pub(crate) async fn list(State(state): State<AppState>) -> ApiResult<Json<TokenList>> {
    Ok(Json(TokenList {
        tokens: state.store.tokens_list().await?,
    }))
}

/// Revokes the token with that id, or the active token with that name.
pub(crate) async fn revoke(
    State(state): State<AppState>,
    caller: Caller,
    Path(token): Path<String>,
) -> ApiResult<Json<ApiToken>> {
    revoke_token(
        state.store.as_ref(),
        TokenSelector::parse(&token),
        caller.actor,
    )
    .await?
    .map(Json)
    .ok_or(ApiError::TokenNotFound(token))
}
