-- What a workspace is charged for the layers of the layer store its templates and imported images
-- use: one row per (workspace, owner, layer), `bytes` the layer's size on disk when it was
-- charged. A workspace pays for each distinct layer once, whatever number of its owners use it;
-- a layer shared with other workspaces is charged to each of them.
CREATE TABLE layer_charges (
    workspace_id TEXT NOT NULL,
    kind TEXT NOT NULL,          -- 'template' (owner: the template's key) or 'image' (its id)
    owner TEXT NOT NULL,
    layer TEXT NOT NULL,         -- the layer's name in the store
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, kind, owner, layer)
);
CREATE INDEX layer_charges_layer ON layer_charges (layer);
CREATE INDEX layer_charges_owner ON layer_charges (kind, owner);
