//! Compute billing over the fake driver: a pool claim's reservation follows the claimed id,
//! the ticker pauses a sandbox its wallet cannot cover (and resume is refused until a credit),
//! recovery settles what ended unsettled and drops orphaned reservations, and model charges
//! show on the sandbox object.

use super::*;
use cella_billing::{Holder, ModelCharge};
use cella_types::Money;
use serde_json::json;

fn m(s: &str) -> Money {
    s.parse().expect("amount")
}

/// The operator's own (default) workspace, at `rate`, with `credit` in its wallet.
async fn funded(s: &Server, rate: &str, credit: &str) -> String {
    let (status, v) = s.call("GET", "/api/v1/workspaces", None).await;
    assert_eq!(status, 200, "{v}");
    let ws = v["data"][0]["id"].as_str().expect("id").to_string();
    let (status, v) = s
        .call(
            "PATCH",
            &format!("/api/v1/workspaces/{ws}"),
            Some(json!({ "settings": { "compute_rate": rate } })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = s
        .call(
            "POST",
            &format!("/api/v1/workspaces/{ws}/wallet/credits"),
            Some(json!({ "amount": credit, "reference": "t" })),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    ws
}

async fn holders(s: &Server) -> Vec<(Holder, Money)> {
    s.state
        .billing
        .reservations()
        .await
        .expect("reservations")
        .into_iter()
        .map(|r| (r.holder, r.amount))
        .collect()
}

#[tokio::test]
async fn a_pool_claim_carries_the_reservation_to_the_claimed_sandbox() {
    let s = Server::start_with(|c| {
        c.pool.sizes.insert("small".into(), 1);
    })
    .await;
    crate::pool::refill(&s.state).await.expect("refill");
    let ws = funded(&s, "0.01", "1").await;
    let sb = s.create(json!({})).await;
    let id = id(&sb);
    assert_eq!(sb["compute_rate"], "0.010000");
    assert_eq!(
        holders(&s).await,
        vec![(Holder::Sandbox(id.clone()), m("0.6"))]
    );
    let (status, d) = s
        .call("DELETE", &format!("/api/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["data"]["compute_cost"], "0.600000");
    assert!(holders(&s).await.is_empty());
    let w = s.state.billing.wallet(&ws).await.expect("wallet");
    assert_eq!((w.balance, w.reserved), (m("0.4"), Money::ZERO));
}

#[tokio::test]
async fn the_ticker_pauses_what_the_wallet_cannot_cover_and_resume_waits_for_a_credit() {
    let s = Server::start().await;
    let ws = funded(&s, "0.01", "0.6").await;
    let sb = s.create(json!({})).await;
    let id = id(&sb);
    // 55 s have run: less than 10 s of its reservation left, and nothing to raise it with.
    let mut row = s.state.store.sandbox(&id).await.expect("row").expect("row");
    row.running_ms = 55_000;
    s.state.store.update_sandbox(&row).await.expect("update");
    crate::lifecycle::billing_tick(&s.state, false).await;
    let got = s.get(&id).await;
    assert_eq!(got["state"], "paused", "{got}");
    assert_eq!(got["state_reason"], crate::billing::OUT_OF_FUNDS);
    let w = s.state.billing.wallet(&ws).await.expect("wallet");
    assert!(
        w.available >= Money::ZERO && w.reserved <= w.balance,
        "{w:?}"
    );
    let (status, v) = s.act(&id, "resume").await;
    assert_eq!((status, error(&v).0), (402, "INSUFFICIENT_FUNDS"), "{v}");
    assert_eq!(s.get(&id).await["state"], "paused");
    s.state
        .billing
        .credit(&ws, m("1"), None)
        .await
        .expect("credit");
    let (status, v) = s.act(&id, "resume").await;
    assert_eq!(status, 200, "{v}");
    crate::lifecycle::billing_tick(&s.state, false).await;
    assert_eq!(s.get(&id).await["state"], "running", "covered now");
    let (status, d) = s
        .call("DELETE", &format!("/api/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200, "{d}");
    let cost = m(d["data"]["compute_cost"].as_str().expect("cost"));
    assert!(cost >= m("0.6"), "{cost}");
    let w = s.state.billing.wallet(&ws).await.expect("wallet");
    assert_eq!(w.balance, m("1.6").checked_sub(cost).expect("sub"));
    assert_eq!(w.reserved, Money::ZERO);
}

#[tokio::test]
async fn recovery_settles_ended_sandboxes_and_drops_orphaned_reservations() {
    let s = Server::start().await;
    let ws = funded(&s, "0.001", "5").await;
    let sb = s.create(json!({})).await;
    let id = id(&sb);
    // As after a crash between a destroy's row update and its settlement.
    let mut row = s.state.store.sandbox(&id).await.expect("row").expect("row");
    crate::sandboxes::settle(&s.state, &mut row, crate::util::now_ms());
    row.state = cella_types::SandboxState::Destroyed;
    row.destroyed_at = Some(crate::util::now_ms());
    s.state.store.update_sandbox(&row).await.expect("update");
    // And a reservation whose sandbox was never stored.
    s.state
        .billing
        .reserve(&ws, &Holder::Sandbox("sbnever".into()), m("0.06"))
        .await
        .expect("reserve");
    let s = s.restart().await;
    crate::billing::recover(&s.state, true).await;
    assert!(holders(&s).await.is_empty());
    let entries = s.state.billing.ledger(&ws, 10, None).await.expect("ledger");
    let compute: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == cella_billing::EntryKind::Compute)
        .collect();
    assert_eq!(compute.len(), 1);
    assert_eq!(compute[0].sandbox_id.as_deref(), Some(id.as_str()));
    assert_eq!(compute[0].amount, m("-0.06"));
    // Again: nothing more.
    crate::billing::recover(&s.state, true).await;
    assert_eq!(
        s.state
            .billing
            .ledger(&ws, 10, None)
            .await
            .expect("ledger")
            .len(),
        entries.len()
    );
    assert_eq!(s.get(&id).await["compute_cost"], "0.060000");
}

#[tokio::test]
async fn model_charges_show_on_the_sandbox() {
    let s = Server::start().await;
    let ws = funded(&s, "0", "1").await;
    let sb = s.create(json!({})).await;
    let id = id(&sb);
    for (req, amount) in [("r1", "0.25"), ("r2", "0.000001"), ("r1", "0.25")] {
        s.state
            .billing
            .charge_model(ModelCharge {
                workspace_id: ws.clone(),
                sandbox_id: Some(id.clone()),
                task_id: None,
                model: "m".into(),
                input_tokens: 1,
                output_tokens: 2,
                amount: m(amount),
                request_id: req.into(),
            })
            .await
            .expect("charge");
    }
    let got = s.get(&id).await;
    assert_eq!(got["model_cost"], "0.250001");
    assert_eq!(got["compute_cost"], "0.000000", "rate 0");
    let (status, v) = s
        .call("DELETE", &format!("/api/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["data"]["model_cost"], "0.250001");
    // At a rate of 0: no compute entry at all.
    let entries = s.state.billing.ledger(&ws, 10, None).await.expect("ledger");
    assert_eq!(entries.len(), 3, "the credit and two model entries");
}

#[tokio::test]
async fn a_fork_reserves_for_each_child_or_makes_none() {
    let s = Server::start().await;
    let ws = funded(&s, "0.01", "1.5").await;
    let src = id(&s.create(json!({})).await);
    // Two children need 1.2; 0.9 is available: 402, and no child is made.
    let (status, v) = s
        .call(
            "POST",
            &format!("/api/v1/sandboxes/{src}/fork"),
            Some(json!({ "count": 2 })),
        )
        .await;
    assert_eq!((status, error(&v).0), (402, "INSUFFICIENT_FUNDS"), "{v}");
    assert_eq!(s.listed().await, vec![src.clone()]);
    assert_eq!(holders(&s).await.len(), 1);
    let (status, v) = s
        .call(
            "POST",
            &format!("/api/v1/sandboxes/{src}/fork"),
            Some(json!({ "count": 1 })),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let child = &v["data"][0];
    assert_eq!(child["compute_rate"], "0.010000");
    assert_eq!(holders(&s).await.len(), 2);
    let w = s.state.billing.wallet(&ws).await.expect("wallet");
    assert_eq!((w.reserved, w.available), (m("1.2"), m("0.3")));
}
