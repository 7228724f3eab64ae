-- The operator: the server's own keys (the bootstrap key, CELLA_BOOTSTRAP_KEY's key), the only
-- ones that manage every workspace. Keys made through the API are never operator keys.
ALTER TABLE api_keys ADD COLUMN operator INTEGER NOT NULL DEFAULT 0;
-- A data directory from before: the key the first start generated is the oldest key named
-- `bootstrap` of the default workspace (CELLA_BOOTSTRAP_KEY's key is marked at every start).
UPDATE api_keys SET operator = 1 WHERE seq = (
    SELECT MIN(seq) FROM api_keys
    WHERE name = 'bootstrap'
      AND workspace_id = (SELECT value FROM meta WHERE key = 'default_workspace')
) AND EXISTS (SELECT 1 FROM meta WHERE key = 'bootstrap_key_written');

-- Template ids are per workspace: `id` is the server's internal key (unique on the server),
-- `public_id` the id the workspace gave it (null: the same as `id`, as for every template made
-- before this migration).
ALTER TABLE templates ADD COLUMN public_id TEXT;
CREATE UNIQUE INDEX templates_by_public_id ON templates(workspace_id, COALESCE(public_id, id));
