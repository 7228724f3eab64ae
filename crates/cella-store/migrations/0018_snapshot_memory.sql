-- What a snapshot holds beside the files: `memory` 1 when it has a checkpoint of the whole
-- running sandbox (gVisor), and the runtime of the sandbox it was taken of, on which the
-- sandboxes made from it run.
ALTER TABLE snapshots ADD COLUMN memory INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN isolation TEXT NOT NULL DEFAULT 'namespace';
