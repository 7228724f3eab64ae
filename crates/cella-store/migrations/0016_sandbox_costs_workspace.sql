-- The ledger keeps a sandbox's costs on its row (`ledger_sandbox_costs`, 0013) only for an
-- entry of the sandbox's own workspace: an entry that names a sandbox of another workspace
-- (a bug, or a forged id) changes no row, so one workspace's spending never shows on another's
-- sandbox.
DROP TRIGGER ledger_sandbox_costs;
CREATE TRIGGER ledger_sandbox_costs AFTER INSERT ON ledger WHEN NEW.sandbox_id IS NOT NULL
BEGIN
    UPDATE sandboxes SET model_micros = model_micros - NEW.amount
        WHERE id = NEW.sandbox_id AND workspace_id = NEW.workspace_id AND NEW.kind = 'model';
    UPDATE sandboxes SET compute_charged = -NEW.amount
        WHERE id = NEW.sandbox_id AND workspace_id = NEW.workspace_id AND NEW.kind = 'compute';
END;
