use super::*;

async fn billing() -> (tempfile::TempDir, Billing) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("cella.db")).await.unwrap();
    (dir, Billing::new(&store))
}

/// Another writer holding SQLite's write lock: the meter's writes wait for it until
/// [`release`].
async fn hold_writes(b: &Billing) -> sqlx::pool::PoolConnection<sqlx::Sqlite> {
    let mut holder = b.pool().acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

async fn release(mut holder: sqlx::pool::PoolConnection<sqlx::Sqlite>) {
    sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
}

fn m(s: &str) -> Money {
    s.parse().unwrap()
}

fn model(ws: &str, request_id: &str, amount: &str) -> ModelCharge {
    ModelCharge {
        workspace_id: ws.into(),
        sandbox_id: Some("sb1".into()),
        task_id: None,
        model: "gpt-test".into(),
        input_tokens: 1000,
        output_tokens: 20,
        amount: m(amount),
        request_id: request_id.into(),
    }
}

/// The amounts of a workspace's entries, and its balance: they must agree.
async fn sum_and_balance(b: &Billing, ws: &str) -> (Money, Money) {
    let entries = b.ledger(ws, 1000, None).await.unwrap();
    let sum = entries
        .iter()
        .fold(Money::ZERO, |a, e| a.checked_add(e.amount).unwrap());
    (sum, b.wallet(ws).await.unwrap().balance)
}

#[tokio::test]
async fn credits_and_charges_sum_to_the_balance_entry_by_entry() {
    let (_d, b) = billing().await;
    assert_eq!(
        b.wallet("ws1").await.unwrap(),
        Wallet {
            balance: Money::ZERO,
            reserved: Money::ZERO,
            available: Money::ZERO
        }
    );
    let c = b.credit("ws1", m("10"), Some("invoice 1")).await.unwrap();
    assert_eq!(
        (c.kind, c.amount, c.balance_after),
        (EntryKind::Credit, m("10"), m("10"))
    );
    assert_eq!(c.reference.as_deref(), Some("invoice 1"));
    let e = b
        .charge_model(model("ws1", "r1", "0.000123"))
        .await
        .unwrap();
    assert_eq!((e.amount, e.balance_after), (m("-0.000123"), m("9.999877")));
    assert_eq!((e.input_tokens, e.output_tokens), (Some(1000), Some(20)));
    b.credit("ws2", m("5"), None).await.unwrap();
    let (sum, balance) = sum_and_balance(&b, "ws1").await;
    assert_eq!((sum, balance), (m("9.999877"), m("9.999877")));
    // Newest first, each balance the one before plus its amount.
    let entries = b.ledger("ws1", 10, None).await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].kind, EntryKind::Model);
    assert_eq!(
        entries[1].balance_after.checked_add(entries[0].amount),
        Some(entries[0].balance_after)
    );
    // Pages.
    let older = b.ledger("ws1", 10, Some(entries[0].seq)).await.unwrap();
    assert_eq!(older.len(), 1);
    assert_eq!(older[0].id, entries[1].id);
    assert_eq!(b.wallet("ws2").await.unwrap().balance, m("5"));
}

#[tokio::test]
async fn bad_amounts_are_refused_and_write_nothing() {
    let (_d, b) = billing().await;
    for bad in ["0", "-1"] {
        assert!(matches!(
            b.credit("ws", m(bad), None).await,
            Err(BillingError::InvalidAmount(_))
        ));
    }
    assert!(b.credit("ws", Money::MAX, None).await.is_err());
    b.credit("ws", MAX_BALANCE, None).await.unwrap();
    assert!(matches!(
        b.credit("ws", m("0.000001"), None).await,
        Err(BillingError::OutOfRange)
    ));
    assert!(b.charge_model(model("ws", "neg", "-1")).await.is_err());
    assert_eq!(b.ledger("ws", 10, None).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_model_charge_is_written_once_per_request_and_may_overrun() {
    let (_d, b) = billing().await;
    b.credit("ws", m("1"), None).await.unwrap();
    let first = b.charge_model(model("ws", "req-a", "0.75")).await.unwrap();
    let again = b.charge_model(model("ws", "req-a", "0.75")).await.unwrap();
    assert_eq!(first, again);
    // Admitted requests are recorded even past what is available.
    let over = b.charge_model(model("ws", "req-b", "0.5")).await.unwrap();
    assert_eq!(over.balance_after, m("-0.25"));
    assert_eq!(b.available("ws").await.unwrap(), m("-0.25"));
    assert_eq!(b.ledger("ws", 10, None).await.unwrap().len(), 3);
    // The same request id in another workspace is another request.
    b.charge_model(model("other", "req-a", "0.1"))
        .await
        .unwrap();
    let costs = b.sandbox_costs(&["sb1", "nothing"]).await.unwrap();
    assert_eq!(costs["sb1"], (None, m("1.35")));
    assert!(!costs.contains_key("nothing"));
}

#[tokio::test]
async fn reservations_never_exceed_the_balance_even_when_concurrent() {
    let (_d, b) = billing().await;
    b.credit("ws", m("10"), None).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            b.reserve("ws", &Holder::Sandbox(format!("sb{i}")), m("1"))
                .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(BillingError::InsufficientFunds { needed, .. }) => assert_eq!(needed, m("1")),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ok, 10);
    let w = b.wallet("ws").await.unwrap();
    assert_eq!(
        (w.balance, w.reserved, w.available),
        (m("10"), m("10"), m("0"))
    );
    let held: Vec<Holder> = b
        .reservations()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.holder)
        .collect();
    assert_eq!(held.len(), 10);
    // The wallet is fully held: no raise is granted.
    for h in &held {
        assert!(!b.hold(h, m("2")).await.unwrap());
    }
    // Lowering always works, and frees what a raise may take.
    assert!(b.hold(&held[0], m("0.5")).await.unwrap());
    assert!(b.hold(&held[1], m("1.5")).await.unwrap());
    assert!(!b.hold(&held[2], m("1.000001")).await.unwrap());
    assert_eq!(b.available("ws").await.unwrap(), Money::ZERO);
    // A holder without a reservation cannot raise one.
    assert!(!b.hold(&Holder::Task("t".into()), m("0")).await.unwrap());
    b.release(&held[3]).await.unwrap();
    assert_eq!(b.available("ws").await.unwrap(), m("1"));
    assert_eq!(b.reservations().await.unwrap().len(), 9);
}

#[tokio::test]
async fn settling_charges_once_and_frees_the_reservation() {
    let (_d, b) = billing().await;
    b.credit("ws", m("100"), None).await.unwrap();
    let h = Holder::Sandbox("sbx".into());
    b.reserve("ws", &h, m("30")).await.unwrap();
    let s = Settlement {
        workspace_id: "ws".into(),
        holder: h.clone(),
        cost: compute_cost(m("0.5"), 61_001),
        compute_sec: billed_seconds(61_001),
        running_ms: 61_001,
        rate: m("0.5"),
    };
    assert_eq!(s.cost, m("31"));
    let e = b.settle(&s).await.unwrap().unwrap();
    assert_eq!(
        (e.kind, e.amount, e.compute_sec),
        (EntryKind::Compute, m("-31"), Some(62))
    );
    assert_eq!(e.sandbox_id.as_deref(), Some("sbx"));
    assert_eq!(b.reservation(&h).await.unwrap(), None);
    // Again (a retry, a restart's recovery): the same entry, nothing new.
    assert_eq!(b.settle(&s).await.unwrap(), Some(e.clone()));
    assert_eq!(b.compute_entry("ws", &h).await.unwrap(), Some(e));
    let w = b.wallet("ws").await.unwrap();
    assert_eq!((w.balance, w.reserved), (m("69"), Money::ZERO));
    assert_eq!(b.ledger("ws", 10, None).await.unwrap().len(), 2);
    // A zero cost writes an entry of 0 and frees the reservation.
    let t = Holder::Task("t1".into());
    b.reserve("ws", &t, m("5")).await.unwrap();
    let zero = Settlement {
        holder: t.clone(),
        cost: Money::ZERO,
        ..s.clone()
    };
    let z = b.settle(&zero).await.unwrap().unwrap();
    assert_eq!((z.amount, z.task_id.as_deref()), (Money::ZERO, Some("t1")));
    assert_eq!(b.available("ws").await.unwrap(), m("69"));
    let costs = b.sandbox_costs(&["sbx"]).await.unwrap();
    assert_eq!(costs["sbx"], (Some(m("31")), Money::ZERO));
}

#[tokio::test]
async fn the_ledger_refuses_updates_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("cella.db")).await.unwrap();
    let b = Billing::new(&store);
    b.credit("ws", m("1"), None).await.unwrap();
    for sql in [
        "UPDATE ledger SET amount = 1000000000",
        "DELETE FROM ledger",
        "UPDATE ledger SET balance_after = 0 WHERE kind = 'credit'",
    ] {
        let e = sqlx::query(sql).execute(store.pool()).await.unwrap_err();
        assert!(e.to_string().contains("append-only"), "{sql}: {e}");
    }
    assert_eq!(b.wallet("ws").await.unwrap().balance, m("1"));
}

#[test]
fn compute_is_billed_per_second_with_a_minimum_of_sixty() {
    assert_eq!(billed_seconds(0), 60);
    assert_eq!(billed_seconds(-5), 60);
    assert_eq!(billed_seconds(59_999), 60);
    assert_eq!(billed_seconds(60_000), 60);
    assert_eq!(billed_seconds(60_001), 61);
    assert_eq!(billed_seconds(3_600_000), 3600);
    assert_eq!(compute_cost(m("0.001"), 1000), m("0.06"));
    assert_eq!(compute_cost(m("0.000001"), 90_500), m("0.000091"));
    assert_eq!(compute_cost(Money::ZERO, 1_000_000), Money::ZERO);
    assert_eq!(compute_cost(Money::MAX, i64::MAX), MAX_BALANCE);
}

#[tokio::test]
async fn usage_is_per_day_from_compute_and_model_entries() {
    let (_d, b) = billing().await;
    b.credit("ws", m("100"), None).await.unwrap();
    b.charge_model(model("ws", "a", "0.2")).await.unwrap();
    b.charge_model(model("ws", "b", "0.3")).await.unwrap();
    b.settle(&Settlement {
        workspace_id: "ws".into(),
        holder: Holder::Sandbox("s".into()),
        cost: m("6"),
        compute_sec: 60,
        running_ms: 3000,
        rate: m("0.1"),
    })
    .await
    .unwrap();
    let days = b.usage("ws", 0, i64::MAX).await.unwrap();
    assert_eq!(days.len(), 1);
    let f = days[0].1;
    assert_eq!(
        f,
        UsageFigures {
            compute_sec: 60,
            compute_cost: m("6"),
            model_requests: 2,
            input_tokens: 2000,
            output_tokens: 40,
            model_cost: m("0.5"),
        }
    );
    assert_eq!(days[0].0.len(), 10, "a date: {}", days[0].0);
    assert!(b.usage("ws", 0, 1).await.unwrap().is_empty());
    assert!(b.usage("other", 0, i64::MAX).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_meter_writes_many_concurrent_charges_in_groups_each_once() {
    let (_d, b) = billing().await;
    b.credit("ws", m("100"), None).await.unwrap();
    let meter = ModelMeter::spawn(b.clone());
    let mut tasks = Vec::new();
    for i in 0..600 {
        let meter = meter.clone();
        tasks.push(tokio::spawn(async move {
            // Every request id twice: the second is the same request, written once.
            meter
                .submit(model("ws", &format!("r{i}"), "0.000100"))
                .await;
            meter
                .submit(model("ws", &format!("r{i}"), "0.000100"))
                .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    meter.flush().await;
    let entries = b.ledger("ws", 1000, None).await.unwrap();
    assert_eq!(entries.len(), 601, "one credit and one entry per request");
    let (sum, balance) = sum_and_balance(&b, "ws").await;
    assert_eq!((sum, balance), (m("99.940000"), m("99.940000")));
}

#[tokio::test]
async fn a_charge_that_cannot_be_written_does_not_take_its_group_with_it() {
    let (_d, b) = billing().await;
    let meter = ModelMeter::spawn(b.clone());
    meter.submit(model("ws", "ok-1", "0.5")).await;
    meter.submit(model("ws", "bad", "-1")).await;
    meter.submit(model("ws", "ok-2", "0.25")).await;
    meter.flush().await;
    let entries = b.ledger("ws", 10, None).await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(b.wallet("ws").await.unwrap().balance, m("-0.75"));
}

/// A task run owns its reservation; its compute settles once with its `task_id`; its model
/// entries are summed per run.
#[tokio::test]
async fn a_task_runs_reservation_settles_once_and_its_model_costs_are_its_own() {
    let (_d, b) = billing().await;
    b.credit("ws1", m("10"), None).await.unwrap();
    let h = Holder::Task("task1".into());
    b.reserve("ws1", &h, m("4")).await.unwrap();
    assert_eq!(b.wallet("ws1").await.unwrap().available, m("6"));
    for (i, amount) in ["0.25", "0.5"].iter().enumerate() {
        let mut c = model("ws1", &format!("r{i}"), amount);
        c.task_id = Some("task1".into());
        b.charge_model(c).await.unwrap();
    }
    b.charge_model(model("ws1", "other", "1")).await.unwrap();
    let costs = b.task_model_costs(&["task1", "task2"]).await.unwrap();
    assert_eq!(costs.get("task1"), Some(&(m("0.75"), 2)));
    assert_eq!(costs.get("task2"), None);
    let s = Settlement {
        workspace_id: "ws1".into(),
        holder: h.clone(),
        cost: m("0.6"),
        compute_sec: 60,
        running_ms: 30_000,
        rate: m("0.01"),
    };
    let first = b.settle(&s).await.unwrap().unwrap();
    let again = b.settle(&s).await.unwrap().unwrap();
    assert_eq!(first, again, "settled once");
    assert_eq!(first.task_id.as_deref(), Some("task1"));
    assert_eq!(first.sandbox_id, None);
    assert_eq!(b.reservation(&h).await.unwrap(), None);
    let (sum, balance) = sum_and_balance(&b, "ws1").await;
    assert_eq!((sum, balance), (m("7.65"), m("7.65")));
}

/// The meter counts what it has not written yet, and says it is behind from `MAX_BACKLOG` on
/// (the gateway then admits nothing new); once the writer catches up every charge is written,
/// once, and it is no longer behind.
#[tokio::test]
async fn the_meter_says_it_is_behind_while_its_backlog_is_full_and_loses_nothing() {
    let (_d, b) = billing().await;
    let meter = ModelMeter::spawn(b.clone());
    // Another writer holds SQLite's write lock: the meter's writes wait for it.
    let holder = hold_writes(&b).await;
    for i in 0..crate::meter::MAX_BACKLOG {
        assert!(!meter.behind(), "behind after {i} charges");
        meter
            .submit(model("ws", &format!("r{i}"), "0.000001"))
            .await;
    }
    assert!(meter.behind());
    assert_eq!(meter.backlog(), crate::meter::MAX_BACKLOG);
    release(holder).await;
    meter.flush().await;
    assert_eq!(meter.backlog(), 0);
    assert!(!meter.behind());
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ledger WHERE workspace_id = 'ws'")
        .fetch_one(b.pool())
        .await
        .unwrap();
    assert_eq!(n as usize, crate::meter::MAX_BACKLOG);
    assert_eq!(
        b.wallet("ws").await.unwrap().balance,
        Money::from_micros(-(crate::meter::MAX_BACKLOG as i64))
    );
}

/// A submit given up while it waits for room in the queue (its request's task dropped) counts
/// its charge off again, for its workspace too: nothing stays counted against it.
#[tokio::test]
async fn a_submit_given_up_leaves_nothing_counted() {
    let (_d, b) = billing().await;
    let meter = ModelMeter::spawn(b.clone());
    let holder = hold_writes(&b).await;
    // The queue full behind a held write: the next submit waits for room.
    let mut i = 0;
    loop {
        let submit = meter.submit(model("full", &format!("f{i}"), "0.000001"));
        i += 1;
        if tokio::time::timeout(std::time::Duration::from_millis(50), submit)
            .await
            .is_err()
        {
            // Given up while waiting: counted off again.
            break;
        }
        assert!(i < 20_000, "the queue never filled");
    }
    let queued = i - 1;
    assert_eq!(meter.backlog(), queued);
    assert_eq!(meter.backlog_of("full"), queued);
    release(holder).await;
    meter.flush().await;
    assert_eq!(meter.backlog(), 0);
    assert_eq!(meter.backlog_workspaces(), 0);
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ledger WHERE workspace_id = 'full'")
        .fetch_one(b.pool())
        .await
        .unwrap();
    assert_eq!(n as usize, queued, "the given-up charge is not written");
}

/// One workspace's burst fills only its share of the backlog: its next requests wait, the
/// other workspaces' are still admitted until the shared bound, and once written every
/// charge is there once and nothing stays counted.
#[tokio::test]
async fn one_workspaces_burst_leaves_the_others_room_in_the_backlog() {
    use crate::meter::{Behind, MAX_BACKLOG, WORKSPACE_BACKLOG};
    let (_d, b) = billing().await;
    let meter = ModelMeter::spawn(b.clone());
    let holder = hold_writes(&b).await;
    for i in 0..WORKSPACE_BACKLOG {
        assert_eq!(meter.behind_for("busy"), None, "behind after {i} charges");
        meter
            .submit(model("busy", &format!("b{i}"), "0.000001"))
            .await;
    }
    assert_eq!(meter.behind_for("busy"), Some(Behind::Workspace));
    assert_eq!(meter.behind_for("quiet"), None);
    assert!(!meter.behind());
    assert_eq!(meter.backlog_of("busy"), WORKSPACE_BACKLOG);
    assert_eq!(meter.backlog_of("quiet"), 0);
    // Another workspace fills the rest of the shared bound, under its own share: then every
    // workspace waits, one with nothing pending too.
    for i in 0..(MAX_BACKLOG - WORKSPACE_BACKLOG) {
        meter
            .submit(model("w1", &format!("w1-{i}"), "0.000001"))
            .await;
    }
    assert_eq!(meter.backlog(), MAX_BACKLOG);
    assert_eq!(meter.behind_for("w1"), Some(Behind::Gateway));
    assert_eq!(meter.behind_for("quiet"), Some(Behind::Gateway));
    release(holder).await;
    meter.flush().await;
    assert_eq!(meter.backlog(), 0);
    for w in ["busy", "w1", "quiet"] {
        assert_eq!(meter.backlog_of(w), 0, "{w}");
        assert_eq!(meter.behind_for(w), None, "{w}");
    }
    assert_eq!(meter.backlog_workspaces(), 0, "no workspace stays counted");
    for (w, n) in [
        ("busy", WORKSPACE_BACKLOG),
        ("w1", MAX_BACKLOG - WORKSPACE_BACKLOG),
    ] {
        let (written,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM ledger WHERE workspace_id = ?")
                .bind(w)
                .fetch_one(b.pool())
                .await
                .unwrap();
        assert_eq!(written as usize, n, "{w}");
        assert_eq!(
            b.wallet(w).await.unwrap().balance,
            Money::from_micros(-(n as i64))
        );
    }
}
