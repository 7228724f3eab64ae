-- The warm pool's sandboxes belong to this internal workspace until a create claims one.
-- It has no keys, is never listed, and counts toward no plan cap.
INSERT INTO workspaces (id, name, plan, kind, created_at, settings)
VALUES ('wspool', 'warm pool (internal)', 'enterprise', 'organization', 0, '{}');
