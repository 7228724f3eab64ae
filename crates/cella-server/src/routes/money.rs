//! A workspace's wallet, credits, ledger and usage (`/api/v1/workspaces/{id}/...`).
//!
//! Reading (wallet, ledger, usage): scope `admin`, for the caller's own workspace; the operator
//! for any. Another workspace is 404, as one that does not exist. Credits: the operator only.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{cursor_for, reject_unknown, ApiBody, Page, QueryPairs};
use crate::util::{now_ms, parse_rfc3339, rfc3339};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cella_billing::{EntryKind, CURRENCY};
use cella_types::{
    CreditRequest, Data, LedgerEntry, LedgerKind, List, UsageDay, UsageFigures, UsageReport, Wallet,
};
use std::sync::Arc;

/// The longest range one usage request covers.
const MAX_USAGE_DAYS: i64 = 366;
const DAY_MS: i64 = 86_400_000;

/// The workspace `id` when the caller may see its money (else 404).
async fn visible(state: &AppState, auth: &Auth, id: &str) -> Result<String, ApiError> {
    if !auth.manages(id) {
        return Err(ApiError::not_found("workspace"));
    }
    state
        .store
        .workspace(id)
        .await?
        .map(|w| w.id)
        .ok_or_else(|| ApiError::not_found("workspace"))
}

fn wallet_wire(w: cella_billing::Wallet) -> Wallet {
    Wallet {
        balance: w.balance,
        reserved: w.reserved,
        available: w.available,
        currency: CURRENCY.to_string(),
    }
}

pub fn entry_wire(e: &cella_billing::LedgerEntry) -> LedgerEntry {
    LedgerEntry {
        id: e.id.clone(),
        at: rfc3339(e.at_ms),
        kind: match e.kind {
            EntryKind::Credit => LedgerKind::Credit,
            EntryKind::Compute => LedgerKind::Compute,
            EntryKind::Model => LedgerKind::Model,
            EntryKind::Refund => LedgerKind::Refund,
        },
        amount: e.amount,
        balance_after: e.balance_after,
        sandbox_id: e.sandbox_id.clone(),
        task_id: e.task_id.clone(),
        reference: e.reference.clone(),
        model: e.model.clone(),
        input_tokens: e.input_tokens,
        output_tokens: e.output_tokens,
        compute_sec: e.compute_sec,
        compute_rate: e.rate,
    }
}

/// A workspace's wallet: balance, reserved, available.
#[utoipa::path(get, path = "/api/v1/workspaces/{id}/wallet", tag = "money",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Wallet>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn wallet(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Wallet>>, ApiError> {
    let ws = visible(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: wallet_wire(state.billing.wallet(&ws).await?),
    }))
}

/// Adds funds to a workspace's wallet: one `credit` ledger entry. The operator only.
#[utoipa::path(post, path = "/api/v1/workspaces/{id}/wallet/credits", tag = "money",
    params(("id" = String, Path)), request_body = CreditRequest,
    responses((status = 201, body = Data<LedgerEntry>), (status = 400, body = cella_types::ErrorBody),
              (status = 403, body = cella_types::ErrorBody), (status = 404, body = cella_types::ErrorBody)))]
pub async fn credit(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<LedgerEntry>>), ApiError> {
    let req: CreditRequest = body.json()?;
    let ws = visible(&state, &auth, &id).await?;
    if req.amount.micros() <= 0 || req.amount > cella_billing::MAX_BALANCE {
        return Err(ApiError::invalid(
            "amount",
            "amount must be more than 0 and at most 1000000000000",
        ));
    }
    let reference = req.reference.trim();
    if reference.is_empty()
        || reference.chars().count() > 200
        || reference.chars().any(char::is_control)
    {
        return Err(ApiError::invalid(
            "reference",
            "reference must be 1 to 200 characters, without control characters",
        ));
    }
    let entry = match state.billing.credit(&ws, req.amount, Some(reference)).await {
        Ok(e) => e,
        Err(cella_billing::BillingError::OutOfRange) => {
            return Err(ApiError::invalid(
                "amount",
                "the balance would pass its maximum of 1000000000000",
            ))
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(workspace = ws, amount = %req.amount, "credit added");
    Ok((
        StatusCode::CREATED,
        Json(Data {
            data: entry_wire(&entry),
        }),
    ))
}

/// A workspace's ledger, newest first (cursor pagination).
#[utoipa::path(get, path = "/api/v1/workspaces/{id}/ledger", tag = "money",
    params(("id" = String, Path), ("limit" = Option<u32>, Query, description = "1-1000, default 100"),
           ("cursor" = Option<String>, Query, description = "from next_cursor")),
    responses((status = 200, body = List<LedgerEntry>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn ledger(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(mut q): QueryPairs,
) -> Result<Json<List<LedgerEntry>>, ApiError> {
    let page = Page::take(&mut q)?;
    reject_unknown(&q)?;
    let ws = visible(&state, &auth, &id).await?;
    let rows = state.billing.ledger(&ws, page.limit, page.cursor).await?;
    let next_cursor = (rows.len() == page.limit as usize)
        .then(|| rows.last().map(|e| cursor_for(e.seq)))
        .flatten();
    Ok(Json(List {
        data: rows.iter().map(entry_wire).collect(),
        next_cursor,
    }))
}

/// A time given as RFC 3339, or as a date (`YYYY-MM-DD`, UTC midnight; as `to`, the end of
/// that day).
fn parse_time(field: &str, v: &str, end_of_day: bool) -> Result<i64, ApiError> {
    if let Some(ms) = parse_rfc3339(v) {
        return Ok(ms);
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        if v.len() == 10 {
            let ms = d
                .and_hms_opt(0, 0, 0)
                .map(|t| t.and_utc().timestamp_millis())
                .ok_or_else(|| ApiError::invalid(field, "not a valid date"))?;
            return Ok(if end_of_day { ms + DAY_MS } else { ms });
        }
    }
    Err(ApiError::invalid(
        field,
        format!("{field} must be an RFC 3339 time (2026-12-01T00:00:00Z) or a date (2026-12-01)"),
    ))
}

/// A workspace's usage per UTC day in `[from, to)` (default: the last 30 days), from its
/// ledger: compute (on the day it settled) and model requests, with totals.
#[utoipa::path(get, path = "/api/v1/workspaces/{id}/usage", tag = "money",
    params(("id" = String, Path),
           ("from" = Option<String>, Query, description = "RFC 3339 or YYYY-MM-DD; default: 30 days before `to`"),
           ("to" = Option<String>, Query, description = "RFC 3339 or YYYY-MM-DD (that day included); default: now")),
    responses((status = 200, body = Data<UsageReport>), (status = 400, body = cella_types::ErrorBody),
              (status = 404, body = cella_types::ErrorBody)))]
pub async fn usage(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(q): QueryPairs,
) -> Result<Json<Data<UsageReport>>, ApiError> {
    let (mut from, mut to) = (None, None);
    for (k, v) in &q {
        match k.as_str() {
            "from" if from.is_none() => from = Some(parse_time("from", v, false)?),
            "to" if to.is_none() => to = Some(parse_time("to", v, true)?),
            "from" | "to" => return Err(ApiError::invalid(k, format!("{k} given twice"))),
            _ => {
                return Err(ApiError::invalid(
                    k,
                    format!("unknown query parameter {k:?}"),
                ))
            }
        }
    }
    let to = to.unwrap_or_else(now_ms);
    let from = from.unwrap_or(to - 30 * DAY_MS);
    if from >= to {
        return Err(ApiError::invalid("from", "from must be before to"));
    }
    if to - from > MAX_USAGE_DAYS * DAY_MS {
        return Err(ApiError::invalid(
            "from",
            format!("a usage range is at most {MAX_USAGE_DAYS} days"),
        ));
    }
    let ws = visible(&state, &auth, &id).await?;
    let rows = state.billing.usage(&ws, from, to).await?;
    let mut totals = UsageFigures::default();
    let days = rows
        .into_iter()
        .map(|(date, figures)| {
            totals.add(&figures);
            UsageDay { date, figures }
        })
        .collect();
    Ok(Json(Data {
        data: UsageReport {
            from: rfc3339(from),
            to: rfc3339(to),
            currency: CURRENCY.to_string(),
            days,
            totals,
        },
    }))
}
