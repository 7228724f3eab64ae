-- A sandbox's egress policy (JSON, as given at create with defaults filled in).
ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{}';
