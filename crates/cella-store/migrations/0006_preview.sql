-- Preview access: public (1) or token-only (0); and whether preview traffic resumes a paused sandbox.
ALTER TABLE sandboxes ADD COLUMN preview_public INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
