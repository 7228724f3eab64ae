-- Money: amounts are integer micro-units (millionths of the workspace's currency), never floats.

-- The ledger: append-only. A workspace's balance is the `balance_after` of its newest entry
-- (each insert computes it from the one before, in the same statement), so the amounts of a
-- workspace's entries always sum to its balance. Credits are positive, charges negative.
CREATE TABLE ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    workspace_id TEXT NOT NULL,
    at INTEGER NOT NULL,                      -- ms since the epoch
    kind TEXT NOT NULL CHECK (kind IN ('credit', 'compute', 'model', 'refund')),
    amount INTEGER NOT NULL CHECK (typeof(amount) = 'integer'),
    balance_after INTEGER NOT NULL CHECK (typeof(balance_after) = 'integer'),
    sandbox_id TEXT,
    task_id TEXT,
    reference TEXT,
    -- model entries: what was used
    model TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    -- compute entries: the seconds billed (the 60-second minimum included) and at which rate
    compute_sec INTEGER,
    running_ms INTEGER,
    rate INTEGER,
    -- What makes an entry happen at most once: `compute:sandbox:<id>`, `compute:task:<id>`,
    -- `model:<request id>`; null for credits and refunds.
    once_key TEXT
);
CREATE INDEX ledger_by_workspace ON ledger (workspace_id, seq);
CREATE UNIQUE INDEX ledger_once ON ledger (workspace_id, once_key) WHERE once_key IS NOT NULL;
CREATE INDEX ledger_by_sandbox ON ledger (sandbox_id) WHERE sandbox_id IS NOT NULL;
CREATE INDEX ledger_by_task ON ledger (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX ledger_by_time ON ledger (workspace_id, at);
CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only');
END;
CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only');
END;

-- Money held for a sandbox or a task run while it runs: not a ledger entry; what a workspace
-- may still spend is its balance minus the sum of its reservations. Settling a holder writes its
-- one compute entry and removes its reservation in one transaction.
CREATE TABLE reservations (
    holder_kind TEXT NOT NULL CHECK (holder_kind IN ('sandbox', 'task')),
    holder_id TEXT NOT NULL,
    workspace_id TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (typeof(amount) = 'integer' AND amount >= 0),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (holder_kind, holder_id)
);
CREATE INDEX reservations_by_workspace ON reservations (workspace_id);

-- A sandbox's compute rate (per running second, snapshotted at create) in micro-units, from the
-- REAL it was, rounded to the nearest micro-unit (a negative or unreadable one: 0).
ALTER TABLE sandboxes ADD COLUMN rate_micros INTEGER NOT NULL DEFAULT 0;
UPDATE sandboxes SET rate_micros = MAX(0, COALESCE(CAST(ROUND(compute_rate * 1000000.0) AS INTEGER), 0));
ALTER TABLE sandboxes DROP COLUMN compute_rate;

-- What the ledger charged a sandbox, kept on its row by the ledger itself (a trigger, in the
-- transaction of the entry): the amount of its one compute entry once settled (null before), and
-- the sum of its model entries. Positive micro-units.
ALTER TABLE sandboxes ADD COLUMN compute_charged INTEGER;
ALTER TABLE sandboxes ADD COLUMN model_micros INTEGER NOT NULL DEFAULT 0;
CREATE TRIGGER ledger_sandbox_costs AFTER INSERT ON ledger WHEN NEW.sandbox_id IS NOT NULL
BEGIN
    UPDATE sandboxes SET model_micros = model_micros - NEW.amount
        WHERE id = NEW.sandbox_id AND NEW.kind = 'model';
    UPDATE sandboxes SET compute_charged = -NEW.amount
        WHERE id = NEW.sandbox_id AND NEW.kind = 'compute';
END;

-- Workspace settings: `compute_rate` becomes a decimal string with 6 decimals, rounded the same way.
UPDATE workspaces SET settings = json_set(settings, '$.compute_rate',
    printf('%d.%06d', MAX(0, COALESCE(CAST(ROUND(json_extract(settings, '$.compute_rate') * 1000000.0) AS INTEGER), 0)) / 1000000,
                      MAX(0, COALESCE(CAST(ROUND(json_extract(settings, '$.compute_rate') * 1000000.0) AS INTEGER), 0)) % 1000000))
WHERE json_valid(settings) AND json_type(settings, '$.compute_rate') IN ('integer', 'real');
