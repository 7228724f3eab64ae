-- The isolation runtime a sandbox runs on, fixed at its create: `namespace` (every sandbox made
-- before there was a choice) or `gvisor`.
ALTER TABLE sandboxes ADD COLUMN isolation TEXT NOT NULL DEFAULT 'namespace';
