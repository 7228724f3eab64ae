-- Lifecycle: paused time, activity for the idle timer, and resource usage across boots.
ALTER TABLE sandboxes ADD COLUMN paused_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN paused_since INTEGER;
ALTER TABLE sandboxes ADD COLUMN last_activity_at INTEGER;
-- CPU time of boots that have ended (the cgroup of the current boot holds the rest).
ALTER TABLE sandboxes ADD COLUMN cpu_ns INTEGER NOT NULL DEFAULT 0;
-- Memory in use integrated over running time, in MiB x milliseconds.
ALTER TABLE sandboxes ADD COLUMN memory_mib_ms INTEGER NOT NULL DEFAULT 0;
